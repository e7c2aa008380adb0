"""diagnostics/model_benchmark.py: B runs with A's weights, the tiny configs shrink every grid, ``freeze`` and
``cfg_options`` reach both models, and the tables name the settings a mode ran with."""
import pytest
import torch

from projects.mmdet3d_plugin.diagnostics.model_benchmark import (SHAPES, TINY, ModelBenchmarkOptions, build_detector,
                                                          build_pair, load_config, make_batch, make_run,
                                                          share_weights, shrink_config)
from projects.mmdet3d_plugin.diagnostics.model_benchmark_tables import markdown_tables
from projects.mmdet3d_plugin.diagnostics.part_timer import PartTimer

DEMO_PAIR = ('configs/demo/cmt_synthetic_tiny.py', 'configs/demo/cmt_aqr_synthetic_tiny.py')
R50_PAIR = SHAPES['r50']


def _tiny(**options) -> ModelBenchmarkOptions:
    return ModelBenchmarkOptions(tiny=True, **options).resolved()


def test_b_runs_with_the_weights_of_a():
    args = _tiny()
    cfg_a, cfg_b = (load_config(path, args) for path in R50_PAIR)
    model_a, model_b = build_detector(cfg_a, seed=1), build_detector(cfg_b, seed=2)
    before = {name: value.clone() for name, value in model_b.state_dict().items()}
    state_a = model_a.state_dict()
    assert any(not torch.equal(state_a[name], before[name]) for name in state_a)  # other seed, other weights

    shared = share_weights(model_a, model_b)

    assert sorted(shared) == sorted(state_a)  # CMT-AQR has every tensor of CMT
    after = model_b.state_dict()
    for name in shared:
        assert torch.equal(after[name], state_a[name]), name
    own = [name for name in after if name not in state_a]
    assert own and all(name.startswith(('pts_bbox_head.aqr_weight_generator.',
                                        'pts_bbox_head.attention_bias_generator.')) for name in own)
    for name in own:
        assert torch.equal(after[name], before[name]), name


def test_tiny_shrinks_the_grids_and_refuses_a_partial_block():
    args = _tiny()
    cfg = load_config(R50_PAIR[0], args)
    grid = round(2 * TINY['half_range'] / 0.1)
    tiny_range = [-9.6, -9.6, -5.0, 9.6, 9.6, 3.0]
    assert cfg.point_cloud_range == cfg.model.pts_voxel_layer.point_cloud_range == tiny_range
    assert cfg.model.pts_bbox_head.bbox_coder.pc_range == cfg.model.train_cfg.pts.assigner.pc_range == tiny_range
    assert cfg.model.pts_middle_encoder.sparse_shape == [41, grid, grid]
    assert cfg.model.train_cfg.pts.grid_size == cfg.model.test_cfg.pts.grid_size == [grid, grid, 40]
    assert tuple(cfg.ida_aug_conf['final_dim']) == (64, 160) and cfg.model.pts_bbox_head.num_query == 60
    pillars = load_config(DEMO_PAIR[0], args)
    assert pillars.model.pts_middle_encoder.output_shape == [48, 48]  # 19.2 m of 0.4 m pillars
    with pytest.raises(ValueError, match='multiple of 16 voxels'):
        shrink_config(cfg, half_range=10.0)  # 200 voxels of 0.1 m
    with pytest.raises(ValueError, match='multiples of 32'):
        shrink_config(cfg, image_size=(64, 150))


def test_freeze_keeps_a_module_out_of_the_training_step():
    args = _tiny(configs=list(DEMO_PAIR), freeze=['img_backbone'])
    models, cfgs, _ = build_pair(DEMO_PAIR, args)
    batch = make_batch(cfgs[0], args)
    for model, cfg in zip(models, cfgs):
        before = {name: value.detach().clone() for name, value in model.named_parameters()}
        make_run(model, cfg, 'train', batch, PartTimer(torch.device('cpu')))()
        for name, value in model.img_backbone.named_parameters(prefix='img_backbone'):
            assert not value.requires_grad and value.grad is None and torch.equal(value, before[name]), name
        assert any(not torch.equal(value, before[name]) for name, value in model.img_neck.named_parameters(
            prefix='img_neck'))


def test_freeze_refuses_an_unknown_module():
    args = _tiny(configs=list(DEMO_PAIR), freeze=['image_backbone'])
    with pytest.raises(ValueError, match=r"no submodule 'image_backbone' \(it has: .*img_backbone"):
        build_pair(DEMO_PAIR, args)


def test_cfg_options_reach_both_models_and_the_table():
    args = _tiny(configs=list(DEMO_PAIR), cfg_options={'model.img_backbone.frozen_stages': 1,
                                                       'model.img_backbone.norm_eval': True})
    models, cfgs, _ = build_pair(DEMO_PAIR, args)
    for model in models:
        assert model.img_backbone.frozen_stages == 1 and model.img_backbone.norm_eval
    result = dict(shape='custom', mode='train', frozen=[], cfg_options=dict(args.cfg_options), configs=list(DEMO_PAIR),
                  ratio=dict(median=1.0, min=1.0, max=1.0), median_ms=dict(A=1.0, B=1.0),
                  peak_mib=dict(A=None, B=None), times_ms=dict(A=[1.0], B=[1.0]), part_rows=[], parts_ms=[{}, {}],
                  attention=[{}, {}])
    assert '| custom | train (model.img_backbone.frozen_stages=1; model.img_backbone.norm_eval=True) |' in (
        markdown_tables([result]))


