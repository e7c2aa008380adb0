"""Where the package's Triton kernels can run (Triton itself is imported only by the kernel modules, when used)."""
import importlib.util
import os
from typing import List


def triton_not_supported_reasons(device_type: str, what: str) -> List[str]:
    """Why ``what`` (Triton kernels) cannot run on tensors of ``device_type`` (empty when they can).

    They run on CUDA tensors, and on CPU tensors under Triton's interpreter
    (``TRITON_INTERPRET=1`` set before the kernels are imported, how the CPU
    tests run them); both need the ``triton`` package (shipped with CUDA
    builds of torch).
    """
    reasons = []
    if device_type != 'cuda' and not (device_type == 'cpu' and os.environ.get('TRITON_INTERPRET') == '1'):
        reasons.append(f"{what} run on CUDA tensors, or on the CPU under Triton's interpreter (TRITON_INTERPRET=1); "
                       f'got {device_type} tensors')
    if importlib.util.find_spec('triton') is None:
        reasons.append(f'{what} need the triton package (installed with CUDA builds of torch)')
    return reasons
