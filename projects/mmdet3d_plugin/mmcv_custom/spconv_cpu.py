"""Let spconv 2's sparse convolutions run on CPU tensors, on machines without a CUDA driver and on its CUDA builds.

* spconv 2.3's ``indice_conv_backward`` (the backward of every strided, non submanifold sparse convolution) asks
  for ``torch.cuda.current_stream()`` before it checks whether the tensors are on the CPU. With a CUDA build of
  torch and no NVIDIA driver that call raises ("Found no NVIDIA driver"), so mmdet3d's ``SparseEncoder`` could run
  forward but never train on CPU. The CPU code path never uses the stream; :func:`patch_spconv_cpu_stream` makes
  the stream lookup return 0 when CUDA is unavailable and leaves it untouched otherwise. It also silences spconv's
  per-call deprecation warning about non-tuple indexing (raised from spconv's own code, once per sparse layer and
  iteration), which would otherwise flood every training log.
* spconv's CUDA builds (``spconv-cu1xx``) give every layer of up to 32 kernel offsets the implicit-GEMM algorithm,
  which has no CPU implementation ("implicit gemm only support cuda"), so mmdet3d's ``SparseEncoder`` built there
  cannot run CPU tensors. :func:`patch_spconv_cpu_algorithm` runs a call whose features are on the CPU with
  spconv's native algorithm (the CPU build's only one; spconv 2.2+ keeps one weight layout for both) and leaves
  calls on a GPU to the layer's own.
"""
import functools
import warnings

import torch

_SPCONV_MODULES = ('spconv.pytorch.cppcore', 'spconv.pytorch.ops', 'spconv.pytorch.utils', 'spconv.pytorch.hash')


def cpu_safe_current_stream() -> int:
    """The current CUDA stream handle, or 0 (the default stream) when CUDA is unavailable."""
    if torch.cuda.is_available():
        return torch.cuda.current_stream().cuda_stream
    return 0


def patch_spconv_cpu_stream() -> bool:
    """Install :func:`cpu_safe_current_stream` in spconv's modules.

    Returns:
        bool: False when spconv 2 is not installed (nothing to patch).
    """
    import importlib
    try:
        modules = [importlib.import_module(name) for name in _SPCONV_MODULES]
    except ImportError:
        return False
    for module in modules:
        if hasattr(module, 'get_current_stream'):
            module.get_current_stream = cpu_safe_current_stream
    warnings.filterwarnings('ignore', message='Using a non-tuple sequence for multidimensional indexing',
                            module='spconv')
    return True


def patch_spconv_cpu_algorithm() -> bool:
    """Make spconv's ``SparseConvolution`` run CPU features with the native algorithm, whatever its ``algo``.

    The layer's ``algo`` is set to ``ConvAlgo.Native`` for the call and restored after it; features on any other
    device run with the layer's own algorithm. Idempotent.

    Returns:
        bool: False when spconv 2 is not installed (nothing to patch).
    """
    try:
        from spconv.core import ConvAlgo
        from spconv.pytorch.conv import SparseConvolution
    except ImportError:
        return False
    conv_forward = SparseConvolution._conv_forward
    if getattr(conv_forward, 'runs_cpu_natively', False):
        return True

    @functools.wraps(conv_forward)
    def conv_forward_native_on_cpu(self, training, input, *args, **kwargs):
        algo = self.algo
        if algo == ConvAlgo.Native or input.features.device.type != 'cpu':
            return conv_forward(self, training, input, *args, **kwargs)
        self.algo = ConvAlgo.Native
        try:
            return conv_forward(self, training, input, *args, **kwargs)
        finally:
            self.algo = algo

    conv_forward_native_on_cpu.runs_cpu_natively = True
    SparseConvolution._conv_forward = conv_forward_native_on_cpu
    return True
