"""Train-time RandomSensorCorruption: at most one corruption per sample, at its probability, drawn anew each call."""
import numpy as np
import pytest

from projects.mmdet3d_plugin.datasets.pipelines import CORRUPTION_KEY, RandomSensorCorruption


def _sample():
    return dict(img=[np.full((4, 6, 3), 200, dtype=np.uint8) for _ in range(6)], sample_idx='token')


def test_applies_the_drawn_corruption_and_records_it():
    np.random.seed(0)
    results = RandomSensorCorruption([dict(spec='camera_fail:1', prob=1.0)])(_sample())
    assert results[CORRUPTION_KEY]['views'] == list(range(6))
    assert all(not img.any() for img in results['img'])


def test_probabilities_and_fresh_draws_per_call():
    np.random.seed(0)
    transform = RandomSensorCorruption([dict(spec='camera_fail:0.5', prob=0.3), dict(spec='view_drop:2', prob=0.2)])
    records = [transform(_sample()).get(CORRUPTION_KEY) for _ in range(400)]
    names = [record['name'] if record else None for record in records]
    assert names.count('camera_fail:0.5') == pytest.approx(120, abs=30)
    assert names.count('view_drop:2') == pytest.approx(80, abs=25)
    assert names.count(None) == pytest.approx(200, abs=30)
    failed = {tuple(record['views']) for record in records if record and record['name'] == 'camera_fail:0.5'}
    assert len(failed) > 10, 'the same sample must fail different views in different calls'


@pytest.mark.parametrize('corruptions, message', [
    ([], 'at least one'),
    ([dict(spec='camera_fail:0.5')], 'prob'),
    ([dict(spec='camera_fail:0.5', prob=0.7), dict(spec='object_drop:0.5', prob=0.4)], 'sum to'),
    ([dict(spec='rain', prob=0.1)], "unknown corruption mode 'rain'"),
    ([dict(spec='camera_fail:0.5', prob=1.5)], 'in \\[0, 1\\]'),
])
def test_bad_configs_are_rejected(corruptions, message):
    with pytest.raises(ValueError, match=message):
        RandomSensorCorruption(corruptions)
