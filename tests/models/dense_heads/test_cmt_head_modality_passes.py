"""Per-modality decoding passes of CmtHead: each pass decodes only its keys, has its own losses, and the
default (fused only) is the CMT recorded before the passes existed (bit for bit on the recording machine, to
float32 rounding on others)."""
import copy
import os

import pytest
import torch
from mmcv import Config
from mmdet3d.models import build_model
from torch._subclasses.fake_tensor import FakeTensorMode

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.attention import AttentionBias
from projects.mmdet3d_plugin.models.dense_heads.head_outputs import HeadOutputs
from projects.mmdet3d_plugin.models.dense_heads.pass_plan import (FUSED, MODALITY_PASSES, corrupted_modalities,
                                                                  trained_samples)
from projects.mmdet3d_plugin.models.utils import CmtTransformer, petr_attention
from projects.mmdet3d_plugin.models.utils.camera_blanking import blank_camera_views
from projects.mmdet3d_plugin.models.utils.camera_geometry import CameraGeometry
from test_cmt_head import LAYERS, features, head_cfg

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
REFERENCE = os.path.join(REPO_ROOT, 'tests', 'data', 'reference', 'cmt_head_fused_pass', 'outputs.pt')
PASSES = ('fused', 'lidar', 'camera')
AQR = dict(aqr_config=dict(type='AQRWeightGenerator', window_sizes=[3, 3], weight_head_std=0.01),
           attention_bias_config=dict(type='AttentionBiasGenerator', window_size=3, bias_scale=2.0))
FUSED_LOSSES = {'loss_cls', 'loss_bbox', 'dn_loss_cls', 'dn_loss_bbox'} | {
    f'd{layer}.{name}' for layer in range(LAYERS - 1)
    for name in ('loss_cls', 'loss_bbox', 'dn_loss_cls', 'dn_loss_bbox')}


def gts(cmt_test_data):
    return [cmt_test_data['random_boxes'](3), cmt_test_data['random_boxes'](1)], [torch.tensor([0, 3, 4]),
                                                                                  torch.tensor([1])]


def fused_pass_outputs(cmt_test_data, **head_options):
    """Training predictions, losses, gradient sums and eval predictions of a seeded small head.

    ``tests/data/reference/cmt_head_fused_pass/outputs.pt`` holds what this gave before the passes existed.
    """
    torch.manual_seed(0)
    head = head_cfg(**head_options)
    bev, img = features()
    img_metas = cmt_test_data['make_img_metas'](2)
    boxes, labels = gts(cmt_test_data)
    outputs = {}
    preds = head.train()([bev], [img], img_metas, boxes, labels)
    for task, task_preds in enumerate(preds):
        for key, value in task_preds[0].items():
            if isinstance(value, torch.Tensor):
                outputs[f'train.{task}.{key}'] = value.detach().clone()
    losses = head.loss(boxes, labels, preds)
    for key, value in losses.items():
        outputs[f'loss.{key}'] = value.detach().clone()
    sum(losses.values()).backward()
    for name, parameter in head.named_parameters():
        if parameter.grad is not None:
            outputs[f'grad.{name}'] = torch.stack([parameter.grad.sum(), parameter.grad.abs().sum()])
    for task, task_preds in enumerate(head.eval()([bev], [img], img_metas)):
        for key, value in task_preds[0].items():
            if isinstance(value, torch.Tensor):
                outputs[f'eval.{task}.{key}'] = value.detach().clone()
    return outputs


@pytest.mark.usefixtures('reference_threads')
def test_default_passes_leave_outputs_losses_and_gradients_unchanged(cmt_test_data):
    """Bit-identical when recorded; compared to ``REFERENCE_RTOL`` of each tensor's largest value, so that a
    processor whose kernels round differently passes it."""
    expected = torch.load(REFERENCE)['cmt']
    actual = fused_pass_outputs(cmt_test_data)
    assert set(actual) == set(expected)
    differs = cmt_test_data['differs_from_reference']
    changed = [key for key, value in expected.items() if differs(actual[key], value)]
    assert not changed, f'outputs that differ from the head before the passes existed: {changed}'