@pytest.mark.parametrize('option', [None, 'bfloat16'])
def test_attention_dtype_reaches_every_cross_attention_of_both_models_and_each_row_states_it(option):
    """``attention_dtype`` sets both models' cross-attentions (None: the configs' ``'auto'``, float32 on the CPU);
    a run records the kernel and dtype of each call, and the summary row states them per model."""
    from projects.mmdet3d_plugin.attention.dispatch import recorded_backends
    from projects.mmdet3d_plugin.models.utils.petr_attention import BiasedMultiheadAttention
    args = _tiny(configs=list(DEMO_PAIR), attention_dtype=option)
    models, cfgs, _ = build_pair(DEMO_PAIR, args)
    layers = cfgs[0].model.pts_bbox_head.transformer.decoder.num_layers
    dtype = option or 'float32'
    for model in models:
        options = [m.attention_dtype for m in model.modules() if isinstance(m, BiasedMultiheadAttention)]
        assert options == [option or 'auto'] * layers
    batch = make_batch(cfgs[0], args)
    with recorded_backends() as record:
        make_run(models[0], cfgs[0], 'inference', batch, PartTimer(torch.device('cpu')))()
    assert record == {('sdpa', dtype): layers}  # CMT: no bias
    result = dict(shape='custom', mode='inference', frozen=[], configs=list(DEMO_PAIR),
                  ratio=dict(median=1.0, min=1.0, max=1.0), median_ms=dict(A=1.0, B=1.0),
                  peak_mib=dict(A=None, B=None), times_ms=dict(A=[1.0], B=[1.0]), part_rows=[], parts_ms=[{}, {}],
                  attention=[{f'sdpa {dtype}': float(layers)}, {f'segment {dtype}': 2.0, f'sdpa {dtype}': 1.0}])
    assert f'| custom | inference | sdpa {dtype} ×{layers} | segment {dtype} ×2, sdpa {dtype} ×1 | 1.00 |' in (
        markdown_tables([result]))


def test_freed_memory_is_kept_only_when_asked_and_only_on_the_cpu(monkeypatch):
    """``--keep-freed-memory`` changes the timing process's allocator on the CPU; by default (and on CUDA) the host
    allocator is left as it comes, so the ratios stay comparable with the earlier measurements."""
    from projects.mmdet3d_plugin.diagnostics import model_benchmark
    calls = []
    monkeypatch.setattr(model_benchmark, 'keep_freed_memory', lambda: calls.append(True) or True)
    assert model_benchmark._host_allocator(ModelBenchmarkOptions()) == 'host malloc as it comes' and not calls
    assert model_benchmark._host_allocator(ModelBenchmarkOptions(keep_freed_memory=True, device='cuda')) == \
        'host malloc as it comes' and not calls
    assert model_benchmark._host_allocator(ModelBenchmarkOptions(keep_freed_memory=True)) == \
        'freed host memory kept (glibc mallopt)' and calls == [True]
    monkeypatch.setattr(model_benchmark, 'keep_freed_memory', lambda: False)
    assert model_benchmark._host_allocator(ModelBenchmarkOptions(keep_freed_memory=True)) == \
        'host malloc as it comes (not glibc)'


def test_the_loss_scaler_of_mixed_precision_leaves_the_update_unchanged():
    """The scaled loss's gradients are unscaled before clipping and the step: one training step of the same model
    and batch moves every parameter as the fp32 step does (the scale is a power of two; SGD, whose update, unlike
    Adam's, grows with a gradient left scaled)."""
    args = _tiny(configs=list(DEMO_PAIR))
    models, cfgs, _ = build_pair(DEMO_PAIR[:1] * 2, args)
    cfgs[0].optimizer = dict(type='SGD', lr=0.01)
    batch = make_batch(cfgs[0], args)
    for model, mixed in zip(models, (False, True)):
        torch.manual_seed(0)
        make_run(model, cfgs[0], 'train', batch, PartTimer(torch.device('cpu')), mixed_precision=mixed)()
    moved = dict(models[0].named_parameters())
    for name, value in models[1].named_parameters():
        torch.testing.assert_close(value, moved[name], rtol=1e-5, atol=1e-6, msg=name)


def test_mixed_precision_is_the_configs_fp16_hook_and_needs_cuda():
    from projects.mmdet3d_plugin.mmcv_custom.fp16_optimizer_hook import enable_config_fp16
    args = _tiny()
    cfg = load_config(R50_PAIR[1], args)
    model = build_detector(cfg, seed=0)
    enable_config_fp16(model, cfg.optimizer_config)
    assert cfg.optimizer_config.custom_fp16 == dict(pts_voxel_encoder=False, pts_middle_encoder=False,
                                                    pts_bbox_head=False)
    assert model.fp16_enabled and model.img_neck.fp16_enabled and model.pts_neck.fp16_enabled
    assert not (model.pts_bbox_head.fp16_enabled or model.pts_voxel_encoder.fp16_enabled
                or model.pts_middle_encoder.fp16_enabled)
    with pytest.raises(ValueError, match='trains without mixed precision'):
        enable_config_fp16(model, dict(type='OptimizerHook'))
    with pytest.raises(KeyError, match=r"custom_fp16 names \['pts_head'\]"):
        enable_config_fp16(model, dict(type='CustomFp16OptimizerHook', custom_fp16=dict(pts_head=False)))
    with pytest.raises(ValueError, match='needs CUDA'):
        ModelBenchmarkOptions(mixed_precision=True).resolved()
