"""The ``tiled_bias`` backend: its kernels against ``math`` (under Triton's interpreter, in a process of its own),
its tables against the bias they encode, what it refuses, and how ``auto`` reaches it.

``tiled_bias_interpreter_checks.py`` holds the kernel checks: ``TRITON_INTERPRET=1`` must be set before Triton
is first imported, which the package does (through torch's FlexAttention). What only a GPU can tell
(compilation for the device, ``tf32x3`` products, speed) is left to ``tools/check_gpu.py`` and
``tools/benchmark_attention.py --backends tiled_bias`` (docs/attention.md).
"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from projects.mmdet3d_plugin.attention import UnsupportedAttentionError, apply_attention, dispatch, select_backend
from projects.mmdet3d_plugin.attention.backends.tiled_bias.tables import key_cells, window_centres
from projects.mmdet3d_plugin.utils.device_ops import TOTAL, DeviceOpCounter

#: the checks of tiled_bias_interpreter_checks.py (parametrised cases counted): all must pass, none be skipped
NUM_CHECKS = 20


@pytest.mark.slow(seconds=30)
def test_kernels_equal_math_under_the_interpreter(run_under_triton_interpreter):
    run_under_triton_interpreter('tiled_bias_interpreter_checks.py', NUM_CHECKS)


def _bias_from_tables(keys, centres, inv_half, amplitude, values):
    """What the kernels' ``_tile_bias`` computes, in torch: ``[bs, heads, Q, K]``."""
    grid, plane, y, x, segment = keys.long()
    bias = values.gather(-1, segment.clamp_min(0).expand(*values.shape[:3], -1)) * (segment >= 0)
    for g in range(centres.size(0)):
        centre = centres[g].long()[:, :, None]  # [bs, Q, 1, 3]
        distance = ((y - centre[..., 1]) ** 2 + (x - centre[..., 2]) ** 2).float().sqrt()
        decay = (1.0 - distance * inv_half[g]).clamp_min(0.0)
        hit = (grid == g) & (plane == centre[..., 0]) & (centre[..., 0] >= 0)
        bias = bias + amplitude[g][..., None] * (decay * hit)[:, None]
    return bias


def test_tables_encode_the_bias(cases):
    """Evaluated as the kernels evaluate them, the tables give the bias's dense form: each key's cell on its grid,
    clipped windows, queries without a camera window (invalid) and the segment of every key."""
    bias, _ = cases.make_bias('segment+window', bias_heads=3)
    segment, window = bias.parts
    grids, centres, inv_half = window_centres([window])
    assert grids == [cases.BEV, cases.CAMERA] and centres.dtype == torch.int32
    assert torch.equal(centres[1, ..., 0] >= 0, window.valid[1]), 'an invalid query must have no camera window'
    keys = key_cells(grids, segment.segment_bounds, cases.NUM_KEYS, torch.device('cpu'))
    assert keys.shape == (5, cases.NUM_KEYS) and keys.dtype == torch.int32 and keys.is_contiguous()
    assert keys[0].tolist() == [0] * 35 + [1] * 48 + [-1] * 2
    assert keys[4].tolist() == [0] * 35 + [1] * 50
    camera_key = 35 + (1 * 4 + 2) * 6 + 5  # plane 1, row 2, column 5 of the camera grid
    assert keys[1:4, camera_key].tolist() == [1, 2, 5]
    amplitude = torch.stack([a.expand(-1, 3, -1) for a in window.amplitude])
    expected = bias.to_dense()
    assert torch.allclose(_bias_from_tables(keys, centres, inv_half, amplitude, segment.values), expected, atol=1e-6)
    assert key_cells(grids, None, cases.NUM_KEYS, torch.device('cpu'))[4].eq(-1).all()


def test_the_key_table_is_made_once_and_launches_nothing(cases):
    """The key table depends on the shapes alone: made on the host once and served from a cache, so a call on a
    GPU launches no kernel for it (counted on fake CUDA: one copy of host data, no device op)."""
    grids, bounds = [cases.BEV, cases.CAMERA], ((0, 35), (35, cases.NUM_KEYS))
    keys = key_cells(grids, bounds, cases.NUM_KEYS, torch.device('cpu'))
    assert key_cells(tuple(grids), [list(b) for b in bounds], cases.NUM_KEYS, torch.device('cpu')) is keys
    with FakeTensorMode(allow_non_fake_inputs=True), DeviceOpCounter('cuda') as counter:
        fake = key_cells(grids, bounds, cases.NUM_KEYS, torch.device('cuda'))
    assert fake.shape == keys.shape and fake.dtype == torch.int32
    assert counter.ops[TOTAL] == 0 and counter.host_copies[TOTAL] == 1


