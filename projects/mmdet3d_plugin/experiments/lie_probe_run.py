"""Issue 68's step 0 end to end (``tools/probe_lie_router.py``): features of a frozen CMT-AQR checkpoint, probes.

1. For each split (training and validation samples, both through the test pipeline) and each condition (clean,
   and ``draws`` seeded draws of the LiDAR-ghost and of the yawed-view corruption, ``apis/test.apply_corruption``),
   the detector runs its test forward once per sample; every query of the sample gives its router features,
   its disagreement features (``lie_probe_features``) and its lie targets (``lie_probe_targets``). Each condition
   is cached as ``<out>/features/<split>_<condition>.npz`` and read back on a second run.
2. Per target (LiDAR lies, camera lies), feature set ((a) router, (b) router + disagreement) and probe family,
   a probe is fitted on every training query (``lie_probe.fit_probe``) and scored on the validation queries: on
   the ghost samples' queries (LiDAR target), on the yawed samples' queries (camera target) and on all of them,
   clean included (each target).
"""
import copy
import dataclasses
import json
import os
import os.path as osp
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmcv import Config
from mmdet3d.datasets import build_dataset
from torch import nn
from torch.utils.data import Dataset

from ..apis.sample_subset import keep_first_samples
from ..apis.test import (apply_corruption, build_test_loader, build_test_model, load_test_config,
                         prepare_test_config)
from ..mmcv_custom.parallel import wrap_model
from ..models.utils.positional_encoding import denormalize_points
from .lie_probe import PROBE_FAMILIES, ProbeSpec, balanced_accuracy, fit_probe
from .lie_probe_features import (PROBE_PASSES, capture_router, disagreement_features, router_features,
                                 window_means)
from .lie_probe_targets import LIE_TARGETS, lie_targets

SPLITS = ('train', 'val')
CLEAN = 'clean'
GHOST_CORRUPTION = 'lidar_ghost:3'
YAW_CORRUPTION = 'view_yaw:2:20'
#: Feature sets of the probes: (a) what the router sees, (b) that and the modalities' disagreement.
FEATURE_SETS = ('router', 'router+disagreement')


@dataclass
class ProbeRunOptions:
    """What :func:`run_lie_probe` does (``tools/probe_lie_router.py``'s options).

    Attributes:
        config (str): the checkpoint's config (the study writes it next to the checkpoint).
        checkpoint (str): a CMT-AQR checkpoint.
        out (str): folder of the feature cache, ``lie_probe.json`` and ``lie_probe.md``.
        ghost (str): the LiDAR lie (corruption spec).
        yaw (str): the camera lie.
        train_draws (int): seeded draws of each lie per training sample.
        val_draws (int): per validation sample.
        samples (int, optional): the first N samples of each split only.
        families (list[str]): probe families (:data:`.lie_probe.PROBE_FAMILIES`).
        spec (ProbeSpec): the probes' size and fitting (``family`` set per run).
        command (str): the command line, for the report.
    """

    config: str
    checkpoint: str
    out: str
    ghost: str = GHOST_CORRUPTION
    yaw: str = YAW_CORRUPTION
    train_draws: int = 2
    val_draws: int = 3
    samples: Optional[int] = None
    families: List[str] = field(default_factory=lambda: list(PROBE_FAMILIES))
    spec: ProbeSpec = ProbeSpec()
    command: str = ''

    def conditions(self, split: str) -> List[Tuple[str, Optional[str], int]]:
        """``(name, corruption or None, seed)`` of every condition of ``split``."""
        draws = self.train_draws if split == 'train' else self.val_draws
        return [(CLEAN, None, 0)] + [(f'{spec}#{draw}', spec, draw) for spec in (self.ghost, self.yaw)
                                     for draw in range(draws)]


def split_dataset_config(cfg: Config, split: str) -> Config:
    """``cfg.data.test`` (test pipeline) over the samples of ``split``: the training split's info file for
    ``'train'`` (through dataset wrappers), the test set's for ``'val'``."""
    if split not in SPLITS:
        raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
    dataset = copy.deepcopy(cfg.data.test)
    if split == 'train':
        train = cfg.data.train
        while 'ann_file' not in train and 'dataset' in train:
            train = train.dataset
        dataset.ann_file = train.ann_file
    return dataset


