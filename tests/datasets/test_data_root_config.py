"""retarget_data_root: every dataset, wrapper and sampler entry of a config moves to the new root."""
import os.path as osp

import pytest
from mmcv import Config

from projects.mmdet3d_plugin.datasets.data_root_config import retarget_data_root

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _entries(node, key, found):
    if isinstance(node, dict):
        for name, value in node.items():
            if name == key and isinstance(value, str):
                found.append(value)
            else:
                _entries(value, key, found)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _entries(value, key, found)
    return found


def test_every_data_entry_moves_into_the_new_root_and_the_original_is_kept(tmp_path):
    cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', 'cmt_voxel0075_vov_1600x640_cbgs.py'))
    moved = retarget_data_root(cfg, str(tmp_path))._cfg_dict.to_dict()
    root = osp.join(str(tmp_path), '')
    assert moved['data']['train']['dataset']['ann_file'] == root + 'nuscenes_infos_train.pkl'  # inside CBGS
    assert moved['data']['test']['ann_file'] == root + 'nuscenes_infos_val.pkl'
    info_paths = _entries(moved, 'info_path', [])
    assert info_paths and all(path == root + 'nuscenes_dbinfos_train.pkl' for path in info_paths)
    assert set(_entries(moved, 'data_root', [])) == {root}
    assert cfg.data.test.ann_file.startswith('data/nuscenes/')  # the input config is not modified


def test_a_missing_root_is_an_error_naming_it(tmp_path):
    cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', 'cmt_voxel0075_vov_1600x640_cbgs.py'))
    with pytest.raises(FileNotFoundError, match='no_such_root'):
        retarget_data_root(cfg, str(tmp_path / 'no_such_root'))
