"""CmtHead reads a batch's camera geometry from its img_metas once per forward (``CameraGeometry.from_metas``) and
hands it to every part: no part stacks (or inverts) the metas' ``lidar2img`` again."""
import torch

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.models.utils import camera_geometry
from projects.mmdet3d_plugin.models.utils.camera_blanking import FusedBlankViews
from test_cmt_head import C, features, head_cfg

# every part that reads camera geometry: AQR's router and its per-query loss (and, at test time, the oracle), the
# camera pass's window prior, the image aux head whose depth lifts the camera tokens, black views for the fused pass
EVERY_PART = dict(aqr_config=dict(type='AQRWeightGenerator', window_sizes=[3, 3], query_loss_weight=1.0),
                  attention_bias_config=dict(type='AttentionBiasGenerator', window_size=3, bias_scale=2.0),
                  modality_passes=('fused', 'camera'), camera_window_prior=dict(window_size=3, bias=4.0),
                  image_aux_config=dict(type='ImageAuxHead', feat_channels=8), camera_depth_position=True,
                  fused_image_drop_prob=0.5, test_cfg=dict(aqr_routing='oracle'))


def _count_matrix_reads(monkeypatch) -> list:
    """Record every read of the metas' ``lidar2img`` (``CameraGeometry.from_metas`` and ``stack_lidar2img``)."""
    reads, read = [], camera_geometry._lidar2img_matrices
    monkeypatch.setattr(camera_geometry, '_lidar2img_matrices', lambda img_metas: reads.append(1) or read(img_metas))
    return reads


def test_a_training_forward_and_its_loss_read_the_camera_matrices_once(cmt_test_data, monkeypatch):
    head = head_cfg(**EVERY_PART).train()
    bev, img = features()
    img_metas = cmt_test_data['make_img_metas'](2)
    boxes = [cmt_test_data['random_boxes'](2), cmt_test_data['random_boxes'](1)]
    labels = [torch.tensor([0, 3]), torch.tensor([1])]
    blank = FusedBlankViews((False, True), torch.randn(2, C, *img.shape[-2:]))
    reads = _count_matrix_reads(monkeypatch)
    preds = head([bev], [img], img_metas, boxes, labels, fused_blank_views=blank)
    losses = head.loss(boxes, labels, preds, gt_num_points=[torch.tensor([5, 0]), torch.tensor([9])])
    assert {'loss_aqr_query', 'camera.loss_cls', 'image_aux.loss_depth'} <= set(losses), 'every part ran'
    assert len(reads) == 1


def test_a_test_forward_with_the_oracle_reads_the_camera_matrices_once(cmt_test_data, monkeypatch):
    head = head_cfg(**EVERY_PART).eval()
    bev, img = features()
    img_metas = [dict(meta, lidar_points=torch.zeros(1, 3)) for meta in cmt_test_data['make_img_metas'](2)]
    reads = _count_matrix_reads(monkeypatch)
    with torch.no_grad():
        outputs = head([bev], [img], img_metas)
    assert outputs.routing is not None
    assert len(reads) == 1