@torch.no_grad()
def extract_condition(model: nn.Module, dataset: Dataset, cfg: Config,
                      progress: Callable[[int, int], None] = lambda done, total: None) -> Dict[str, np.ndarray]:
    """Every query's features and lie targets under one condition.

    Args:
        model (nn.Module): the wrapped CMT-AQR detector (``wrap_model``).
        dataset (Dataset): the condition's dataset (test pipeline, its corruption in it).
        cfg (Config): the test config (the loader's workers).
        progress (callable): called with (samples done, samples) after each sample.

    Returns:
        dict[str, np.ndarray]: ``router [n, Q, Da]``, ``disagreement [n, Q, Db]``, ``targets [n, Q, 2]`` bool
        and ``sample [n]`` (dataset index) for the ``n`` samples.
    """
    head = getattr(model, 'module', model).pts_bbox_head
    generator = head.aqr_weight_generator
    rows: Dict[str, List[np.ndarray]] = dict(router=[], disagreement=[], targets=[], sample=[])
    loader = build_test_loader(dataset, cfg, 1)
    for index, data in enumerate(loader):
        with capture_router(head) as capture:
            model(return_loss=False, rescale=True, **data)
            passes = {name: capture.decode(name) for name in PROBE_PASSES}
        inputs = capture.inputs
        reference_xyz = denormalize_points(inputs['reference_points'].float(), inputs['pc_range'])
        bev_mean, camera_mean, _ = window_means(generator, inputs['bev_feat'], inputs['img_feat'],
                                                capture.projection_info)
        info, num_views = capture.projection_info, inputs['geometry'].num_views
        targets = torch.stack([lie_targets(reference_xyz[sample], info['pts_pers_idx'][sample],
                                           info['visible'][sample], meta, num_views)
                               for sample, meta in enumerate(capture.img_metas)])
        rows['router'].append(router_features(capture, generator).numpy())
        rows['disagreement'].append(disagreement_features(passes, reference_xyz[..., :2], bev_mean,
                                                          camera_mean).numpy())
        rows['targets'].append(targets.numpy())
        rows['sample'].append(np.full(len(capture.img_metas), index))
        progress(index + 1, len(dataset))
    return {key: np.concatenate(value) for key, value in rows.items()}


def load_model_and_config(config: str, checkpoint: str) -> Tuple[nn.Module, Config]:
    """The wrapped CPU detector of ``checkpoint`` and its test config."""
    for path, what in ((config, 'config'), (checkpoint, 'checkpoint')):
        if not osp.isfile(path):
            raise FileNotFoundError(f'{what} not found: {path}')
    cfg = load_test_config(config)
    prepare_test_config(cfg)
    classes = cfg.get('class_names')
    model = build_test_model(cfg, checkpoint, classes)
    if getattr(model.pts_bbox_head, 'aqr_weight_generator', None) is None:
        raise ValueError(f'{config} builds no AQR router: the lie probe reads what the router sees')
    return wrap_model(model, 'cpu', False).eval(), cfg


def cache_stamp(options: ProbeRunOptions) -> dict:
    """What the cached features were extracted from: the config, the checkpoint (path, size, modification time)
    and the lies."""
    checkpoint = osp.abspath(options.checkpoint)
    stat = os.stat(checkpoint) if osp.isfile(checkpoint) else None
    return dict(config=osp.abspath(options.config), checkpoint=checkpoint, ghost=options.ghost, yaw=options.yaw,
                checkpoint_size=stat.st_size if stat else None, checkpoint_mtime=stat.st_mtime if stat else None)


def check_cache_stamp(path: str, options: ProbeRunOptions) -> None:
    """Write the :func:`cache_stamp` of ``options`` to ``path``, or check that the one there is the same.

    Raises:
        ValueError: the folder caches the features of another checkpoint, config or lie.
    """
    stamp = cache_stamp(options)
    if osp.exists(path):
        with open(path) as f:
            cached = json.load(f)
        if cached != stamp:
            raise ValueError(f'{osp.dirname(path)} caches the features of {cached}, not of {stamp}: choose another '
                             f'--out or delete it')
        return
    with open(path, 'w') as f:
        json.dump(stamp, f, indent=2)


