"""Modality drop: zero the LiDAR points or the camera images of a sample, and record which."""
from typing import Dict, List

import numpy as np
from mmdet.datasets.builder import PIPELINES

#: results / img_metas key listing the dropped modalities (read by models/aqr/aux_loss.py).
DROPPED_MODALITIES_KEY = 'dropped_modalities'
MODALITIES = ('points', 'image')
#: each modality's key in the pipeline's ``results`` (also a ``SensorCorruption`` mode's ``input_keys``)
MODALITY_RESULTS_KEYS = {'points': 'points', 'image': 'img'}
MODES = ('train', 'test')
#: how dropped points are dropped: zeroed in place (upstream CMT) or removed (an empty cloud)
POINTS_DROPS = ('zero', 'remove')


def check_points_drop(points_drop: str) -> None:
    """``ValueError`` unless ``points_drop`` is one of :data:`POINTS_DROPS`."""
    if points_drop not in POINTS_DROPS:
        raise ValueError(f'ModalMask3D: points_drop must be one of {POINTS_DROPS}, got {points_drop!r}')


def drop_modality(results: Dict, modality: str, points_drop: str = 'zero') -> None:
    """Drop ``modality`` of ``results`` in place and add it to ``results['dropped_modalities']``.

    ``'points'`` with ``points_drop='zero'``: every coordinate and feature of
    ``results['points']`` becomes 0 (the number of points is kept, as in
    upstream CMT: they all land in one pillar at the origin); with
    ``'remove'``: no point is left (the width is kept), which is what a LiDAR
    that delivers nothing gives and what the ``lidar_drop`` test corruption
    feeds the model. ``'image'``: every view of ``results['img']`` becomes
    black (same shape and dtype).
    """
    check_points_drop(points_drop)
    if modality not in MODALITIES:
        raise ValueError(f'unknown modality {modality!r}; expected one of {MODALITIES}')
    key = MODALITY_RESULTS_KEYS[modality]
    if key not in results:
        raise KeyError(f'ModalMask3D: cannot drop {modality!r}, results has no {key!r} (load it first)')
    if modality == 'points' and points_drop == 'remove':
        results['points'] = results['points'][:0]
    elif modality == 'points':
        results['points'].tensor = results['points'].tensor * 0.0
    else:
        results['img'] = [np.zeros_like(img) for img in results['img']]
    dropped: List[str] = results.setdefault(DROPPED_MODALITIES_KEY, [])
    if modality not in dropped:
        dropped.append(modality)


@PIPELINES.register_module()
class ModalMask3D:
    """Randomly drop the LiDAR or the camera input (training), or always drop one (robustness test).

    ``results['dropped_modalities']`` is always set: a list holding
    ``'points'`` and/or ``'image'`` for what was zeroed (empty when nothing
    was). Add ``'dropped_modalities'`` to ``Collect3D``'s ``meta_keys`` so the
    model receives it in ``img_metas`` (the AQR routing loss reads it there).

    Args:
        mode (str): ``'train'``: drop the images with probability
            ``image_drop_prob``, else the points with probability
            ``points_drop_prob`` (at most one modality per sample);
            ``'test'``: always drop ``mask_modal``.
        mask_modal (str): modality dropped in ``'test'`` mode: ``'image'`` or ``'points'``.
        image_drop_prob (float): upstream CMT uses 0.25.
        points_drop_prob (float): upstream CMT uses 0.25.
        points_drop (str): ``'zero'`` (upstream CMT: every point zeroed, all
            in one pillar at the origin) or ``'remove'`` (an empty point
            cloud, as the ``lidar_drop`` corruption tests with); see
            :func:`drop_modality`.
    """

    def __init__(self, mode: str = 'test', mask_modal: str = 'image', image_drop_prob: float = 0.25,
                 points_drop_prob: float = 0.25, points_drop: str = 'zero') -> None:
        if mode not in MODES:
            raise ValueError(f'ModalMask3D: mode must be one of {MODES}, got {mode!r}')
        if mask_modal not in MODALITIES:
            raise ValueError(f'ModalMask3D: mask_modal must be one of {MODALITIES}, got {mask_modal!r}')
        if image_drop_prob < 0 or points_drop_prob < 0 or image_drop_prob + points_drop_prob > 1:
            raise ValueError(f'ModalMask3D: drop probabilities must be >= 0 and sum to <= 1, got '
                             f'image_drop_prob={image_drop_prob}, points_drop_prob={points_drop_prob}')
        check_points_drop(points_drop)
        self.mode = mode
        self.mask_modal = mask_modal
        self.points_drop = points_drop
        self.image_drop_prob = image_drop_prob
        self.points_drop_prob = points_drop_prob

    def __call__(self, results: Dict) -> Dict:
        results.setdefault(DROPPED_MODALITIES_KEY, [])
        if self.mode == 'test':
            drop_modality(results, self.mask_modal, self.points_drop)
            return results
        draw = np.random.rand()
        if draw < self.image_drop_prob:
            drop_modality(results, 'image')
        elif draw < self.image_drop_prob + self.points_drop_prob:
            drop_modality(results, 'points', self.points_drop)
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(mode={self.mode!r}, mask_modal={self.mask_modal!r}, '
                f'image_drop_prob={self.image_drop_prob}, points_drop_prob={self.points_drop_prob}, '
                f'points_drop={self.points_drop!r})')
