"""ModalMask3D: what it zeroes is what it records, and the record reaches img_metas for the AQR routing loss."""
import numpy as np
import pytest
import torch
from mmcv.utils import build_from_cfg
from mmdet.datasets.builder import PIPELINES
from mmdet3d.core.points import LiDARPoints
from mmdet3d.datasets.pipelines import Compose

from projects.mmdet3d_plugin.datasets.pipelines.modal_mask_3d import DROPPED_MODALITIES_KEY, MODALITIES


def _small_results():
    points = LiDARPoints(torch.arange(40, dtype=torch.float32).reshape(8, 5) + 1, points_dim=5)
    return dict(points=points, img=[np.full((4, 6, 3), 7 + view, dtype=np.uint8) for view in range(6)])


def _dropped_as_seen(results):
    """Which modalities are actually zero."""
    seen = []
    if not results['points'].tensor.any():
        seen.append('points')
    if not any(img.any() for img in results['img']):
        seen.append('image')
    return seen


@pytest.mark.parametrize('modality', ['image', 'points'])
def test_test_mode_always_drops_the_configured_modality(modality):
    results = build_from_cfg(dict(type='ModalMask3D', mode='test', mask_modal=modality), PIPELINES)(_small_results())
    assert results[DROPPED_MODALITIES_KEY] == [modality] == _dropped_as_seen(results)
    assert results['points'].tensor.shape == (8, 5)  # zeroed, not removed (as upstream CMT)
    assert all(img.shape == (4, 6, 3) and img.dtype == np.uint8 for img in results['img'])


def test_points_can_be_removed_instead_of_zeroed(loaded_sample, cmt, created_data):
    """``points_drop='remove'``: an empty cloud of the loaded width, as the ``lidar_drop`` corruption gives, and it
    goes through the demo's training steps after ModalMask3D."""
    mask = build_from_cfg(dict(type='ModalMask3D', mode='test', mask_modal='points', points_drop='remove'), PIPELINES)
    results = mask(_small_results())
    assert results[DROPPED_MODALITIES_KEY] == ['points']
    assert isinstance(results['points'], LiDARPoints) and results['points'].tensor.shape == (0, 5)
    assert 'remove' in repr(mask)
    np.random.seed(0)
    train = build_from_cfg(dict(type='ModalMask3D', mode='train', image_drop_prob=0.0, points_drop_prob=1.0,
                                points_drop='remove'), PIPELINES)
    assert train(_small_results())['points'].tensor.shape == (0, 5)
    after_loading = cmt.train_pipeline(created_data['dbinfos'])[len(cmt.LOADING_PIPELINE):]
    steps = [step for step in after_loading if step['type'] != 'UnifiedObjectSample']  # it pastes points back
    index = [step['type'] for step in steps].index('ModalMask3D')
    steps[index] = dict(type='ModalMask3D', mode='test', mask_modal='points', points_drop='remove')
    out = Compose(steps)(loaded_sample())
    assert out['points'].data.shape[0] == 0 and out['img_metas'].data[DROPPED_MODALITIES_KEY] == ['points']


def test_train_mode_drops_at_most_one_modality_with_the_configured_rates():
    np.random.seed(0)
    mask = build_from_cfg(dict(type='ModalMask3D', mode='train', image_drop_prob=0.3, points_drop_prob=0.2), PIPELINES)
    counts = {'image': 0, 'points': 0, 'none': 0}
    for _ in range(1000):
        results = mask(_small_results())
        assert results[DROPPED_MODALITIES_KEY] == _dropped_as_seen(results)
        assert len(results[DROPPED_MODALITIES_KEY]) <= 1
        counts[results[DROPPED_MODALITIES_KEY][0] if results[DROPPED_MODALITIES_KEY] else 'none'] += 1
    assert abs(counts['image'] / 1000 - 0.3) < 0.05 and abs(counts['points'] / 1000 - 0.2) < 0.05


def test_the_record_reaches_img_metas_in_the_aux_loss_convention(loaded_sample, cmt):
    from projects.mmdet3d_plugin.models.aqr import aux_loss
    assert DROPPED_MODALITIES_KEY == aux_loss.DROPPED_MODALITIES_KEY and set(MODALITIES) == set(aux_loss.MODALITY_NAMES)
    pipeline = Compose([dict(type='ModalMask3D', mode='test', mask_modal='points'),
                        dict(type='DefaultFormatBundle3D', class_names=cmt.CLASS_NAMES),
                        dict(type='Collect3D', keys=['points', 'img'], meta_keys=cmt.META_KEYS)])
    metas = [pipeline(loaded_sample())['img_metas'].data]
    assert metas[0][DROPPED_MODALITIES_KEY] == ['points']
    lidar_dropped, camera_dropped = aux_loss.modality_drop_flags(metas, torch.device('cpu'))
    assert lidar_dropped.tolist() == [True] and camera_dropped.tolist() == [False]


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match='mode'):
        build_from_cfg(dict(type='ModalMask3D', mode='eval'), PIPELINES)
    with pytest.raises(ValueError, match='mask_modal'):
        build_from_cfg(dict(type='ModalMask3D', mask_modal='radar'), PIPELINES)
    with pytest.raises(ValueError, match="points_drop must be one of \\('zero', 'remove'\\)"):
        build_from_cfg(dict(type='ModalMask3D', points_drop='delete'), PIPELINES)
    with pytest.raises(ValueError, match='sum to <= 1'):
        build_from_cfg(dict(type='ModalMask3D', mode='train', image_drop_prob=0.7, points_drop_prob=0.5), PIPELINES)
    with pytest.raises(KeyError, match="no 'img'"):
        build_from_cfg(dict(type='ModalMask3D'), PIPELINES)(dict(points=_small_results()['points']))