def test_default_passes_leave_aqr_outputs_and_losses_unchanged(cmt_test_data):
    """Bit-identical when recorded; compared to ``REFERENCE_RTOL`` of each tensor's largest value, as
    ``tests/models/aqr/test_aqr_outputs_unchanged.py`` does, so that optimising AQR's router (rounding
    differences) does not fail it. Gradients are pinned by the plain CMT test only: the router's
    key-projection gradients are sums near 0, whose rounding differences are relatively large."""
    expected = torch.load(REFERENCE)['aqr']
    actual = fused_pass_outputs(cmt_test_data, **AQR)
    assert set(actual) == set(expected)
    differs = cmt_test_data['differs_from_reference']
    changed = [key for key, value in expected.items() if not key.startswith('grad.') and differs(actual[key], value)]
    assert not changed, f'outputs that differ from the head before the passes existed: {changed}'


@pytest.mark.parametrize('options', [{}, AQR], ids=['cmt', 'aqr'])
def test_passes_add_no_parameters_and_inference_decodes_the_fused_pass(options, cmt_test_data):
    default, passes = head_cfg(**options), head_cfg(modality_passes=PASSES, **options)
    assert default.pass_plan.passes == head_cfg(modality_passes=('fused', ), **options).pass_plan.passes
    assert [(k, v.shape) for k, v in passes.state_dict().items()] == \
        [(k, v.shape) for k, v in default.state_dict().items()]
    passes.load_state_dict(default.state_dict())
    bev, img = features()
    img_metas = cmt_test_data['make_img_metas'](2)
    with torch.no_grad():
        expected, actual = default.eval()([bev], [img], img_metas), passes.eval()([bev], [img], img_metas)
    for expected_task, actual_task in zip(expected, actual):
        assert set(actual_task[0]) == set(expected_task[0])
        for key, value in expected_task[0].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(actual_task[0][key], value), key


def freeze_routing(head, monkeypatch):
    """Make AQR's weights those of the first call, so that the bias values do not follow the features."""
    generator, first = head.aqr_weight_generator, []

    def frozen(*args, **kwargs):
        if not first:
            first.append(route(*args, **kwargs))
        return first[0]

    route = generator.forward
    monkeypatch.setattr(generator, 'forward', frozen)


def pass_outputs(head, bev, img, img_metas, boxes, labels):
    """``{pass: [L, bs, DN + Q, C]}`` classification logits of every pass of one training forward."""
    torch.manual_seed(1)  # the same DN noise in every call
    with torch.no_grad():
        preds = head([bev], [img], img_metas, boxes, labels)
    by_pass = dict(fused=preds.tasks, **{name: outputs.tasks for name, outputs in preds.passes.items()})
    return {name: torch.cat([torch.cat([task[0]['dn_cls_logits'], task[0]['cls_logits']], dim=2)
                             for task in pass_preds], dim=-1) for name, pass_preds in by_pass.items()}


@pytest.mark.parametrize('options', [{}, AQR], ids=['cmt', 'aqr'])
def test_each_pass_decodes_only_its_own_keys(options, cmt_test_data, monkeypatch):
    """Other camera features leave the LiDAR pass unchanged and other BEV features the camera pass.

    With AQR the routing weights are computed from both modalities (they set the bias values of every pass);
    they are frozen here so that only the keys a pass attends to can carry the change.
    """
    head = head_cfg(modality_passes=PASSES, **options).train()
    if options:
        freeze_routing(head, monkeypatch)
    bev, img = features()
    img_metas = cmt_test_data['make_img_metas'](2)
    boxes, labels = gts(cmt_test_data)
    reference = pass_outputs(head, bev, img, img_metas, boxes, labels)
    assert set(reference) == set(PASSES)
    other_images = pass_outputs(head, bev, torch.randn_like(img), img_metas, boxes, labels)
    other_bev = pass_outputs(head, torch.randn_like(bev), img, img_metas, boxes, labels)
    assert torch.equal(other_images['lidar'], reference['lidar'])
    assert torch.equal(other_bev['camera'], reference['camera'])
    for changed, name in ((other_images, 'camera'), (other_images, 'fused'), (other_bev, 'lidar'),
                          (other_bev, 'fused')):
        assert not torch.allclose(changed[name], reference[name]), name


