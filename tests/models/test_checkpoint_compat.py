"""The models built from configs/ have exactly upstream CMT's state_dict: same keys, same shapes, same order.

The reference lists (tests/data/reference/cmt_state_dict/) were measured from upstream CMT's own code;
equality means a published CMT checkpoint loads with no missing or unexpected keys.
"""
import os
from collections import OrderedDict

import pytest
import torch
from mmcv import Config
from mmdet3d.models import build_model

import projects.mmdet3d_plugin  # noqa: F401

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE_DIR = os.path.join(REPO_ROOT, 'tests', 'data', 'reference', 'cmt_state_dict')
CONFIGS = ['cmt_voxel0075_vov_1600x640_cbgs', 'cmt_voxel0100_r50_800x320_cbgs', 'cmt_lidar_voxel0075_cbgs',
           'cmt_camera_vov_1600x640_cbgs']


def read_reference(name):
    """-> (total_params, [(key, shape tuple)]) from the upstream list of config ``name``."""
    with open(os.path.join(REFERENCE_DIR, f'{name}.txt')) as f:
        header, *lines = f.read().splitlines()
    total_params = int(header.split('total_params')[1])
    entries = []
    for line in lines:
        key, shape = line.split('\t')
        entries.append((key, tuple(int(v) for v in shape.split(',')) if shape else ()))
    return total_params, entries


@pytest.mark.parametrize('name', CONFIGS)
def test_state_dict_equals_upstream(name):
    cfg = Config.fromfile(os.path.join(REPO_ROOT, 'configs', f'{name}.py'))
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    ours = [(key, tuple(value.shape)) for key, value in model.state_dict().items()]
    total_params, upstream = read_reference(name)

    ours_keys, upstream_keys = {k for k, _ in ours}, {k for k, _ in upstream}
    assert not upstream_keys - ours_keys, f'missing keys: {sorted(upstream_keys - ours_keys)[:20]}'
    assert not ours_keys - upstream_keys, f'unexpected keys: {sorted(ours_keys - upstream_keys)[:20]}'
    wrong_shapes = [(k, s, dict(upstream)[k]) for k, s in ours if dict(upstream)[k] != s]
    assert not wrong_shapes, f'shape mismatches (key, ours, upstream): {wrong_shapes[:20]}'
    assert [k for k, _ in ours] == [k for k, _ in upstream], 'same keys, different state_dict order'
    assert sum(p.numel() for p in model.parameters()) == total_params


def test_upstream_state_dict_loads_strictly():
    """A checkpoint with upstream's keys and shapes loads with strict=True (what load_checkpoint checks).

    Like a ``torch.save``-d state_dict, it carries the module versions in ``_metadata``: mmdet3d reads
    version 2 of the spconv modules as "already in spconv 2's KRSC layout" and copies them unchanged.
    """
    cfg = Config.fromfile(os.path.join(REPO_ROOT, 'configs', 'cmt_lidar_voxel0075_cbgs.py'))
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    _, upstream = read_reference('cmt_lidar_voxel0075_cbgs')
    checkpoint = OrderedDict((key, torch.zeros(shape, dtype=torch.long) if key.endswith('num_batches_tracked') else
                              torch.full(shape, 0.5)) for key, shape in upstream)
    checkpoint._metadata = model.state_dict()._metadata
    result = model.load_state_dict(checkpoint, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.all(model.pts_bbox_head.reference_points.weight == 0.5)
