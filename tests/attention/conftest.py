"""Small random attention problems with AQR-like biases, for comparing every backend with ``math``.

Keys: a 5 x 7 BEV grid (35 keys), then a 2-view 4 x 6 camera grid (48 keys),
then 2 keys on no grid: K = 85, not a multiple of 8. The global bias has two
segments (35 BEV keys, 50 other keys). Window centres include grid corners and
out-of-view cells (windows clipped at the borders) and camera-invisible queries.
"""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from projects.mmdet3d_plugin.attention import (AttentionBias, DenseBias, KeyGrid, LowRankBias, SegmentBias,
                                               WindowBias)

BEV = KeyGrid(0, 1, 5, 7)
CAMERA = KeyGrid(35, 2, 4, 6)
NUM_KEYS = 85
SEGMENTS = (35, 50)


def make_qkv(bs=2, heads=3, num_queries=6, num_keys=NUM_KEYS, dim=8, dtype=torch.float32, requires_grad=True,
             scale_scores=1.0):
    """Random q, k, v ``[bs, heads, L, dim]``; ``scale_scores`` sharpens the softmax."""
    q = torch.randn(bs, heads, num_queries, dim) * scale_scores
    k = torch.randn(bs, heads, num_keys, dim)
    v = torch.randn(bs, heads, num_keys, dim)
    return [t.to(dtype).requires_grad_(requires_grad) for t in (q, k, v)]


def _centres(bs, num_queries, grid):
    """Random centres with the first queries on the grid's corners (clipped windows)."""
    centres = torch.stack([torch.randint(0, grid.planes, (bs, num_queries)),
                           torch.randint(0, grid.height, (bs, num_queries)),
                           torch.randint(0, grid.width, (bs, num_queries))], -1)
    corners = torch.tensor([[0, 0, 0], [grid.planes - 1, grid.height - 1, grid.width - 1],
                            [0, grid.height - 1, 0]])[:num_queries]
    centres[:, :len(corners)] = corners
    return centres


def make_window(bs, bias_heads, num_queries, window_sizes=(5, 3), requires_grad=True, amplitude_scale=1.0):
    """A BEV + camera :class:`WindowBias` and its differentiable amplitudes."""
    amplitudes = [(torch.randn(bs, bias_heads, num_queries) * amplitude_scale).requires_grad_(requires_grad)
                  for _ in range(2)]
    bev_valid = torch.ones(bs, num_queries, dtype=torch.bool)
    camera_valid = torch.rand(bs, num_queries) > 0.4
    camera_valid[:, -1] = False
    window = WindowBias([BEV, CAMERA], [_centres(bs, num_queries, BEV), _centres(bs, num_queries, CAMERA)],
                        [bev_valid, camera_valid], amplitudes, list(window_sizes))
    return window, amplitudes


def make_bias(kind, bs=2, heads=3, num_queries=6, bias_heads=1, requires_grad=True):
    """An :class:`AttentionBias` of the given kind and the tensors it is differentiable in.

    Kinds: ``segment``, ``window``, ``segment+window``, ``lowrank``, ``segment+lowrank``, ``dense``.
    """
    parts, leaves = [], []
    if 'segment' in kind:
        values = torch.randn(bs, bias_heads, num_queries, len(SEGMENTS)).requires_grad_(requires_grad)
        parts.append(SegmentBias(values, SEGMENTS))
        leaves.append(values)
    if 'window' in kind:
        window, amplitudes = make_window(bs, bias_heads, num_queries, requires_grad=requires_grad)
        parts.append(window)
        leaves += amplitudes
    if 'lowrank' in kind:
        query_factor = torch.randn(bs, bias_heads, num_queries, 3).requires_grad_(requires_grad)
        key_factor = torch.randn(1, NUM_KEYS, 3).requires_grad_(requires_grad)
        parts.append(LowRankBias(query_factor, key_factor))
        leaves += [query_factor, key_factor]
    if kind == 'dense':
        values = torch.randn(bs, 1, num_queries, NUM_KEYS).requires_grad_(requires_grad)
        parts.append(DenseBias(values))
        leaves.append(values)
    assert parts, f'unknown bias kind {kind}'
    return AttentionBias(parts, NUM_KEYS), leaves


def relative_error(actual, expected):
    """``max |actual - expected| / max |expected|`` in float64."""
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


@pytest.fixture
def cases():
    """Builders of random problems (see the module docstring)."""
    return SimpleNamespace(make_qkv=make_qkv, make_bias=make_bias, make_window=make_window,
                           relative_error=relative_error, BEV=BEV, CAMERA=CAMERA, NUM_KEYS=NUM_KEYS,
                           SEGMENTS=SEGMENTS)


@pytest.fixture
def run_under_triton_interpreter():
    """Run a module of checks of Triton kernels in a pytest process of its own with ``TRITON_INTERPRET=1`` and require
    exactly ``num_checks`` passed.

    The variable must be set before Triton is first imported, which the package does (through torch's
    FlexAttention), so such checks cannot run in the suite's own process.
    """
    pytest.importorskip('triton', reason='the triton package comes with the CUDA builds of torch that setup installs')
    here = os.path.dirname(os.path.abspath(__file__))

    def run(module: str, num_checks: int) -> None:
        result = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-p', 'no:xdist',
                                 os.path.join(here, module)], cwd=os.path.dirname(os.path.dirname(here)),
                                env=dict(os.environ, TRITON_INTERPRET='1'), capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
        assert f'{num_checks} passed' in result.stdout, result.stdout[-2000:]

    return run

