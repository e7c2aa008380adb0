"""Check each spconv convolution of a sparse encoder against a dense ``F.conv3d``.

Used by ``tools/check_spconv_race.py`` and the tests of the CPU scatter-add
race (see :mod:`.spconv_cpu_scatter`): every ``SubMConv3d`` /
``SparseConv3d`` output is compared, at its active sites, with a dense
convolution of the layer's own captured input (same weight, stride, padding,
dilation). Inputs must be small enough for the dense volume to fit in memory.
The race needs more than one OpenMP thread in spconv's kernels:
:func:`spconv_openmp_threads` reads, and :func:`use_spconv_openmp_threads`
sets, how many they use.
"""
import contextlib
import ctypes
import glob
import os.path as osp
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def _spconv_openmp_runtime() -> Optional[ctypes.CDLL]:
    """The OpenMP runtime whose threads run spconv's CPU kernels, or None when spconv is built without OpenMP.

    spconv's CPU wheel links a bundled ``libgomp`` (``spconv.libs/``), but the
    dynamic linker resolves a library's symbols in the global scope first:
    torch loads its own ``libgomp`` globally before spconv loads, so spconv's
    kernels call torch's runtime (whose per-thread count ``torch.set_num_threads``
    sets), and the bundled copy only when no OpenMP runtime is global. spconv's
    CUDA wheels bundle none: they are built without OpenMP.
    """
    import spconv
    import spconv.core_cc  # noqa: F401  (loads spconv's kernels and their runtime)
    site_packages = osp.dirname(osp.dirname(osp.abspath(spconv.__file__)))
    bundled = sorted(glob.glob(osp.join(site_packages, 'spconv*.libs', 'libgomp*')))
    if not bundled:
        return None
    global_scope = ctypes.CDLL(None)
    return global_scope if hasattr(global_scope, 'omp_get_max_threads') else ctypes.CDLL(bundled[0])


def spconv_openmp_threads() -> Optional[int]:
    """How many OpenMP threads spconv's CPU kernels called from this thread use; None without OpenMP."""
    runtime = _spconv_openmp_runtime()
    return runtime.omp_get_max_threads() if runtime is not None else None


@contextlib.contextmanager
def use_spconv_openmp_threads(threads: int) -> Iterator[None]:
    """Run the body with ``threads`` OpenMP threads in spconv's CPU kernels called from this thread.

    Sets the runtime's per-thread count (``omp_set_num_threads``), which
    overrides ``OMP_NUM_THREADS``, and restores the previous count afterwards.

    Raises:
        RuntimeError: spconv is built without OpenMP (its CPU kernels run on one thread).
    """
    runtime = _spconv_openmp_runtime()
    if runtime is None:
        raise RuntimeError('this spconv build has no OpenMP: its CPU kernels run on one thread')
    previous = runtime.omp_get_max_threads()
    runtime.omp_set_num_threads(threads)
    try:
        yield
    finally:
        runtime.omp_set_num_threads(previous)


def _dense_weight(module: nn.Module) -> torch.Tensor:
    """``(C_out, C_in, kD, kH, kW)`` weight of a spconv 3D convolution (stored KRSC or RSKC)."""
    weight = module.weight
    kernel = tuple(module.kernel_size)
    if weight.shape == (module.out_channels, *kernel, module.in_channels):  # KRSC
        return weight.permute(0, 4, 1, 2, 3)
    if weight.shape == (*kernel, module.in_channels, module.out_channels):  # RSKC (spconv 1.x layout)
        return weight.permute(4, 3, 0, 1, 2)
    raise ValueError(f'unrecognised spconv weight shape {tuple(weight.shape)} for kernel {kernel}, '
                     f'{module.in_channels} -> {module.out_channels} channels')