class _KeyRecorder:
    """Wraps apply_attention: records the number of keys and the bias of every cross-attention call."""

    def __init__(self, original):
        self.original, self.calls = original, []

    def __call__(self, q, k, v, bias=None, **kwargs):
        self.calls.append((k.size(-2), bias))
        return self.original(q, k, v, bias=bias, **kwargs)


@pytest.mark.parametrize('bias_options', [None, dict(use_local_bias=True), dict(use_local_bias=False, per_layer=True)],
                         ids=['cmt', 'aqr_local', 'aqr_global_per_layer'])
def test_each_pass_attends_to_its_keys_only_with_the_fused_bias_of_them(bias_options, cmt_test_data, monkeypatch):
    """The fused, LiDAR and camera passes have [BEV ; camera], BEV and camera keys (left out, not zeroed)."""
    options = {}
    if bias_options is not None:
        options = copy.deepcopy(AQR)
        options['attention_bias_config'].update(bias_options, num_layers=LAYERS)
    head = head_cfg(modality_passes=PASSES, **options).train()
    recorder = _KeyRecorder(petr_attention.apply_attention)
    monkeypatch.setattr(petr_attention, 'apply_attention', recorder)
    bev, img = features()
    boxes, labels = gts(cmt_test_data)
    head([bev], [img], cmt_test_data['make_img_metas'](2), boxes, labels)
    num_bev, num_camera = bev.shape[-2] * bev.shape[-1], img.shape[0] // bev.shape[0] * img.shape[-2] * img.shape[-1]
    assert [keys for keys, _ in recorder.calls] == [num_bev + num_camera] * LAYERS + [num_bev] * LAYERS + \
        [num_camera] * LAYERS, 'the passes must decode [BEV ; camera], BEV and camera keys, in this order'
    if bias_options is None:
        assert all(bias is None for _, bias in recorder.calls)
        return
    assert all(isinstance(bias, AttentionBias) and bias.num_keys == keys for keys, bias in recorder.calls)
    for layer in range(LAYERS):
        fused = recorder.calls[layer][1].to_dense()
        lidar, camera = (recorder.calls[layer + LAYERS * i][1].to_dense() for i in (1, 2))
        assert torch.equal(lidar.expand_as(fused[..., :num_bev]), fused[..., :num_bev])
        assert torch.equal(camera.expand_as(fused[..., num_bev:]), fused[..., num_bev:])
        assert lidar.abs().sum() > 0 and camera.abs().sum() > 0


def test_camera_window_prior_biases_the_camera_pass_only(cmt_test_data, monkeypatch):
    """With ``camera_window_prior`` the camera pass's queries, DN ones included, get the fixed prior; the fused and
    LiDAR passes keep the routed bias."""
    prior = dict(window_size=3, bias=4.0)
    head = head_cfg(modality_passes=PASSES, camera_window_prior=prior, **AQR).train()
    assert set(head.state_dict()) == set(head_cfg(modality_passes=PASSES, **AQR).state_dict())
    recorder = _KeyRecorder(petr_attention.apply_attention)
    monkeypatch.setattr(petr_attention, 'apply_attention', recorder)
    bev, img = features()
    boxes, labels = gts(cmt_test_data)
    img_metas = cmt_test_data['make_img_metas'](2)
    preds = head([bev], [img], img_metas, boxes, labels)
    pad_size = preds.dn_queries.pad_size
    reference_points = torch.cat([preds.dn_queries.reference_points,
                                  head.reference_points.weight[None].expand(2, -1, -1)], dim=1)
    expected = head.camera_aids.window_prior_bias(reference_points, img,
                                                  CameraGeometry.from_metas(img_metas))().to_dense()
    num_bev = bev.shape[-2] * bev.shape[-1]
    for layer in range(LAYERS):
        fused, lidar, camera = (recorder.calls[layer + LAYERS * i][1].to_dense() for i in range(3))
        torch.testing.assert_close(camera, expected, rtol=0, atol=0)
        assert camera[..., :pad_size, :].abs().sum() > 0, 'DN queries get the prior too'
        assert not torch.equal(camera.expand_as(fused[..., num_bev:]), fused[..., num_bev:])
        assert torch.equal(lidar.expand_as(fused[..., :num_bev]), fused[..., :num_bev])