def test_refuses_what_it_cannot_apply(cases, monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    q, k, v = cases.make_qkv()
    with pytest.raises(UnsupportedAttentionError, match="CUDA tensors, or on the CPU under Triton's interpreter"):
        apply_attention(q, k, v, cases.make_bias('segment+window')[0], backend='tiled_bias')
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    for kind, dropout_p, message in [('segment+lowrank', 0.0, 'applies only SegmentBias and WindowBias, not LowRank'),
                                     ('window', 0.1, 'no attention dropout')]:
        with pytest.raises(UnsupportedAttentionError, match=message):
            apply_attention(q, k, v, cases.make_bias(kind)[0], backend='tiled_bias', dropout_p=dropout_p)
    big = torch.randn(1, 1, 4, 160)
    with pytest.raises(UnsupportedAttentionError, match='head dims up to 128'):
        apply_attention(big, big, big, backend='tiled_bias')


@pytest.mark.parametrize('capability,refused', [((7, 5), True), ((8, 0), False), ((9, 0), False)])
def test_a_gpu_older_than_ampere_is_refused_so_auto_falls_back(cases, monkeypatch, capability, refused):
    """The kernels' tensor-core products (tf32x3, bfloat16) need compute capability 8.0: on an older GPU the backend
    says so (and ``auto`` takes the size rule's backend). Asked of the (here pretended) GPU, not of fake CUDA."""
    from projects.mmdet3d_plugin.attention.backends.tiled_bias import backend as tiled
    from projects.mmdet3d_plugin.attention.dispatch import _make_call
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v = (t.to('cuda:0') for t in cases.make_qkv(requires_grad=False))
        bias = cases.make_bias('segment+window')[0].to('cuda:0')
        call = _make_call(q, k, v, bias, None, 0.0, None)
        assert not any('compute capability' in r for r in tiled.TiledBiasBackend().not_supported_reasons(call)), \
            'fake CUDA has no GPU to ask'
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
        monkeypatch.setattr(tiled, '_compute_capability', lambda index: capability)
        reasons = tiled.TiledBiasBackend().not_supported_reasons(call)
    expected = 'compute capability 8.0 or later (tensor-core tf32x3 and bfloat16 products), got 7.5'
    assert any(expected in reason for reason in reasons) == refused, reasons


def test_auto_takes_it_only_where_structured_bias_first_names_it(cases, monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setattr(dispatch, 'STRUCTURED_BIAS_FIRST', {})
    q, k, v = cases.make_qkv()
    bias = cases.make_bias('segment+window')[0]
    default, _ = select_backend(q, bias, k=k, v=v)
    assert default != 'tiled_bias'
    dispatch.set_structured_bias_first('cpu', 'tiled_bias')
    name, reason = select_backend(q, bias, k=k, v=v)
    assert name == default and 'skipped tiled_bias' in reason and 'STRUCTURED_BIAS_FIRST' in reason
    assert select_backend(q, None, k=k, v=v)[0] == 'sdpa', 'a call without a structured bias keeps its order'
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    assert select_backend(q, bias, k=k, v=v)[0] == 'tiled_bias'
    with pytest.raises(ValueError, match="unknown attention backend 'tiled'"):
        dispatch.set_structured_bias_first('cuda', 'tiled')


def test_launches_are_parsed_and_set_for_both_precisions(monkeypatch):
    from projects.mmdet3d_plugin.attention.backends.tiled_bias import launch
    monkeypatch.setattr(launch, 'LAUNCH', dict(launch.LAUNCH))
    assert launch.parse_launch('key_grad=16x128x8') == ('key_grad', launch.Launch(16, 128, 8))
    for text, message in [('fwd=32x32x4', "unknown tiled_bias kernel 'fwd'"), ('forward=32x32', 'QUERIESxKEYSxWARPS'),
                          ('forward=24x32x4', 'powers of two >= 16'), ('forward=8x32x4', 'powers of two >= 16'),
                          ('forward=32x32x3', 'warps a power of two')]:
        with pytest.raises(ValueError, match=message):
            launch.parse_launch(text)
    launch.set_launch('forward', launch.Launch(64, 16, 2))
    assert launch.launch_of('forward', torch.float32) == launch.launch_of('forward', torch.bfloat16) == (64, 16, 2)
    launch.set_launch('query_grad', launch.Launch(32, 32, 4), 'half')
    assert launch.launch_of('query_grad', torch.float16) == (32, 32, 4) != launch.launch_of('query_grad', torch.float32)
    with pytest.raises(ValueError, match='precision must be one of'):
        launch.set_launch('forward', launch.Launch(64, 16, 2), 'float16')
