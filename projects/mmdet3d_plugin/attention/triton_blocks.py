"""What a program of the package's Triton kernels works on, computed the same way by each kernel.

This module imports Triton: only the kernel modules import it (:mod:`.slots.slot_kernels`,
:mod:`.backends.tiled_bias.kernels`), when their formulation or backend runs.
"""
import triton
import triton.language as tl


@triton.jit
def query_block_program(heads, num_queries, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """The program's sample ``b`` and head ``h`` (its first grid axis runs over ``bs * heads``), its queries
    ``[BLOCK_Q]`` (the second axis runs over blocks of queries), the channels ``[BLOCK_D]`` and which of the
    queries exist (``[BLOCK_Q]`` bool)."""
    table = tl.program_id(0)
    queries = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    return table // heads, table % heads, queries, tl.arange(0, BLOCK_D), queries < num_queries
