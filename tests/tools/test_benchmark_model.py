"""tools/benchmark_model.py on tiny shapes: every table row is there and filled, and B runs with A's weights.

Correctness only: nothing here asserts a speed. The run uses the demo pair
(``configs/demo/cmt_synthetic_tiny.py`` vs its AQR twin, ``--tiny``): the
R50 pair's training step takes seconds per run on two CPU cores; its configs
are built and checked here without running them.
"""
import json

import pytest
import torch

from projects.mmdet3d_plugin.apis.model_benchmark import PartTimer, build_detector, share_weights, shrink_config
from tools import benchmark_model

DEMO_PAIR = ('configs/demo/cmt_synthetic_tiny.py', 'configs/demo/cmt_aqr_synthetic_tiny.py')
R50_PAIR = benchmark_model.SHAPES['r50']
AQR_ROWS = ('  AQR weight generator', '  AQR bias generator')
MODULE_ROWS = ('img_backbone', 'img_neck', 'pts_voxel_layer', 'pts_voxel_encoder', 'pts_middle_encoder',
               'pts_backbone', 'pts_neck', 'head', '  transformer')
TRAIN_ONLY_ROWS = ('loss (matching included)', '  assigner (Hungarian matching)') + benchmark_model.TRAIN_ROWS
PAIRS = 2


