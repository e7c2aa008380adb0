"""Train-time sensor corruptions: at most one of several ``SensorCorruption`` s per sample, drawn at random.

For AQR's per-query routing targets (``models/aqr/routing_targets.py``) the
router must see objects whose LiDAR points are gone while the camera still
sees them (``object_drop``), failed camera views (``camera_fail``) and both at
once in different directions (``mixed``), not only a whole modality dropped
(``ModalMask3D``). The targets are computed from what the model is given, so
they follow these corruptions without further bookkeeping; the record of the
corruption (``results['corruption']``, e.g. the black ``views``) reaches the
model when ``'corruption'`` is in ``Collect3D``'s ``meta_keys``.
"""
from typing import Dict, Optional, Sequence

import numpy as np
from mmdet.datasets.builder import PIPELINES

from .corruption import SensorCorruption
from .corruption_spec import GHOST_MODES, parse_corruption

#: Largest seed drawn for a corruption's own random draws.
MAX_SEED = 2**31 - 1


@PIPELINES.register_module()
class RandomSensorCorruption:
    """Apply one of ``corruptions`` to a training sample, each with its probability, or none.

    Put it where ``SensorCorruption`` goes: right after the loading steps and
    ``LoadAnnotations3D`` (``object_drop`` reads ``results['ann_info']``),
    before any resizing, normalisation or 3D augmentation.

    Args:
        corruptions (Sequence[dict]): ``dict(spec='object_drop:0.5', prob=0.2)``
            per corruption (``spec``: the CLI form of ``tools/test.py
            --corruption``); the probabilities sum to at most 1.
        sweep_time_column (int, optional): passed to ``SensorCorruption`` (the
            points' sweep time lag column written by ``LoadPointsFromMultiSweeps``).
        ghost_database (dict, optional), point_cloud_range (Sequence[float], optional): passed to the
            ``SensorCorruption`` s that place ghosts (``lidar_ghost``, ``mixed_lie``), which need the database.

    Each call draws the corruption with numpy's global generator (seeded per
    worker by mmdet) and a fresh seed for the corruption's own draws, so a
    sample is corrupted differently in every epoch.
    """

    def __init__(self, corruptions: Sequence[dict], sweep_time_column: Optional[int] = None,
                 ghost_database: Optional[Dict] = None, point_cloud_range: Optional[Sequence[float]] = None) -> None:
        if not corruptions:
            raise ValueError('RandomSensorCorruption needs at least one corruption, e.g. '
                             "[dict(spec='object_drop:0.5', prob=0.2)]")
        self.transforms, probabilities = [], []
        for index, item in enumerate(corruptions):
            unknown = set(item) - {'spec', 'prob'}
            if unknown or 'spec' not in item or 'prob' not in item:
                raise ValueError(f"corruptions[{index}] must be dict(spec='mode[:arg[:arg]]', prob=p), got {item!r}")
            if not 0 <= item['prob'] <= 1:
                raise ValueError(f"corruptions[{index}]: prob must be in [0, 1], got {item['prob']!r}")
            config = parse_corruption(item['spec'])
            config.pop('type')
            if config['mode'] in GHOST_MODES:
                config['ghost_database'] = ghost_database
                if point_cloud_range is not None:
                    config['point_cloud_range'] = point_cloud_range
            self.transforms.append(SensorCorruption(**config, sweep_time_column=sweep_time_column))
            probabilities.append(float(item['prob']))
        if sum(probabilities) > 1 + 1e-9:
            raise ValueError(f'the corruption probabilities sum to {sum(probabilities)} > 1')
        self.thresholds = np.cumsum(probabilities)

    def __call__(self, results: Dict) -> Dict:
        chosen = int(np.searchsorted(self.thresholds, np.random.rand(), side='right'))
        if chosen == len(self.transforms):
            return results
        transform = self.transforms[chosen]
        transform.seed = int(np.random.randint(MAX_SEED))
        return transform(results)

    def __repr__(self) -> str:
        probabilities = np.diff(self.thresholds, prepend=0.0)
        items = ', '.join(f'{t.name}: {p:g}' for t, p in zip(self.transforms, probabilities))
        return f'{self.__class__.__name__}({items})'