def test_each_pass_has_its_own_named_losses_and_matching(cmt_test_data):
    head = head_cfg(modality_passes=PASSES).train()
    bev, img = features()
    bev.requires_grad_(True)
    img.requires_grad_(True)
    boxes, labels = gts(cmt_test_data)
    preds = head([bev], [img], cmt_test_data['make_img_metas'](2), boxes, labels)
    losses = head.loss(boxes, labels, preds)
    assert set(losses) == FUSED_LOSSES | {f'{name}.{loss}' for name in ('lidar', 'camera') for loss in FUSED_LOSSES} \
        | {'lidar.num_samples', 'camera.num_samples'}
    assert losses['lidar.num_samples'] == losses['camera.num_samples'] == 2
    assert all(torch.isfinite(value) for value in losses.values())
    for name in ('lidar', 'camera'):
        # the pass's losses are those of its own predictions, matched on their own
        alone = head.loss(boxes, labels, HeadOutputs(preds.passes[name].tasks, preds.dn_queries))
        for loss in FUSED_LOSSES:
            assert torch.equal(losses[f'{name}.{loss}'], alone[loss]), (name, loss)
        assert not torch.equal(losses[f'{name}.loss_cls'], losses['loss_cls'])
    # the gradient of a single-modality pass reaches only its own features
    lidar_total = sum(value for key, value in losses.items() if key.startswith('lidar.') and 'loss' in key)
    bev_grad, img_grad = torch.autograd.grad(lidar_total, (bev, img), allow_unused=True)
    assert bev_grad.abs().sum() > 0 and img_grad is None
    camera_total = sum(value for key, value in losses.items() if key.startswith('camera.') and 'loss' in key)
    bev_grad, img_grad = torch.autograd.grad(camera_total, (bev, img), allow_unused=True)
    assert bev_grad is None and img_grad.abs().sum() > 0


@pytest.mark.parametrize('name, dropped, corruption', [('camera', 'image', 'camera_drop'),
                                                       ('lidar', 'points', 'lidar_drop')])
@pytest.mark.parametrize('lost_to', ['ModalMask3D', 'corruption'])
def test_a_pass_leaves_out_the_samples_whose_input_was_dropped(name, dropped, corruption, lost_to, cmt_test_data):
    """Sample 1 lost the pass's input (to ModalMask3D, or to a whole-sensor corruption of the training pipeline):
    the pass's losses are those of sample 0 alone."""
    def lose_input(meta):
        if lost_to == 'ModalMask3D':
            meta['dropped_modalities'] = [dropped]
        else:
            meta['corruption'] = dict(mode=corruption)

    _assert_pass_leaves_out_sample_1(name, cmt_test_data, lose_input)


@pytest.mark.parametrize('corruption, left_out', [('camera_fail', ('camera', )), ('extrinsic', ('camera', )),
                                                  ('object_drop', ('lidar', )), ('fov', ('lidar', )),
                                                  ('mixed', ('camera', 'lidar'))])
def test_a_pass_leaves_out_the_samples_whose_input_a_corruption_changed(corruption, left_out):
    """A single-modality pass does not learn to find objects its sensor no longer shows: a sample whose input for
    it a training corruption changed is left out, one whose other input it changed is kept."""
    img_metas = [dict(), dict(corruption=dict(name=corruption, mode=corruption, seed=0))]
    for name in ('camera', 'lidar'):
        assert trained_samples(MODALITY_PASSES[name], img_metas) == (True, name not in left_out), name
    assert trained_samples(FUSED, img_metas) == (True, True)


def test_a_corruption_of_an_input_the_model_does_not_read_leaves_the_pass_its_samples():
    """``mixed`` on a model that loads no points (``unread_inputs``) changed only the cameras."""
    meta = dict(corruption=dict(mode='mixed', unread_inputs=['points']))
    assert corrupted_modalities(meta) == {'image'} and corrupted_modalities(dict(corruption=None)) == set()
    assert trained_samples(MODALITY_PASSES['lidar'], [meta]) == (True, )


