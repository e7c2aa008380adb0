"""tools/train.py's ``--train-corruptions``: the items parsed, checked and put into the config's training pipeline."""
import os.path as osp

import pytest
from mmcv import Config

from projects.mmdet3d_plugin.datasets.corruption_config import SENSOR_FAILURE_CORRUPTIONS
from tools import train
from tools.cli.train_corruptions import DEFAULT_TRAIN_PROB, apply_train_corruptions

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG = osp.join(REPO_ROOT, 'configs', 'demo', 'cmt_aqr_synthetic_tiny_passes.py')


def test_the_items_become_the_mix_of_the_training_pipeline():
    args = train.parse_args([CONFIG, '--train-corruptions', 'sensor_failures', 'lidar_ghost:3', 'view_yaw:2:20=0.1'])
    cfg = Config.fromfile(CONFIG)
    mix = apply_train_corruptions(cfg, args.train_corruptions)
    expected = [dict(item) for item in SENSOR_FAILURE_CORRUPTIONS] + [
        dict(spec='lidar_ghost:3', prob=DEFAULT_TRAIN_PROB), dict(spec='view_yaw:2:20', prob=0.1)]
    assert mix == expected
    pipeline = cfg.data.train.pipeline
    types = [step['type'] for step in pipeline]
    step = pipeline[types.index('RandomSensorCorruption')]
    assert types.index('RandomSensorCorruption') + 1 == types.index('ModalMask3D')
    assert step['corruptions'] == expected and step['ghost_database'] == cfg.db_sampler.to_dict()
    assert 'transformation_3d_flow' in pipeline[types.index('Collect3D')]['meta_keys']


def test_without_the_option_the_config_is_unchanged():
    assert train.parse_args([CONFIG]).train_corruptions is None
    cfg = Config.fromfile(CONFIG)
    assert apply_train_corruptions(cfg, None) == []
    assert cfg.data.train.pipeline == Config.fromfile(CONFIG).data.train.pipeline


@pytest.mark.parametrize('items, message', [
    (['lidar_ghost'], 'lidar_ghost'),
    (['fov:120=1.5'], 'must be in [0, 1]'),
    (['fov:120=often'], 'must be a number'),
    (['clean'], 'clean'),
    (['sensor_failures', 'camera_drop'], "'camera_drop'] more than once"),
    (['lidar_drop=0.6', 'camera_drop=0.5'], 'sum to 1.1 > 1'),
])
def test_bad_items_are_refused_while_parsing(items, message, capsys):
    with pytest.raises(SystemExit):
        train.parse_args([CONFIG, '--train-corruptions', *items])
    assert message in capsys.readouterr().err
