"""CmtHead: DN queries, the cross-attention bias seam, losses, boxes, the LiDAR-only / camera-only aliases."""
import pytest
import torch
from mmdet.models.builder import build_head

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.config_upgrade import upgrade_model_config
from projects.mmdet3d_plugin.models.dense_heads import CmtHead
from projects.mmdet3d_plugin.models.dense_heads.head_outputs import HeadOutputs

PC_RANGE = [-12.0, -12.0, -5.0, 12.0, 12.0, 3.0]
C, LAYERS, NUM_QUERY = 32, 2, 12
TASKS = [dict(num_class=3, class_names=['car', 'truck', 'bus']), dict(num_class=2, class_names=['bicycle', 'cone'])]
CODE_WEIGHTS = [2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.2, 0.2]


def head_cfg(head_type='CmtHead', transformer_type='CmtTransformer', grid_size=(48, 40, 40), **kwargs):
    layer = dict(
        type='PETRTransformerDecoderLayer', with_cp=False,
        attn_cfgs=[dict(type='MultiheadAttention', embed_dims=C, num_heads=4, dropout=0.0),
                   dict(type='PETRMultiheadFlashAttention', embed_dims=C, num_heads=4, backend='math')],
        ffn_cfgs=dict(type='FFN', embed_dims=C, feedforward_channels=64, num_fcs=2, ffn_drop=0.0),
        operation_order=('self_attn', 'norm', 'cross_attn', 'norm', 'ffn', 'norm'))
    cfg = dict(
        type=head_type, in_channels=16, hidden_dim=C, num_query=NUM_QUERY, depth_num=4, downsample_scale=8,
        tasks=TASKS,
        bbox_coder=dict(type='MultiTaskBBoxCoder', pc_range=PC_RANGE, max_num=20, num_classes=5,
                        post_center_range=[-20.0, -20.0, -10.0, 20.0, 20.0, 10.0]),
        transformer=dict(type=transformer_type,
                         decoder=dict(type='PETRTransformerDecoder', return_intermediate=True, num_layers=LAYERS,
                                      transformerlayers=layer)),
        train_cfg=dict(assigner=dict(type='HungarianAssigner3D', cls_cost=dict(type='FocalLossCost', weight=2.0),
                                     reg_cost=dict(type='BBox3DL1Cost', weight=0.25),
                                     iou_cost=dict(type='IoUCost', weight=0.0), code_weights=CODE_WEIGHTS),
                       code_weights=CODE_WEIGHTS, grid_size=list(grid_size)),
        loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2, alpha=0.25, loss_weight=2.0),
        loss_bbox=dict(type='L1Loss', loss_weight=0.25))
    cfg.update(kwargs)
    head = build_head(upgrade_model_config(cfg, 'pts_bbox_head'))
    head.init_weights()
    return head


def features(bs=2, views=2, bev_hw=(5, 6), img_hw=(4, 10)):
    """BEV map [bs, 16, 5, 6] (non-square on purpose), camera maps [bs * views, C, 4, 10]."""
    return torch.randn(bs, 16, *bev_hw), torch.randn(bs * views, C, *img_hw)


def metas(cmt_test_data, bs=2):
    return cmt_test_data['make_img_metas'](bs)


def test_cross_attention_bias_reaches_every_decoder_layer(cmt_test_data):
    """A bias that blocks every camera key makes the output independent of the camera features."""
    head = head_cfg().eval()
    bev, img = features()
    img_metas = metas(cmt_test_data)
    num_bev = bev.shape[-2] * bev.shape[-1]

    def block_camera(reference_points, query_embed, memory, img_metas, geometry, num_dn, oracle):
        img_feat = memory.img_feat
        num_camera = img_feat.shape[0] // bev.shape[0] * img_feat.shape[2] * img_feat.shape[3]
        mask = torch.zeros(reference_points.shape[1], num_bev + num_camera, dtype=torch.bool)
        mask[:, num_bev:] = True
        return memory._replace(cross_attn_bias=mask), None

    baseline = head([bev], [img], img_metas)[0][0]['cls_logits']
    assert not torch.allclose(baseline, head([bev], [torch.randn_like(img)], img_metas)[0][0]['cls_logits'])
    head.router.route = block_camera
    blocked = head([bev], [img], img_metas)[0][0]['cls_logits']
    blocked_other = head([bev], [torch.randn_like(img)], img_metas)[0][0]['cls_logits']
    torch.testing.assert_close(blocked, blocked_other)