def test_the_camera_pass_leaves_out_a_sample_with_dead_views(cmt_test_data):
    _assert_pass_leaves_out_sample_1('camera', cmt_test_data,
                                     lambda meta: meta.update(corruption=dict(mode='camera_fail', fail_prob=0.4)))


def _assert_pass_leaves_out_sample_1(name, cmt_test_data, lose_input):
    """The pass ``name``'s losses are those of sample 0 alone once ``lose_input`` has marked sample 1's meta."""
    head = head_cfg(modality_passes=PASSES, noise_scale=0.0).train()  # no DN noise: same DN queries at bs 1
    head.shared_conv.eval()  # BatchNorm with running statistics: sample 0's BEV features do not depend on sample 1
    bev, img = features()
    boxes, labels = gts(cmt_test_data)
    img_metas = cmt_test_data['make_img_metas'](2)
    lose_input(img_metas[1])
    losses = head.loss(boxes, labels, head([bev], [img], img_metas, boxes, labels))
    assert losses[f'{name}.num_samples'] == 1
    assert losses[f'{"lidar" if name == "camera" else "camera"}.num_samples'] == 2
    views = img.shape[0] // bev.shape[0]
    alone = head.loss(boxes[:1], labels[:1], head([bev[:1]], [img[:views]], img_metas[:1], boxes[:1], labels[:1]))
    for loss in FUSED_LOSSES:
        torch.testing.assert_close(losses[f'{name}.{loss}'], alone[f'{name}.{loss}'], msg=loss)


def test_a_pass_without_any_sample_has_zero_losses(cmt_test_data):
    head = head_cfg(modality_passes=PASSES).train()
    bev, img = features()
    boxes, labels = gts(cmt_test_data)
    img_metas = cmt_test_data['make_img_metas'](2)
    for meta in img_metas:
        meta['dropped_modalities'] = ['image']
    losses = head.loss(boxes, labels, head([bev], [img], img_metas, boxes, labels))
    assert losses['camera.num_samples'] == 0 and losses['lidar.num_samples'] == 2
    assert all(losses[f'camera.{loss}'] == 0 for loss in FUSED_LOSSES)
    assert all(losses[loss] > 0 and losses[f'lidar.{loss}'] > 0 for loss in FUSED_LOSSES)
    sum(value for key, value in losses.items() if 'loss' in key).backward()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters() if p.grad is not None)


def test_single_modality_transformers_are_the_fusion_transformer_given_one_modality():
    """``CmtLidarTransformer`` / ``CmtImageTransformer`` are registry aliases: the head's passes choose the keys."""
    fusion = head_cfg().transformer.eval()
    lidar = head_cfg('CmtLidarHead', 'CmtLidarTransformer').transformer.eval()
    camera = head_cfg('CmtImageHead', 'CmtImageTransformer').transformer.eval()
    assert type(lidar) is type(camera) is type(fusion) is CmtTransformer
    assert list(lidar.state_dict()) == list(camera.state_dict()) == list(fusion.state_dict())
    channels = fusion.embed_dims
    bev, img = torch.randn(2, channels, 3, 4), torch.randn(4, channels, 2, 5)
    query, bev_pos, rv_pos = torch.randn(2, 7, channels), torch.randn(12, channels), torch.randn(4, 2, 5, channels)
    with torch.no_grad():
        assert fusion(bev, img, query, bev_pos, rv_pos)[1].shape == (12 + 2 * 2 * 5, 2, channels)
        assert fusion(bev, None, query, bev_pos, None)[1].shape == (12, 2, channels)
        assert fusion(None, img, query, None, rv_pos)[1].shape == (20, 2, channels)
        with pytest.raises(ValueError, match='needs BEV features'):
            fusion(None, None, query, None, None)


