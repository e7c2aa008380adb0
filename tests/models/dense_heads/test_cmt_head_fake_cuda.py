"""The whole CmtHead with AQR runs forward on fake CUDA tensors (no GPU needed).

``FakeTensorMode`` traces every op with the CUDA kernels' meta functions:
shapes, dtypes, devices and op signatures are checked, and a data-dependent
shape or host read anywhere in the head (AQR routing, bias construction, the
attention backends auto picks on CUDA) raises, and :class:`HostCopyCounter`
catches the other kind of synchronisation, blocking copies of host data to
the device, which fake tensors would trace without complaint. Gradients
cannot run there; they are verified by the CPU tests of the same code.
"""
import pytest
import torch
from mmdet3d.models import build_model
from torch._subclasses.fake_tensor import FakeTensorMode

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.utils.host_data import HostCopyCounter
from projects.mmdet3d_plugin.models.utils.camera_blanking import FusedBlankViews


@pytest.mark.parametrize('use_local_bias, modality_passes, fused_black, structured_first',
                         [(True, ('fused', ), False, None), (False, ('fused', ), False, None),
                          (True, ('fused', 'lidar', 'camera'), False, None), (True, ('fused', 'camera'), True, None),
                          (True, ('fused', ), False, 'tiled_bias')])
def test_cmt_aqr_head_forward_on_fake_cuda_with_dn_under_autocast(cmt_test_data, use_local_bias, modality_passes,
                                                                  fused_black, structured_first, monkeypatch):
    """``fused_black``: the second sample's fused pass sees black views (``fused_image_drop_prob``);
    ``structured_first``: the backend ``auto`` tries first for the AQR biases (``STRUCTURED_BIAS_FIRST``)."""
    if structured_first is not None:
        pytest.importorskip('triton', reason='tiled_bias runs its Triton kernels (through custom operators)')
        from projects.mmdet3d_plugin.attention import dispatch
        from projects.mmdet3d_plugin.attention.backends import BACKENDS
        monkeypatch.setattr(dispatch, 'STRUCTURED_BIAS_FIRST', {'cuda': structured_first})
        runs, backend = [], BACKENDS[structured_first]
        run = backend.forward
        monkeypatch.setattr(backend, 'forward', lambda call: runs.append(call) or run(call))
    cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs')
    cfg.model.pts_bbox_head.attention_bias_config.update(use_local_bias=use_local_bias)
    cfg.model.pts_bbox_head.update(modality_passes=modality_passes, fused_image_drop_prob=0.25 if fused_black else 0.0)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    model.train()
    data = cmt_test_data['random_batch']((3, 2))
    with torch.no_grad():
        img_feats, pts_feats = model.extract_feat(data['points'], data['img'], data['img_metas'])
    head = model.pts_bbox_head
    with FakeTensorMode(allow_non_fake_inputs=True):
        head = head.to('cuda')
        pts_feats = [f.to('cuda') for f in pts_feats]
        img_feats = [f.to('cuda') for f in img_feats]
        extra = {}
        if fused_black:
            num_views = img_feats[0].size(0) // 2
            extra = dict(fused_blank_views=FusedBlankViews((False, True), img_feats[0][:num_views] * 0.5))
        # the ground truth arrives on the device, as the data-parallel wrapper scatters it; its labels are read
        # (checked against the classes) by the loss only, where the host waits for the matching anyway
        gt_bboxes_3d = [boxes.to('cuda') for boxes in data['gt_bboxes_3d']]
        gt_labels_3d = [labels.to('cuda') for labels in data['gt_labels_3d']]
        # torch.autocast turns itself off when built without a CUDA runtime; the fake CUDA tensors need none
        with monkeypatch.context() as patch:
            patch.setattr(torch.cuda, 'is_available', lambda: True)
            autocast = torch.autocast('cuda', torch.float16)
        with autocast, HostCopyCounter() as host_copies:
            assert torch.is_autocast_enabled('cuda')
            outputs = head(pts_feats, img_feats, data['img_metas'], gt_bboxes_3d, gt_labels_3d, **extra)
        # img_metas come to the device through pinned memory, constants from the per-device cache
        assert host_copies.copies == [], 'blocking host-to-device copies (stream synchronisations on a GPU)'
        task = outputs[0][0]
        assert task['cls_logits'].dtype == torch.float16, 'the head did not run under fp16 autocast'
        if structured_first is not None:  # every decoder layer's biased cross-attention
            assert len(runs) == cfg.model.pts_bbox_head.transformer.decoder.num_layers
        assert task['center'].device.type == 'cuda'
        assert outputs.dn_queries is not None and 'dn_center' in task, 'no DN queries ran'
        assert task['cls_logits'].shape[:3] == (cfg.model.pts_bbox_head.transformer.decoder.num_layers, 2,
                                                cmt_test_data['num_query'])
        assert outputs.routing is not None
        assert tuple(outputs.passes) == modality_passes[1:]
        assert all(p.tasks[0][0]['cls_logits'].shape == task['cls_logits'].shape for p in outputs.passes.values())
