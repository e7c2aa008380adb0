"""The benchmarks' ``--tiled-bias-launch``: parsed by the tools' parsers, applied before anything runs."""
import pytest

from projects.mmdet3d_plugin.attention.backends.tiled_bias import launch
from tools import benchmark_attention, benchmark_model
from tools.cli.tiled_bias_launch import apply_tiled_bias_launches


def test_the_option_reaches_the_launch_table(monkeypatch):
    monkeypatch.setattr(launch, 'LAUNCH', dict(launch.LAUNCH))
    for tool in (benchmark_attention, benchmark_model):
        args = tool.parse_args(['--tiled-bias-launch', 'forward=64x32x4', 'query_grad=16x32x2'])
        assert args.tiled_bias_launch == ['forward=64x32x4', 'query_grad=16x32x2']
        assert tool.parse_args([]).tiled_bias_launch is None
    apply_tiled_bias_launches(['forward=64x32x4', 'query_grad=16x32x2'])
    assert launch.LAUNCH['forward', 'half'] == (64, 32, 4) and launch.LAUNCH['query_grad', 'float32'] == (16, 32, 2)
    before = dict(launch.LAUNCH)
    with pytest.raises(ValueError, match='powers of two'):
        apply_tiled_bias_launches(['key_grad=32x32x4', 'forward=48x32x4'])
    assert launch.LAUNCH == before, 'a malformed launch must leave every launch as it was'
    apply_tiled_bias_launches(None)
    assert launch.LAUNCH == before