def extract_features(options: ProbeRunOptions, log: Callable[[str], None] = print) -> Dict[str, Dict[str, dict]]:
    """Step 1 of the module docstring: ``{split: {condition: arrays}}`` (cached under ``<out>/features``)."""
    cache = osp.join(options.out, 'features')
    os.makedirs(cache, exist_ok=True)
    check_cache_stamp(osp.join(cache, 'stamp.json'), options)
    model, cfg = None, None
    features: Dict[str, Dict[str, dict]] = {}
    for split in SPLITS:
        features[split] = {}
        for name, corruption, seed in options.conditions(split):
            path = osp.join(cache, f'{split}_{name.replace(":", "_").replace("#", "_draw")}.npz')
            if osp.exists(path):
                with np.load(path) as stored:
                    features[split][name] = dict(stored)
                if options.samples is None or len(features[split][name]['sample']) == options.samples:
                    log(f'[lie probe] {split} {name}: cached {path}')
                    continue
            if model is None:
                model, cfg = load_model_and_config(options.config, options.checkpoint)
            dataset = build_dataset(split_dataset_config(apply_corruption(cfg, corruption, seed=seed), split))
            keep_first_samples(dataset, options.samples)
            start = time.time()

            def progress(done: int, total: int) -> None:
                if done == total or done % 20 == 0:
                    log(f'[lie probe] {split} {name}: {done}/{total} samples, {time.time() - start:.0f} s')
            features[split][name] = extract_condition(model, dataset, cfg, progress)
            np.savez(path, **features[split][name])
    return features


def stack_split(conditions: Dict[str, dict], names: Sequence[str], feature_set: str) -> Dict[str, np.ndarray]:
    """The queries of the conditions ``names`` of one split as rows: ``features [n, D]`` of ``feature_set``,
    ``targets [n, 2]`` and ``groups [n]`` (the sample of each row, shared by its draws)."""
    if feature_set not in FEATURE_SETS:
        raise ValueError(f'feature_set must be one of {FEATURE_SETS}, got {feature_set!r}')
    parts = dict(features=[], targets=[], groups=[])
    for name in names:
        arrays = conditions[name]
        blocks = [arrays['router']] + ([arrays['disagreement']] if feature_set != 'router' else [])
        features = np.concatenate(blocks, axis=-1)
        parts['features'].append(features.reshape(-1, features.shape[-1]))
        parts['targets'].append(arrays['targets'].reshape(-1, len(LIE_TARGETS)))
        parts['groups'].append(np.repeat(arrays['sample'], features.shape[1]))
    return {key: np.concatenate(value) for key, value in parts.items()}


def score_probes(options: ProbeRunOptions, features: Dict[str, Dict[str, dict]],
                 log: Callable[[str], None] = print) -> List[dict]:
    """Step 2 of the module docstring: one row per probe family and feature set with its balanced accuracies
    (``ghost``, ``yaw``, ``all_lidar``, ``all_camera``), their positives / negatives and the epochs kept."""
    val = features['val']
    evaluations = dict(ghost=([name for name in val if name.startswith(options.ghost + '#')], 0),
                       yaw=([name for name in val if name.startswith(options.yaw + '#')], 1),
                       all_lidar=(list(val), 0), all_camera=(list(val), 1))
    rows = []
    for family in options.families:
        spec = dataclasses.replace(options.spec, family=family)
        for feature_set in FEATURE_SETS:
            train = stack_split(features['train'], list(features['train']), feature_set)
            row = dict(family=family, features=feature_set, dims=int(train['features'].shape[1]), scores={})
            fitted = []
            for column, target in enumerate(LIE_TARGETS):
                start = time.time()
                probe = fit_probe(train['features'], train['targets'][:, column], train['groups'], spec)
                fitted.append(probe)
                log(f'[lie probe] {family} {feature_set} {target} lies: epoch {probe.epoch} kept (held-out '
                    f'balanced accuracy {probe.holdout_accuracy:.3f}), {time.time() - start:.0f} s')
            for key, (names, column) in evaluations.items():
                rows_val = stack_split(val, names, feature_set)
                target = rows_val['targets'][:, column]
                predicted = fitted[column].predict(rows_val['features'])
                row['scores'][key] = dict(balanced_accuracy=balanced_accuracy(predicted, target),
                                          positives=int(target.sum()), negatives=int((~target).sum()))
            row['epochs'] = {target: probe.epoch for target, probe in zip(LIE_TARGETS, fitted)}
            rows.append(row)
    return rows
