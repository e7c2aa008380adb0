"""Tile sizes and warps of the ``tiled_bias`` kernels (:data:`LAUNCH`), importable without Triton.

The benchmarks' ``--tiled-bias-launch forward=32x64x4`` sets an entry for a
timed sweep on a GPU (:func:`set_launch`); ``tools/kernel_registers.py``
compiles any launch for an sm without a GPU and reports its register spills.
"""
from typing import NamedTuple, Optional, Tuple

import torch

#: the kernels of :mod:`.kernels`
KERNELS = ('forward', 'key_grad', 'query_grad')
#: input precisions with launches of their own
PRECISIONS = ('float32', 'half')


class Launch(NamedTuple):
    """Tile sizes and warps of one kernel: ``block_q`` queries by ``block_k`` keys per tile."""

    block_q: int
    block_k: int
    num_warps: int


#: per (kernel, input precision: ``'float32'`` or ``'half'``), the launch of every call, chosen for sm_90 at head
#: dim 32 with the AQR bias (2 grids, 2 segments). ``tools/kernel_registers.py --sweep`` (no GPU) reports the
#: registers, spills and machine instructions a score costs for any launch. The forward takes 64-query blocks: with
#: 32 and 4 warps Triton's attention layout gives each warp 16 whole rows, so two warps repeat the other two; 64 x 64
#: x 4 was the fastest forward in the GPU launch sweep (``--tiled-bias-launch``, see docs/results.md). The gradient
#: kernels take 16- and 32-query blocks so that a 900-query call has a program for every multiprocessor.
LAUNCH = {
    ('forward', 'float32'): Launch(64, 64, 4),
    ('key_grad', 'float32'): Launch(32, 64, 4),
    ('query_grad', 'float32'): Launch(16, 64, 4),
    ('forward', 'half'): Launch(64, 64, 4),
    ('key_grad', 'half'): Launch(32, 64, 4),
    ('query_grad', 'half'): Launch(16, 64, 4),
}


def precision_of(dtype: torch.dtype) -> str:
    """The :data:`PRECISIONS` entry of an input dtype."""
    return 'float32' if dtype == torch.float32 else 'half'


def launch_of(kernel: str, dtype: torch.dtype) -> Launch:
    """The :data:`LAUNCH` entry of ``kernel`` for inputs of ``dtype``."""
    return LAUNCH[kernel, precision_of(dtype)]


def parse_launch(text: str) -> Tuple[str, Launch]:
    """``'forward=32x64x4'`` -> ``('forward', Launch(32, 64, 4))``: queries x keys x warps.

    Raises:
        ValueError: an unknown kernel, or sizes that are not powers of two of at least 16 (``tl.dot``'s smallest
            side) and warps not a power of two.
    """
    kernel, _, sizes = text.partition('=')
    if kernel not in KERNELS:
        raise ValueError(f'unknown tiled_bias kernel {kernel!r} in {text!r}; choose from {KERNELS}')
    try:
        block_q, block_k, warps = (int(n) for n in sizes.split('x'))
    except ValueError:
        raise ValueError(f'a launch is KERNEL=QUERIESxKEYSxWARPS (e.g. forward=32x64x4), got {text!r}') from None
    if any(n < 16 or n & (n - 1) for n in (block_q, block_k)) or warps < 1 or warps & (warps - 1):
        raise ValueError(f'{text!r}: tile sides must be powers of two >= 16 and warps a power of two')
    return kernel, Launch(block_q, block_k, warps)


def set_launch(kernel: str, launch: Launch, precision: Optional[str] = None) -> None:
    """Use ``launch`` for ``kernel`` from now on, for one precision of :data:`PRECISIONS` or (None) both."""
    for name in (precision, ) if precision is not None else PRECISIONS:
        if name not in PRECISIONS:
            raise ValueError(f'precision must be one of {PRECISIONS}, got {name!r}')
        LAUNCH[kernel, name] = launch