def densify(features: torch.Tensor, indices: torch.Tensor, spatial_shape, batch_size: int) -> torch.Tensor:
    """Scatter sparse features into a dense volume.

    Args:
        features (torch.Tensor): ``(N, C)`` features of the active sites.
        indices (torch.Tensor): ``(N, 4)`` integer ``(batch, z, y, x)`` of each site.
        spatial_shape (Sequence[int]): ``(D, H, W)``.
        batch_size (int): B.

    Returns:
        torch.Tensor: ``(B, C, D, H, W)``, zero at inactive sites.
    """
    dense = features.new_zeros(batch_size, *spatial_shape, features.shape[1])
    idx = indices.long()
    dense[idx[:, 0], idx[:, 1], idx[:, 2], idx[:, 3]] = features
    return dense.permute(0, 4, 1, 2, 3).contiguous()


def dense_reference(module: nn.Module, x, out_indices: torch.Tensor) -> torch.Tensor:
    """What a spconv 3D convolution must output at ``out_indices``, from a dense ``F.conv3d``.

    Args:
        module (nn.Module): a spconv ``SubMConv3d`` or ``SparseConv3d`` (no transposed/inverse conv).
        x (SparseConvTensor): the module's input.
        out_indices (torch.Tensor): ``(M, 4)`` ``(batch, z, y, x)`` active sites of its output.

    Returns:
        torch.Tensor: ``(M, C_out)`` reference features.
    """
    if getattr(module, 'transposed', False) or getattr(module, 'inverse', False):
        raise ValueError(f'dense_reference supports forward convolutions only, got {type(module).__name__}')
    dense = densify(x.features, x.indices, x.spatial_shape, x.batch_size)
    padding = [k // 2 for k in module.kernel_size] if module.subm else list(module.padding)
    out = F.conv3d(dense, _dense_weight(module).to(dense.dtype), module.bias, stride=1 if module.subm else
                   list(module.stride), padding=padding, dilation=list(module.dilation))
    idx = out_indices.long()
    return out[idx[:, 0], :, idx[:, 1], idx[:, 2], idx[:, 3]]


def sparse_conv_layers(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """``(name, module)`` of every spconv forward 3D convolution inside ``model``."""
    from spconv.pytorch.conv import SparseConvolution
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, SparseConvolution) and module.ndim == 3 and not module.transposed
            and not module.inverse]


def check_sparse_convs(encoder: nn.Module, run, rtol: float = 1e-4) -> Dict[str, dict]:
    """Run ``run()`` once and compare each spconv convolution of ``encoder`` with its dense reference.

    Args:
        encoder (nn.Module): the module holding the sparse convolutions (e.g. mmdet3d's ``SparseEncoder``).
        run (Callable[[], Any]): calls the encoder (or the whole model) on a fixed input.
        rtol (float): a layer fails when its max abs error exceeds ``rtol * max(|reference|) + 1e-6``.

    Returns:
        dict: per layer name: ``type`` (class name), ``max_abs_err``, ``scale`` (max |reference|), ``ok``.
    """
    layers = sparse_conv_layers(encoder)
    if not layers:
        raise ValueError(f'{type(encoder).__name__} has no spconv 3D convolution to check')
    captured = {}

    def hook(name):

        def capture(module, inputs, output):
            x = inputs[0]
            captured[name] = (module, x.replace_feature(x.features.detach().clone()), output.indices.clone(),
                              output.features.detach().clone())

        return capture

    handles = [module.register_forward_hook(hook(name)) for name, module in layers]
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    report = {}
    with torch.no_grad():
        for name, _ in layers:
            if name not in captured:
                raise RuntimeError(f'sparse convolution {name} did not run')
            module, x, out_indices, out_features = captured[name]
            reference = dense_reference(module, x, out_indices)
            err = (out_features - reference).abs().max().item() if len(reference) else 0.0
            scale = reference.abs().max().item() if len(reference) else 0.0
            report[name] = dict(type=type(module).__name__, max_abs_err=err, scale=scale,
                                ok=err <= rtol * scale + 1e-6)
    return report