def _table_label(row: str) -> str:
    """A row's name as the table prints it (one '· ' per level of nesting)."""
    return '· ' * ((len(row) - len(row.lstrip())) // 2) + row.lstrip()


@pytest.mark.slow(seconds=25)
def test_tiny_benchmark_has_every_row(tmp_path, capsys):
    out = tmp_path / 'bench.json'
    report = benchmark_model.main(['--configs', *DEMO_PAIR, '--tiny', '--pairs', str(PAIRS), '--warmup', '0',
                                   '--out', str(out)])
    text = capsys.readouterr().out
    assert json.loads(out.read_text())['results'] == json.loads(json.dumps(report['results']))
    num_layers = benchmark_model.load_config(DEMO_PAIR[0], benchmark_model.parse_args(['--tiny'])) \
        .model.pts_bbox_head.transformer.decoder.num_layers
    attention_rows = tuple(f'    decoder layer {i} {kind}' for i in range(num_layers)
                           for kind in ('self_attn', 'cross_attn'))
    results = {result['mode']: result for result in report['results']}
    assert sorted(results) == ['inference', 'train']
    progress = [line for line in text.splitlines() if line.startswith('  pair ')]  # one line per pair and mode
    assert [line.split(':')[0] for line in progress] == [f'  pair {i + 1}/{PAIRS}' for i in range(PAIRS)] * 2
    for mode, result in results.items():
        ratio = result['ratio']
        times_a, times_b = result['times_ms']['A'], result['times_ms']['B']
        assert len(times_a) == len(times_b) == PAIRS and min(times_a + times_b) > 0
        assert ratio['pairs'] == pytest.approx([b / a for a, b in zip(times_a, times_b)])
        assert 0 < ratio['min'] <= ratio['median'] <= ratio['max']
        assert result['peak_mib']['A'] > 0 and result['peak_mib']['B'] > 0
        summary = [line for line in text.splitlines() if line.startswith(f'| custom | {mode} | ')]
        assert len(summary) == 1
        assert f'| {ratio["median"]:.3f} [{ratio["min"]:.3f}, {ratio["max"]:.3f}] |' in summary[0]
        assert summary[0].endswith(f'| {result["peak_mib"]["A"]:.0f} MiB | {result["peak_mib"]["B"]:.0f} MiB |')

        a_parts, b_parts = result['parts_ms']
        expected = MODULE_ROWS + attention_rows + (TRAIN_ONLY_ROWS if mode == 'train' else ())
        for row in expected:
            assert a_parts[row] > 0 and b_parts[row] > 0, (mode, row)
            assert f'| {_table_label(row)} | ' in text
        for row in AQR_ROWS:  # CMT has no AQR: its cell is empty
            assert row not in a_parts and b_parts[row] > 0, (mode, row)
            assert f'| {_table_label(row)} | — | ' in text
        if mode == 'inference':
            assert not set(TRAIN_ONLY_ROWS) & (set(a_parts) | set(b_parts))
        rows = result['part_rows']
        assert sorted(rows) == sorted(expected + AQR_ROWS + (benchmark_model.TOTAL_ROW, ))
        assert rows.index('head') < rows.index(AQR_ROWS[0]) < rows.index('  transformer') < rows.index(
            attention_rows[0])
        for side, times in zip(result['parts_ms'], (times_a, times_b)):
            assert side[benchmark_model.TOTAL_ROW] == pytest.approx(sum(times) / PAIRS)
            # every part runs inside the run; nested parts inside their parent
            assert max(side.values()) == side[benchmark_model.TOTAL_ROW]
            assert side['  transformer'] <= side['head']
            assert sum(side[row] for row in attention_rows) <= side['  transformer']
        if mode == 'train':
            for side in result['parts_ms']:
                assert side['  assigner (Hungarian matching)'] <= side['loss (matching included)']
                assert sum(side[row] for row in benchmark_model.TRAIN_ROWS) <= side[benchmark_model.TOTAL_ROW]


def test_b_runs_with_the_weights_of_a():
    args = benchmark_model.parse_args(['--tiny'])
    cfg_a, cfg_b = (benchmark_model.load_config(path, args) for path in R50_PAIR)
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
    args = benchmark_model.parse_args(['--tiny'])
    cfg = benchmark_model.load_config(R50_PAIR[0], args)
    grid = round(2 * benchmark_model.TINY['half_range'] / 0.1)
    tiny_range = [-9.6, -9.6, -5.0, 9.6, 9.6, 3.0]
    assert cfg.point_cloud_range == cfg.model.pts_voxel_layer.point_cloud_range == tiny_range
    assert cfg.model.pts_bbox_head.bbox_coder.pc_range == cfg.model.train_cfg.pts.assigner.pc_range == tiny_range
    assert cfg.model.pts_middle_encoder.sparse_shape == [41, grid, grid]
    assert cfg.model.train_cfg.pts.grid_size == cfg.model.test_cfg.pts.grid_size == [grid, grid, 40]
    assert tuple(cfg.ida_aug_conf['final_dim']) == (64, 160) and cfg.model.pts_bbox_head.num_query == 60
    pillars = benchmark_model.load_config(DEMO_PAIR[0], args)
    assert pillars.model.pts_middle_encoder.output_shape == [48, 48]  # 19.2 m of 0.4 m pillars
    with pytest.raises(ValueError, match='multiple of 16 voxels'):
        shrink_config(cfg, half_range=10.0)  # 200 voxels of 0.1 m
    with pytest.raises(ValueError, match='multiples of 32'):
        shrink_config(cfg, image_size=(64, 150))


def test_freeze_keeps_a_module_out_of_the_training_step():
    args = benchmark_model.parse_args(['--configs', *DEMO_PAIR, '--tiny', '--freeze', 'img_backbone'])
    models, cfgs, _ = benchmark_model.build_pair(DEMO_PAIR, args)
    batch = benchmark_model.make_batch(cfgs[0], args)
    for model, cfg in zip(models, cfgs):
        before = {name: value.detach().clone() for name, value in model.named_parameters()}
        benchmark_model.make_run(model, cfg, 'train', batch, PartTimer(torch.device('cpu')))()
        for name, value in model.img_backbone.named_parameters(prefix='img_backbone'):
            assert not value.requires_grad and value.grad is None and torch.equal(value, before[name]), name
        assert any(not torch.equal(value, before[name]) for name, value in model.img_neck.named_parameters(
            prefix='img_neck'))


def test_freeze_refuses_an_unknown_module():
    args = benchmark_model.parse_args(['--configs', *DEMO_PAIR, '--tiny', '--freeze', 'image_backbone'])
    with pytest.raises(ValueError, match=r"no submodule 'image_backbone' \(it has: .*img_backbone"):
        benchmark_model.build_pair(DEMO_PAIR, args)


def test_cfg_options_reach_both_models_and_the_table():
    args = benchmark_model.parse_args(['--configs', *DEMO_PAIR, '--tiny', '--cfg-options',
                                       'model.pts_bbox_head.scalar=3', 'model.img_backbone.norm_eval=True'])
    models, cfgs, _ = benchmark_model.build_pair(DEMO_PAIR, args)
    for model in models:
        assert model.pts_bbox_head.scalar == 3 and model.img_backbone.norm_eval
    result = dict(shape='custom', mode='train', frozen=[], cfg_options=dict(args.cfg_options), configs=list(DEMO_PAIR),
                  ratio=dict(median=1.0, min=1.0, max=1.0), median_ms=dict(A=1.0, B=1.0),
                  peak_mib=dict(A=None, B=None), times_ms=dict(A=[1.0], B=[1.0]), part_rows=[], parts_ms=[{}, {}])
    assert '| custom | train (model.pts_bbox_head.scalar=3; model.img_backbone.norm_eval=True) |' in (
        benchmark_model.markdown_tables([result]))