def test_bad_modality_passes_raise():
    for passes, error, message in (
            (('fused', 'radar'), ValueError, r"unknown modality_passes \['radar'\]"),
            (('fused', 'lidar', 'lidar'), ValueError, 'names a pass twice'),
            (('lidar', 'camera'), ValueError, "lacks 'fused'"),
            ('fused', TypeError, 'a list or tuple'),
    ):
        with pytest.raises(error, match=message):
            head_cfg(modality_passes=passes)
    with pytest.raises(ValueError, match=r"CmtHead\(modalities=\('lidar',\)\) decodes BEV tokens only"):
        head_cfg('CmtLidarHead', 'CmtLidarTransformer', modality_passes=('fused', 'camera'))
    with pytest.raises(ValueError, match=r"CmtHead\(modalities=\('camera',\)\) decodes camera tokens only"):
        head_cfg('CmtImageHead', 'CmtImageTransformer', modality_passes=('fused', 'camera'))


def test_aqr_config_trains_with_passes_and_demo_config_only_adds_its_camera_options(cmt_test_data):
    cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs')
    default_keys = list(build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
                        .state_dict())
    cfg.model.pts_bbox_head.modality_passes = PASSES
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    assert list(model.state_dict()) == default_keys
    data = cmt_test_data['random_batch']((3, 2))
    data['img_metas'][1]['dropped_modalities'] = ['points']
    outputs = cmt_test_data['train_step'](model, data)
    log_vars = outputs['log_vars']
    assert torch.isfinite(outputs['loss'])
    assert log_vars['lidar.num_samples'] == 1 and log_vars['camera.num_samples'] == 2
    assert {'loss_cls', 'lidar.loss_cls', 'camera.loss_cls', 'camera.d4.dn_loss_bbox'} <= set(log_vars)
    head = model.pts_bbox_head
    assert head.attention_bias_generator.bias_scale.grad.abs().sum() > 0
    assert head.aqr_weight_generator.weight_head.weight.grad.abs().sum() > 0

    demo = Config.fromfile(os.path.join(REPO_ROOT, 'configs', 'demo', 'cmt_aqr_synthetic_tiny_passes.py'))
    base = Config.fromfile(os.path.join(REPO_ROOT, 'configs', 'demo', 'cmt_aqr_synthetic_tiny.py'))
    head = demo.model.pts_bbox_head
    added = {key: head.pop(key) for key in ('modality_passes', 'pass_decoders', 'lidar_free_pass',
                                            'camera_window_prior', 'image_aux_config', 'camera_depth_position')}
    assert added == dict(modality_passes=('fused', 'camera'), pass_decoders='separate', lidar_free_pass='camera',
                         camera_window_prior=dict(window_size=5, bias=4.0), image_aux_config=dict(type='ImageAuxHead'),
                         camera_depth_position=True)
    assert head.aqr_config.pop('query_loss_weight') == 1.0
    assert demo.model == base.model
    masks = [index for index, step in enumerate(demo.data.train.pipeline) if step.type == 'ModalMask3D']
    assert [demo.data.train.pipeline[index] for index in masks] == [
        dict(type='ModalMask3D', mode='train', image_drop_prob=0.0, points_drop_prob=0.0)]
    demo.data.train.pipeline[masks[0]] = dict(type='ModalMask3D', mode='train')
    assert demo.data == base.data, 'the passes demo differs from the demo in its head and modality drop only'


def test_separate_decoders_are_their_passes_own(cmt_test_data):
    """``pass_decoders='separate'``: the camera pass trains its own transformer and task heads, the fused pass
    the head's; nothing else is added."""
    default = head_cfg(modality_passes=('fused', 'camera'))
    head = head_cfg(modality_passes=('fused', 'camera'), pass_decoders='separate').train()
    own = {key for key in head.state_dict() if key.startswith('separate_decoders.camera.')}
    assert set(head.state_dict()) - own == set(default.state_dict())
    assert {key.split('.')[2] for key in own} == {'transformer', 'task_heads'}
    assert len(own) == sum(1 for key in default.state_dict() if key.startswith(('transformer.', 'task_heads.')))
    for task_head in head.separate_decoders['camera']['task_heads']:  # init_weights reached them (focal prior)
        assert torch.allclose(task_head.cls_logits[-1].bias, torch.full_like(task_head.cls_logits[-1].bias, -2.19))
    bev, img = features()
    boxes, labels = gts(cmt_test_data)
    losses = head.loss(boxes, labels, head([bev], [img], cmt_test_data['make_img_metas'](2), boxes, labels))
    camera_total = sum(value for key, value in losses.items() if key.startswith('camera.') and 'loss' in key)
    fused_total = sum(value for key, value in losses.items() if not key.startswith('camera.'))
    for total, trained, untouched in ((camera_total, head.separate_decoders['camera'], head.transformer),
                                      (fused_total, head.transformer, head.separate_decoders['camera'])):
        trained_grads = torch.autograd.grad(total, list(trained.parameters()), retain_graph=True, allow_unused=True)
        untouched_grads = torch.autograd.grad(total, list(untouched.parameters()), retain_graph=True,
                                              allow_unused=True)
        assert any(grad is not None and grad.abs().sum() > 0 for grad in trained_grads)
        assert all(grad is None for grad in untouched_grads)


