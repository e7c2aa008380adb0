"""spconv's CPU sparse convolutions are race-free on every route: they match dense convs under CPU load.

spconv 2.3's own CPU scatter-add shares its row pointers between OpenMP
threads; with two threads and two load processes, 32 of 50 runs of the R50
config's sparse encoder had at least one layer wrong
(``tools/check_spconv_race.py``). CPU tensors reach that kernel from Python on
spconv's CPU build and from C++ (``ConvGemmOps``) on its CUDA builds; the CUDA
builds' route is reproduced here on the installed CPU build by giving
``spconv.pytorch.ops`` the C++ gemm tuner a CUDA build has (``GEMM_CPP``).
"""
import multiprocessing
import os

import pytest
import spconv.pytorch as spconv
import torch
from spconv.core_cc.csrc.sparse.convops.gemmops import GemmTunerSimple
from spconv.pytorch import ops

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.mmcv_custom import spconv_cpu_scatter
from projects.mmdet3d_plugin.mmcv_custom.sparse_conv_check import (check_sparse_convs, spconv_openmp_threads,
                                                                   use_spconv_openmp_threads)
from projects.mmdet3d_plugin.mmcv_custom.spconv_cpu_scatter import (builtin_spconv_scatter_add,
                                                                    is_spconv_cpu_scatter_add_patched,
                                                                    scatter_add_rows)
from projects.mmdet3d_plugin.diagnostics import spconv_race_check

RUNS_UNDER_LOAD = 6
SPCONV_THREADS = 2
ROUTES = ('cpu_build', 'cuda_build')


@pytest.fixture
def cpu_load():
    """One busy-loop process per usable core while the test runs, so that spconv's threads get preempted."""
    loads = [multiprocessing.Process(target=spconv_race_check.busy_loop, daemon=True)
             for _ in range(len(os.sched_getaffinity(0)))]
    for process in loads:
        process.start()
    yield len(loads)
    for process in loads:
        process.terminate()
        process.join()


@pytest.fixture(params=ROUTES)
def spconv_route(request, monkeypatch):
    """The route CPU tensors take inside spconv: its CPU build's Python loop, or a CUDA build's C++ ``ConvGemmOps``.

    A CUDA build sets ``spconv.pytorch.ops.GEMM_CPP`` to a C++ ``GemmTunerSimple``, which sends every
    native-algorithm convolution to ``ConvGemmOps.indice_conv`` / ``indice_conv_backward``; their CPU branch
    (compiled into the CPU build too) never uses the tuner, and the CPU build cannot construct one
    ("not implemented for cpu"), so an unconstructed instance stands in for it.
    """
    if request.param == 'cuda_build':
        monkeypatch.setattr(ops, 'GEMM_CPP', GemmTunerSimple.__new__(GemmTunerSimple))
    return request.param


@pytest.fixture
def scatter_calls(monkeypatch):
    """Counts the calls of the race-free :func:`scatter_add_rows` (by the patched convolutions)."""
    calls = []

    def counting(out, rows, indices):
        calls.append(len(indices))
        return scatter_add_rows(out, rows, indices)

    monkeypatch.setattr(spconv_cpu_scatter, 'scatter_add_rows', counting)
    return calls


def _small_sparse_net():
    """A submanifold and a strided sparse convolution (spconv's default algorithm) on 600 random sites of 16^3."""
    torch.manual_seed(0)
    net = spconv.SparseSequential(spconv.SubMConv3d(4, 8, 3, bias=False, indice_key='subm'),
                                  spconv.SparseConv3d(8, 8, 3, stride=2, padding=1, bias=False))
    flat = torch.randperm(16**3)[:600]
    coords = torch.stack([torch.zeros_like(flat), flat // 256, flat // 16 % 16, flat % 16], 1).int()
    return net, torch.randn(600, 4), coords


def _forward_backward(net, features, coords):
    """Output features and the gradients of the input features and weights, for a fixed output gradient."""
    features = features.clone().requires_grad_(True)
    out = net(spconv.SparseConvTensor(features, coords, [16, 16, 16], 1)).features
    net.zero_grad()
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return [out.detach(), features.grad] + [param.grad.clone() for param in net.parameters()]


def test_scatter_add_rows_matches_indexed_add():
    out, rows = torch.zeros(50, 3), torch.randn(60, 3)
    idx = torch.randperm(50)[:40].int()
    expected = out.clone()
    expected[idx.long()] += rows[:40]
    assert torch.equal(scatter_add_rows(out, rows, idx), expected)


def test_cpu_convs_take_the_race_free_scatter_add_on_each_spconv_route(spconv_route, scatter_calls):
    net, features, coords = _small_sparse_net()
    assert is_spconv_cpu_scatter_add_patched()
    report = check_sparse_convs(net, lambda: net(spconv.SparseConvTensor(features, coords, [16, 16, 16], 1)))
    forward_calls = len(scatter_calls)
    assert forward_calls > 0, f'{spconv_route}: the forward pass bypassed the race-free scatter-add'
    assert all(layer['ok'] for layer in report.values()), report
    patched = _forward_backward(net, features, coords)
    assert len(scatter_calls) - 2 * forward_calls > 0, f'{spconv_route}: the backward pass bypassed it'
    with builtin_spconv_scatter_add():
        spconv_own = _forward_backward(net, features, coords)
    for ours, theirs in zip(patched, spconv_own):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_the_check_fails_when_a_route_is_unpatched(spconv_route, scatter_calls, monkeypatch):
    net, features, coords = _small_sparse_net()
    assert is_spconv_cpu_scatter_add_patched()
    with builtin_spconv_scatter_add():
        assert not is_spconv_cpu_scatter_add_patched()
        _forward_backward(net, features, coords)
    assert not scatter_calls  # spconv's own route really bypasses the race-free scatter-add
    assert is_spconv_cpu_scatter_add_patched()
    for name in ('indice_conv', 'indice_conv_backward'):
        with monkeypatch.context() as patch:
            patch.setattr(ops, name, lambda *args, **kwargs: None)
            assert not is_spconv_cpu_scatter_add_patched(), f'ops.{name} is not the race-free replacement'
    assert is_spconv_cpu_scatter_add_patched()


def test_a_fused_bias_is_refused_on_the_cpu():
    _, features, coords = _small_sparse_net()
    conv = spconv.SubMConv3d(4, 8, 3, bias=True).eval()  # spconv passes the bias to the kernel in eval mode
    with pytest.raises(NotImplementedError, match='fused bias'):
        conv(spconv.SparseConvTensor(features, coords, [16, 16, 16], 1))


@pytest.mark.skipif(spconv_openmp_threads() is None,
                    reason='spconv built without OpenMP (its CUDA wheels): its CPU loop runs on one thread')
@pytest.mark.parametrize('config', spconv_race_check.DEFAULT_CONFIGS)
def test_sparse_encoder_matches_dense_conv_with_two_spconv_threads_under_cpu_load(config, cpu_load):
    encoder, encoder_cfg = spconv_race_check.build_cropped_encoder(config, grid=64)
    features, coords = spconv_race_check.random_sparse_input(encoder_cfg, sites=3000, seed=0)
    with use_spconv_openmp_threads(SPCONV_THREADS):
        assert spconv_openmp_threads() == SPCONV_THREADS  # whatever OMP_NUM_THREADS the tests run with
        result = spconv_race_check.check_encoder(encoder, features, coords, RUNS_UNDER_LOAD)
    assert result['bad_runs'] == 0, result
    assert result['bit_identical'], result
    assert set(result['per_type']) == {'SubMConv3d', 'SparseConv3d'}
