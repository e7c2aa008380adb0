"""tools/test.py --corruption: the corrupted inputs reach the model, the run says so, bad specs are refused.

The model: configs/demo/cmt_aqr_synthetic_tiny.py shrunk by tests/tools/conftest.py, randomly initialised.
A spy on ``CmtDetector.simple_test`` records what the detector receives.
"""
import json

import numpy as np
import pytest
import torch

from projects.mmdet3d_plugin.datasets.pipelines.corruption_spec import CORRUPTION_FORMS
from projects.mmdet3d_plugin.models.detectors.cmt import CmtDetector
from tools import test as test_tool

AQR_DEMO = 'cmt_aqr_synthetic_tiny'


@pytest.fixture
def model_inputs(monkeypatch):
    """Every ``(points, img_metas, img)`` the detector's ``simple_test`` gets."""
    seen = []
    original = CmtDetector.simple_test

    def spy(self, points, img_metas, img=None, rescale=False):
        seen.append((points, img_metas, img))
        return original(self, points, img_metas, img, rescale=rescale)

    monkeypatch.setattr(CmtDetector, 'simple_test', spy)
    return seen


@pytest.mark.parametrize('corruption', [None, 'camera_drop'])
def test_camera_drop_sends_black_images_to_the_model(corruption, demo_checkpoint, model_inputs, tmp_path):
    config, checkpoint = demo_checkpoint(AQR_DEMO)
    out = tmp_path / 'results.pkl'
    test_tool.main([config, checkpoint, '--out', str(out), '--work-dir', str(tmp_path)]
                   + (['--corruption', corruption] if corruption else []))
    assert out.exists() and len(model_inputs) == 2  # the two validation samples
    for _, img_metas, img in model_inputs:
        meta = img_metas[0]
        norm = meta['img_norm_cfg']
        black = torch.as_tensor(-norm['mean'] / norm['std']).view(1, 1, 3, 1, 1).expand_as(img)
        assert torch.allclose(img, black, atol=1e-4) == (corruption == 'camera_drop')
        if corruption:
            assert meta['corruption'] == dict(name='camera_drop', mode='camera_drop', views=list(range(6)))
        else:
            assert meta.get('corruption') is None


def test_fov_keeps_only_the_points_in_the_forward_wedge(demo_checkpoint, model_inputs, tmp_path):
    config, checkpoint = demo_checkpoint(AQR_DEMO)
    test_tool.main([config, checkpoint, '--out', str(tmp_path / 'results.pkl'), '--work-dir', str(tmp_path),
                    '--corruption', 'fov:90'])
    assert model_inputs
    for points, img_metas, _ in model_inputs:
        record = img_metas[0]['corruption']
        assert record['name'] == 'fov:90' and 0 < record['num_points_after'] < record['num_points_before']
        xy = points[0][:, :2].numpy()
        azimuth = np.degrees(np.arctan2(xy[:, 1], xy[:, 0])) - record['forward_yaw_deg']
        offset = (azimuth + 180.0) % 360.0 - 180.0
        assert len(xy) > 0 and np.abs(offset).max() <= 45.0 + 1e-3


def test_eval_records_the_corruption_and_its_seed(demo_checkpoint, tmp_path, caplog):
    config, checkpoint = demo_checkpoint(AQR_DEMO)
    test_tool.main([config, checkpoint, '--eval', 'bbox', '--work-dir', str(tmp_path), '--corruption', 'points:0.5',
                    '--corruption-seed', '7'])
    report = json.loads(next(tmp_path.glob('eval_*.json')).read_text())
    assert report['corruption'] == 'points:0.5' and report['corruption_seed'] == 7
    assert 0.0 <= report['metrics']['pts_bbox_NuScenes/NDS'] <= 1.0
    assert "test-time corruption points:0.5: {'type': 'SensorCorruption', 'mode': 'points', 'keep_ratio': 0.5, " \
           "'seed': 7}" in caplog.text


@pytest.mark.parametrize('spec, cause', [
    ('fog', "unknown corruption mode 'fog'"),
    ('fov:400', 'fov_deg must be an angle in (0, 360] degrees'),
    ('lidar_drop:1', "corruption 'lidar_drop' takes no argument"),
    ('view_drop', 'needs view'),
])
def test_bad_corruption_specs_are_refused_with_the_valid_forms(spec, cause, capsys):
    with pytest.raises(SystemExit) as exit_info:
        test_tool.parse_args(['config.py', 'checkpoint.pth', '--eval', 'bbox', '--corruption', spec])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert 'argument --corruption' in error and cause in error and CORRUPTION_FORMS in error
