"""Let spconv 2's CPU backward pass run on machines without a CUDA driver.

spconv 2.3's ``indice_conv_backward`` (the backward of every strided, non
submanifold sparse convolution) asks for ``torch.cuda.current_stream()``
before it checks whether the tensors are on the CPU. With a CUDA build of
torch and no NVIDIA driver that call raises ("Found no NVIDIA driver"), so
mmdet3d's ``SparseEncoder`` could run forward but never train on CPU. The CPU
code path never uses the stream; :func:`patch_spconv_cpu_stream` makes the
stream lookup return 0 when CUDA is unavailable and leaves it untouched
otherwise. It also silences spconv's per-call deprecation warning about
non-tuple indexing (raised from spconv's own code, once per sparse layer and
iteration), which would otherwise flood every training log.
"""
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
