"""spconv's sparse convolutions run CPU tensors whatever algorithm the layer was built with.

spconv's CUDA builds give every small-kernel layer the implicit-GEMM algorithm, which has no CPU implementation;
the plugin runs CPU calls with the native one. Here the CUDA builds' layers are reproduced on the installed CPU
build by setting the layers' ``algo`` after construction.
"""
import copy

import pytest
import spconv.pytorch as spconv
import torch
from spconv.core import ConvAlgo
from spconv.pytorch.conv import SparseConvolution

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.mmcv_custom.spconv_cpu import patch_spconv_cpu_algorithm


def sparse_input(num_voxels: int = 80, channels: int = 4, shape=(9, 16, 16)) -> spconv.SparseConvTensor:
    """A batch of one sample: ``num_voxels`` distinct random active voxels with ``channels`` features."""
    generator = torch.Generator().manual_seed(0)
    coords = torch.stack([torch.randint(0, size, (num_voxels,), generator=generator) for size in shape], dim=1)
    coords = torch.unique(coords, dim=0)
    indices = torch.cat([torch.zeros(len(coords), 1, dtype=torch.long), coords], dim=1).int()
    features = torch.randn(len(coords), channels, generator=generator, requires_grad=True)
    return spconv.SparseConvTensor(features, indices, list(shape), batch_size=1)


def implicit_gemm_copy(network: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``network`` whose sparse convolutions have the algorithm a CUDA build gives them."""
    network = copy.deepcopy(network)
    for module in network.modules():
        if isinstance(module, SparseConvolution):
            module.algo = ConvAlgo.MaskImplicitGemm
    return network


def test_a_cpu_call_of_an_implicit_gemm_layer_runs_natively_and_keeps_the_layers_algorithm():
    torch.manual_seed(0)
    native = spconv.SparseSequential(
        spconv.SubMConv3d(4, 8, 3, padding=1, indice_key='subm1'),
        spconv.SubMConv3d(8, 8, 3, padding=1, indice_key='subm1'),
        spconv.SparseConv3d(8, 16, 3, stride=2, padding=1, indice_key='down1'),
        spconv.SparseInverseConv3d(16, 8, 3, indice_key='down1'))
    implicit = implicit_gemm_copy(native)
    native_input, implicit_input = sparse_input(), sparse_input()

    native_out, implicit_out = native(native_input), implicit(implicit_input)
    native_out.features.square().sum().backward()
    implicit_out.features.square().sum().backward()

    assert torch.equal(implicit_out.indices, native_out.indices)
    assert torch.allclose(implicit_out.features, native_out.features, atol=1e-6)
    assert torch.allclose(implicit_input.features.grad, native_input.features.grad, atol=1e-6)
    for native_layer, implicit_layer in zip(native, implicit):
        assert torch.allclose(implicit_layer.weight.grad, native_layer.weight.grad, atol=1e-5)
        assert implicit_layer.algo == ConvAlgo.MaskImplicitGemm  # restored after the call


def test_the_patch_is_applied_on_import_and_idempotent():
    forward = SparseConvolution._conv_forward
    assert getattr(forward, 'runs_cpu_natively', False)
    assert patch_spconv_cpu_algorithm()
    assert SparseConvolution._conv_forward is forward


@pytest.mark.parametrize('layer', ['subm', 'strided'])
def test_a_layer_keeps_its_error_for_a_wrong_channel_count(layer):
    conv = (spconv.SubMConv3d(4, 8, 3, indice_key='k') if layer == 'subm' else spconv.SparseConv3d(4, 8, 3, stride=2))
    conv = implicit_gemm_copy(conv)
    with pytest.raises(AssertionError, match='channel size mismatch'):
        conv(sparse_input(channels=5))
    assert conv.algo == ConvAlgo.MaskImplicitGemm