def test_training_forward_adds_dn_queries_and_eval_does_not(cmt_test_data):
    head = head_cfg()
    bev, img = features()
    img_metas = metas(cmt_test_data)
    boxes = [cmt_test_data['random_boxes'](3), cmt_test_data['random_boxes'](1)]
    labels = [torch.tensor([0, 3, 4]), torch.tensor([1])]
    preds = head.train()([bev], [img], img_metas, boxes, labels)
    assert isinstance(preds, HeadOutputs) and len(preds) == 2  # two tasks
    task = preds[1][0]
    dn = preds.dn_queries
    assert dn.groups == min(10, NUM_QUERY // 3) and dn.pad_size == 3 * dn.groups
    assert task['center'].shape == (LAYERS, 2, NUM_QUERY, 2)
    assert task['dn_center'].shape == (LAYERS, 2, dn.pad_size, 2)
    assert task['cls_logits'].shape[-1] == 2 and task['dn_cls_logits'].shape[-1] == 2
    low, high = torch.tensor(PC_RANGE[:2]), torch.tensor(PC_RANGE[3:5])
    assert ((task['center'] >= low) & (task['center'] <= high)).all()

    losses = head.loss(boxes, labels, preds)
    expected = {'loss_cls', 'loss_bbox', 'd0.loss_cls', 'd0.loss_bbox', 'dn_loss_cls', 'dn_loss_bbox',
                'd0.dn_loss_cls', 'd0.dn_loss_bbox'}
    assert set(losses) == expected
    assert all(torch.isfinite(v) and v > 0 for v in losses.values())

    with pytest.raises(ValueError, match='gt_bboxes_3d'):
        head([bev], [img], img_metas)
    eval_preds = head.eval()([bev], [img], img_metas)
    assert eval_preds.dn_queries is None and 'dn_center' not in eval_preds[0][0]
    assert eval_preds[0][0]['center'].shape[2] == NUM_QUERY


def test_without_dn_there_are_no_dn_losses(cmt_test_data):
    head = head_cfg(scalar=0).train()
    bev, img = features()
    boxes = [cmt_test_data['random_boxes'](2)] * 2
    labels = [torch.tensor([0, 1])] * 2
    losses = head.loss(boxes, labels, head([bev], [img], metas(cmt_test_data)))
    assert set(losses) == {'loss_cls', 'loss_bbox', 'd0.loss_cls', 'd0.loss_bbox'}


def test_get_bboxes_returns_bottom_centre_boxes(cmt_test_data):
    head = head_cfg().eval()
    bev, img = features()
    img_metas = metas(cmt_test_data)
    preds = head([bev], [img], img_metas)
    decoded = head.bbox_coder.decode(preds)
    results = head.get_bboxes(preds, img_metas)
    assert len(results) == 2
    boxes, scores, labels = results[0]
    assert len(boxes) == len(scores) == len(labels) == len(decoded[0]['scores'])
    torch.testing.assert_close(boxes.gravity_center, decoded[0]['bboxes'][:, :3])
    assert labels.max() < 5


def test_lidar_and_camera_variants(cmt_test_data):
    bev, img = features()
    img_metas = metas(cmt_test_data)
    lidar = head_cfg('CmtLidarHead', 'CmtLidarTransformer').eval()
    assert type(lidar) is CmtHead and lidar.pass_plan.modalities == ('lidar', )
    assert not hasattr(lidar, 'rv_embedding')
    assert lidar([bev], [None], img_metas)[0][0]['vel'].shape == (LAYERS, 2, NUM_QUERY, 2)
    camera = head_cfg('CmtImageHead', 'CmtImageTransformer').eval()
    assert type(camera) is CmtHead and camera.pass_plan.modalities == ('camera', )
    assert not hasattr(camera, 'shared_conv')
    assert camera([None], [img], img_metas)[0][0]['rot'].shape == (LAYERS, 2, NUM_QUERY, 2)
    with pytest.raises(ValueError, match='camera'):
        lidar([bev], [img], img_metas)
    with pytest.raises(ValueError, match='LiDAR'):
        camera([bev], [img], img_metas)


def test_bad_configs_and_inputs_raise(cmt_test_data):
    bev, img = features()
    with pytest.raises(ValueError, match='grid_size'):
        head_cfg(grid_size=(1440, 1440, 40))([bev], [img], metas(cmt_test_data))
    with pytest.raises(ValueError, match='num_classes'):
        head_cfg(bbox_coder=dict(type='MultiTaskBBoxCoder', pc_range=PC_RANGE, num_classes=10))
    with pytest.raises(ValueError, match='norm_bbox'):
        head_cfg(norm_bbox=False)
    with pytest.raises(TypeError):
        head_cfg(not_an_option=1)
    head = head_cfg().train()
    boxes, labels = [cmt_test_data['random_boxes'](1)] * 2, [torch.tensor([7])] * 2
    preds = head([bev], [img], metas(cmt_test_data), boxes, labels)  # the labels are read by the loss, not forward
    with pytest.raises(ValueError, match='labels'):
        head.loss(boxes, labels, preds)


def test_init_weights_reaches_every_task_head():
    """Each task's classification output starts at the focal-loss prior init_bias, the other convs are re-drawn."""
    head = head_cfg(separate_head=dict(type='SeparateTaskHead', init_bias=-2.19, final_kernel=1))
    for task_head in head.task_heads:
        assert torch.all(task_head.cls_logits[-1].bias == -2.19)
        assert task_head.is_init
    scores = head.task_heads[0].cls_logits[-1].bias.sigmoid()
    torch.testing.assert_close(scores, torch.full_like(scores, 0.1), atol=1e-3, rtol=0)
