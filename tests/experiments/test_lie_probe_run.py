"""experiments/lie_probe_run.py: the conditions, the datasets of each split, the rows and the probes' scores."""
import numpy as np
import pytest
from mmcv import Config

from projects.mmdet3d_plugin.experiments.lie_probe import ProbeSpec
from projects.mmdet3d_plugin.experiments.lie_probe_run import (ProbeRunOptions, check_cache_stamp,
                                                               load_model_and_config, score_probes,
                                                               split_dataset_config, stack_split)

GHOST, YAW = 'lidar_ghost:3', 'view_yaw:2:20'


def _options(**kwargs):
    return ProbeRunOptions(config='c.py', checkpoint='x.pth', out='out', **kwargs)


def test_conditions_are_clean_and_seeded_draws_of_each_lie():
    options = _options(train_draws=2, val_draws=1)
    assert options.conditions('train') == [('clean', None, 0), (f'{GHOST}#0', GHOST, 0), (f'{GHOST}#1', GHOST, 1),
                                           (f'{YAW}#0', YAW, 0), (f'{YAW}#1', YAW, 1)]
    assert [name for name, _, _ in options.conditions('val')] == ['clean', f'{GHOST}#0', f'{YAW}#0']


def test_the_training_split_is_read_with_the_test_pipeline():
    cfg = Config(dict(data=dict(test=dict(type='D', ann_file='val.pkl', pipeline=['test']),
                                train=dict(type='CBGSDataset', dataset=dict(ann_file='train.pkl', pipeline=['aug'])))))
    train = split_dataset_config(cfg, 'train')
    assert (train.ann_file, train.pipeline) == ('train.pkl', ['test'])
    assert split_dataset_config(cfg, 'val').ann_file == 'val.pkl'
    assert cfg.data.test.ann_file == 'val.pkl'  # unchanged
    with pytest.raises(ValueError, match='split'):
        split_dataset_config(cfg, 'test')


def test_a_missing_checkpoint_is_named(tmp_path):
    config = tmp_path / 'c.py'
    config.write_text('x = 1\n')
    with pytest.raises(FileNotFoundError, match='checkpoint not found: .*missing.pth'):
        load_model_and_config(str(config), str(tmp_path / 'missing.pth'))


def _condition(rng, samples, queries, lidar_rate, camera_rate):
    """Fake features of one condition: the router's are noise, the disagreement's first column is the LiDAR lie
    plus noise."""
    targets = np.stack([rng.random((samples, queries)) < lidar_rate, rng.random((samples, queries)) < camera_rate],
                       axis=-1)
    disagreement = rng.normal(size=(samples, queries, 3)).astype(np.float32)
    disagreement[..., 0] += 3.0 * targets[..., 0]
    disagreement[..., 1] += 3.0 * targets[..., 1]
    return dict(router=rng.normal(size=(samples, queries, 5)).astype(np.float32), disagreement=disagreement,
                targets=targets, sample=np.arange(samples))


def _features(rng, samples):
    return {'clean': _condition(rng, samples, 20, 0.0, 0.0), f'{GHOST}#0': _condition(rng, samples, 20, 0.15, 0.0),
            f'{YAW}#0': _condition(rng, samples, 20, 0.0, 0.3)}


def test_stack_split_gives_one_row_per_query_grouped_by_sample():
    rows = stack_split(_features(np.random.default_rng(0), 4), ['clean', f'{GHOST}#0'], 'router+disagreement')
    assert rows['features'].shape == (2 * 4 * 20, 5 + 3) and rows['targets'].shape == (160, 2)
    assert rows['groups'].tolist() == (np.repeat(np.arange(4), 20).tolist() * 2)
    assert stack_split(_features(np.random.default_rng(0), 4), ['clean'], 'router')['features'].shape == (80, 5)
    with pytest.raises(ValueError, match='feature_set'):
        stack_split({}, [], 'camera')


def test_disagreement_that_carries_the_lie_beats_the_router_on_ghost_queries():
    rng = np.random.default_rng(0)
    options = _options(families=['logistic'], spec=ProbeSpec(epochs=8, batch_size=256, lr=1e-2))
    rows = score_probes(options, dict(train=_features(rng, 40), val=_features(rng, 20)), log=lambda line: None)
    router, both = rows
    assert (router['features'], both['features']) == ('router', 'router+disagreement')
    assert (router['dims'], both['dims']) == (5, 8)
    assert router['scores']['ghost']['balanced_accuracy'] < 0.65 < 0.85 < both['scores']['ghost']['balanced_accuracy']
    assert both['scores']['yaw']['balanced_accuracy'] > 0.85
    ghost = both['scores']['ghost']
    assert ghost['positives'] + ghost['negatives'] == 20 * 20  # the ghost condition's queries only
    everything = both['scores']['all_camera']
    assert everything['positives'] + everything['negatives'] == 3 * 20 * 20
    assert everything['positives'] == both['scores']['yaw']['positives']  # no camera lie outside the yawed samples


def test_the_feature_cache_belongs_to_one_checkpoint(tmp_path):
    checkpoint = tmp_path / 'a.pth'
    checkpoint.write_bytes(b'x')
    options = ProbeRunOptions(config='c.py', checkpoint=str(checkpoint), out=str(tmp_path))
    stamp = tmp_path / 'stamp.json'
    check_cache_stamp(str(stamp), options)
    check_cache_stamp(str(stamp), options)  # the same run: fine
    other = tmp_path / 'b.pth'
    other.write_bytes(b'y')
    with pytest.raises(ValueError, match='another --out'):
        check_cache_stamp(str(stamp), ProbeRunOptions(config='c.py', checkpoint=str(other), out=str(tmp_path)))