@pytest.mark.parametrize('pass_decoders', ['shared', 'separate'])
def test_lidar_free_pass_decodes_the_samples_without_points(pass_decoders, cmt_test_data):
    head = head_cfg(modality_passes=('fused', 'camera'), pass_decoders=pass_decoders,
                    lidar_free_pass='camera', **AQR).eval()
    assert head.needs_points_in_metas and not head_cfg(modality_passes=('fused', 'camera')).needs_points_in_metas
    bev, img = features()

    def cls_logits(*num_points):
        img_metas = [dict(meta, lidar_points=torch.zeros(count, 3))
                     for meta, count in zip(cmt_test_data['make_img_metas'](2), num_points)]
        with torch.no_grad():
            preds = head([bev], [img], img_metas)
        return torch.cat([task[0]['cls_logits'] for task in preds], dim=-1)  # [L, bs, Q, classes]

    fused, camera, mixed = cls_logits(5, 7), cls_logits(0, 0), cls_logits(0, 7)
    assert not torch.allclose(camera, fused)
    torch.testing.assert_close(mixed[:, 0], camera[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(mixed[:, 1], fused[:, 1], rtol=0, atol=0)
    with pytest.raises(KeyError, match="no 'lidar_points'"):
        head([bev], [img], cmt_test_data['make_img_metas'](2))


def test_camera_free_pass_decodes_the_samples_whose_cameras_are_blank_and_lidar_free_pass_the_others(
        cmt_test_data):
    head = head_cfg(modality_passes=PASSES, pass_decoders='separate', lidar_free_pass='camera',
                    camera_free_pass='lidar', **AQR).eval()
    assert head.needs_blank_views_in_metas and not head_cfg(modality_passes=PASSES).needs_blank_views_in_metas
    bev, img = features()
    num_views = img.size(0) // 2

    def cls_logits(num_points, blank):
        img_metas = [dict(meta, lidar_points=torch.zeros(count, 3), blank_views=torch.full((num_views, ), flag))
                     for meta, count, flag in zip(cmt_test_data['make_img_metas'](2), num_points, blank)]
        with torch.no_grad():
            preds = head([bev], [img], img_metas)
        return torch.cat([task[0]['cls_logits'] for task in preds], dim=-1)  # [L, bs, Q, classes]

    fused = cls_logits((5, 7), (False, False))
    lidar = cls_logits((5, 7), (True, True))
    camera = cls_logits((0, 0), (False, False))
    assert not torch.allclose(lidar, fused) and not torch.allclose(lidar, camera)
    # sample 0 has no points, sample 1 blank cameras: each goes to the pass of the sensor it still has
    mixed = cls_logits((0, 7), (False, True))
    torch.testing.assert_close(mixed[:, 0], camera[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(mixed[:, 1], lidar[:, 1], rtol=0, atol=0)
    # one blank view of several is not a camera-free frame; a frame with neither sensor keeps the fused pass
    img_metas = cmt_test_data['make_img_metas'](2)
    partly = [dict(meta, lidar_points=torch.zeros(count, 3), blank_views=torch.arange(num_views) == 0)
              for meta, count in zip(img_metas, (5, 0))]
    partly[1]['blank_views'] = torch.ones(num_views, dtype=torch.bool)
    with torch.no_grad():
        preds = torch.cat([task[0]['cls_logits'] for task in head([bev], [img], partly)], dim=-1)
    torch.testing.assert_close(preds, fused, rtol=0, atol=0)
    with pytest.raises(KeyError, match="no 'blank_views'"):
        head([bev], [img], [dict(meta, lidar_points=torch.zeros(5, 3)) for meta in img_metas])


def test_detector_tells_the_head_which_camera_images_are_blank(cmt_test_data, monkeypatch):
    cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs')
    cfg.model.pts_bbox_head.update(modality_passes=PASSES, camera_free_pass='lidar')
    model = build_model(cfg.model, test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    data = cmt_test_data['random_batch']((2, 1))
    img = data['img'].clone()
    img[1] = 0.0  # the second sample's cameras are black (after normalisation: one value per channel)
    img[1, :, 1] = -1.5
    seen = []
    forward = model.pts_bbox_head.forward
    monkeypatch.setattr(model.pts_bbox_head, 'forward',
                        lambda pts, imgs, img_metas, *args: seen.append(img_metas) or forward(pts, imgs, img_metas))
    model.eval()
    with torch.no_grad():
        results = model.forward(return_loss=False, img_metas=[data['img_metas']], points=[data['points']],
                                img=[img])
    assert len(results) == 2 and 'blank_views' not in data['img_metas'][0], 'the caller\'s metas unchanged'
    assert [meta['blank_views'] for meta in seen[0]] == [[False] * img.size(1), [True] * img.size(1)], 'host lists'
    with pytest.raises(ValueError, match='no images were given'):
        model.simple_test(data['points'], data['img_metas'], img=None)


def test_blank_camera_views_are_the_views_whose_unpadded_pixels_are_all_equal():
    img = torch.rand(2, 3, 3, 8, 12)
    img[0, 1] = -2.1  # a black frame after normalisation: one value per channel
    img[0, 1, 1] = 0.3
    img[1, 2, :, :6, :10] = 0.5  # blank inside img_shape; the padding (zeros, or anything) does not count
    img[1, 0, :, :6, :10] = 0.5
    img[1, 0, 0, 5, 9] = 0.6  # one pixel differs
    img_metas = [dict(img_shape=[(8, 12, 3)] * 3), dict(img_shape=[(6, 10, 3)] * 3)]
    blank = blank_camera_views(img, img_metas)
    assert blank.tolist() == [[False, True, False], [False, False, True]]
    assert blank_camera_views(img.flatten(0, 1), img_metas).tolist() == blank.tolist()
    assert blank_camera_views(img, [dict(img_shape=(6, 10, 3))] * 2)[1].tolist() == [False, False, True]


def test_blank_camera_views_trace_on_fake_cuda():
    """The detector calls it on the GPU's images: every tensor it makes stays on their device."""
    img_metas = [dict(img_shape=[(8, 12, 3)] * 3), dict(img_shape=[(6, 10, 3)] * 3)]
    with FakeTensorMode(allow_non_fake_inputs=True):
        blank = blank_camera_views(torch.zeros(2, 3, 3, 8, 12, device='cuda'), img_metas)
        assert (blank.shape, blank.dtype, blank.device.type) == ((2, 3), torch.bool, 'cuda')


def test_bad_pass_options_raise():
    for options, message in (
            (dict(pass_decoders='own'), "pass_decoders must be one of \\('shared', 'separate'\\)"),
            (dict(pass_decoders='separate'), 'has none'),
            (dict(modality_passes=('fused', 'camera'), lidar_free_pass='lidar'), 'one of the trained'),
            (dict(modality_passes=('fused', 'lidar'), lidar_free_pass='lidar'), 'needs a pass without them'),
            (dict(modality_passes=('fused', 'camera'), camera_free_pass='lidar'),
             "camera_free_pass='lidar' must be one of the trained"),
            (dict(modality_passes=('fused', 'camera'), camera_free_pass='camera'),
             "camera_free_pass='camera' decodes camera tokens"),
            (dict(modality_passes=('fused', 'lidar'), camera_window_prior=dict(window_size=3, bias=4.0)),
             "none of modality_passes \\('fused', 'lidar'\\) does; add 'camera'"),
    ):
        with pytest.raises(ValueError, match=message):
            head_cfg(**options)
