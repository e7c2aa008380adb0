"""Registers and spills of the ``tiled_bias`` Triton kernels, compiled for a GPU architecture without a GPU
(``tools/kernel_registers.py``).

Triton compiles a kernel for any target from its source (``triton.compile``
with an ``ASTSource`` and a ``GPUTarget``), and the ``ptxas`` shipped in the
triton wheel assembles the PTX with ``-v``, which prints the registers per
thread and the bytes spilled to local memory. A kernel that spills reloads
its tiles from memory in the inner loop; a launch that needs no spills is
what :data:`~..attention.backends.tiled_bias.launch.LAUNCH` is chosen from
on a machine without a GPU.

It also counts the machine instructions of the kernel's key loop (``nvdisasm``
of the assembled cubin, also in the wheel): the loop's instructions times the
warps, per score of its ``BLOCK_Q x BLOCK_K`` tile, is what one score costs in
issue slots when the GPU is busy. It shows what the registers cannot: with
more warps than the tile has 16-row slices, Triton's attention layout gives
each warp a whole 16-row slice, so warps repeat each other's work and the
instructions per score rise. Speed is not measured here: that
needs a GPU (``tools/benchmark_attention.py --device cuda --backends tiled_bias``).
"""
import os
import re
import subprocess
import tempfile
from typing import Dict, List, NamedTuple, Optional

#: the kernels of :mod:`..attention.backends.tiled_bias.kernels`, by their ``LAUNCH`` name
KERNEL_NAMES = {'forward': '_forward_kernel', 'key_grad': '_key_grad_kernel', 'query_grad': '_query_grad_kernel'}
#: Triton's names of the input dtypes
TRITON_DTYPES = {'float32': 'fp32', 'float16': 'fp16', 'bfloat16': 'bf16'}
#: pointer arguments holding q, k, v or dO (the input dtype) and the int32 / uint8 tables; other pointers are float32
INPUT_POINTERS = ('q_ptr', 'k_ptr', 'v_ptr', 'do_ptr')
INT32_POINTERS = ('keys_ptr', 'centres_ptr')


class RegisterReport(NamedTuple):
    """``ptxas -v`` of one kernel, and the instructions of its main loop (per warp, one iteration)."""

    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    loop_instructions: int = 0


def _signature(arg_names: List[str], dtype: str, constants: Dict[str, object]) -> Dict[str, str]:
    """Triton's type of every argument of a kernel."""
    signature = {}
    for name in arg_names:
        if name in constants:
            signature[name] = 'constexpr'
        elif name in INPUT_POINTERS:
            signature[name] = '*' + TRITON_DTYPES[dtype]
        elif name in INT32_POINTERS:
            signature[name] = '*i32'
        elif name == 'pad_ptr':
            signature[name] = '*u8'
        elif name.endswith('_ptr'):
            signature[name] = '*fp32'
        else:
            signature[name] = 'fp32' if name == 'scale' else 'i32'
    return signature


def parse_ptxas(text: str) -> RegisterReport:
    """The registers, spills and stack of ``ptxas -v``'s report of one kernel."""

    def number(pattern: str) -> int:
        found = re.search(pattern, text)
        if found is None:
            raise ValueError(f'ptxas printed no {pattern!r}: {text[-2000:]}')
        return int(found.group(1))

    return RegisterReport(number(r'Used (\d+) registers'), number(r'(\d+) bytes spill stores'),
                          number(r'(\d+) bytes spill loads'), number(r'(\d+) bytes stack frame'))


def loop_instructions(sass: str) -> int:
    """The instructions (NOPs not counted) of the largest loop in ``nvdisasm`` output: the body from a label to
    the last branch back to it, inclusive. 0 without a loop."""
    labels: Dict[str, int] = {}
    instructions: List[str] = []
    for line in sass.splitlines():
        label = re.match(r'^(\.L_x_\d+):', line)
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        instruction = re.match(r'\s*/\*[0-9a-f]+\*/\s+([^;]*);', line)
        if instruction:
            instructions.append(instruction.group(1))
    largest = 0
    for index, text in enumerate(instructions):
        target = re.search(r'BRA\s+`\((\.L_x_\d+)\)', text)
        if target and labels.get(target.group(1), index + 1) <= index:
            body = instructions[labels[target.group(1)]:index + 1]
            largest = max(largest, sum('NOP' not in op for op in body))
    return largest


def compile_report(kernel: str, dtype: str, launch, head_dim: int = 32, num_grids: int = 2, num_segments: int = 2,
                   arch: int = 90, num_stages: Optional[int] = None) -> RegisterReport:
    """Compile one ``tiled_bias`` kernel for ``sm_<arch>`` and return what ``ptxas -v`` reports.

    Args:
        kernel (str): a key of :data:`KERNEL_NAMES`.
        dtype (str): a key of :data:`TRITON_DTYPES`.
        launch (Launch): tile sizes and warps.
        head_dim (int): d (rounded up as the backend does).
        num_grids, num_segments (int): the bias's window grids and key segments.
        arch (int): CUDA compute capability, e.g. 90 (``sm_90``), 80 (``sm_80``).
        num_stages (int, optional): default the kernels' ``NUM_STAGES``.
    """
    import triton
    import triton.backends.nvidia as nvidia
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ..attention.backends.tiled_bias import kernels
    fn = getattr(kernels, KERNEL_NAMES[kernel])
    constants = dict(NUM_GRIDS=num_grids, NUM_SEGMENTS=num_segments, HAS_PADDING=False,
                     PRECISION='tf32x3' if dtype == 'float32' else 'ieee', WIDEN=False, BLOCK_Q=launch.block_q,
                     BLOCK_K=launch.block_k, BLOCK_D=kernels.block_d(head_dim))
    if kernel == 'query_grad':
        constants['BLOCK_T'] = kernels.block_t(num_grids + num_segments)
    source = ASTSource(fn=fn, signature=_signature(fn.arg_names, dtype, constants),
                       constexprs={(fn.arg_names.index(name), ): value for name, value in constants.items()})
    stages = kernels.NUM_STAGES if num_stages is None else num_stages
    compiled = triton.compile(source, target=GPUTarget('cuda', arch, 32),
                              options=dict(num_warps=launch.num_warps, num_stages=stages))
    tools = os.path.join(os.path.dirname(nvidia.__file__), 'bin')
    suffix = 'a' if arch >= 90 else ''
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, 'kernel.ptx')
        with open(path, 'w') as f:
            f.write(compiled.asm['ptx'])
        result = subprocess.run([os.path.join(tools, 'ptxas'), '-v', f'--gpu-name=sm_{arch}{suffix}', path, '-o',
                                 os.devnull], capture_output=True, text=True)
        cubin = os.path.join(folder, 'kernel.cubin')
        with open(cubin, 'wb') as f:
            f.write(compiled.asm['cubin'])
        sass = subprocess.run([os.path.join(tools, 'nvdisasm'), '-c', cubin], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f'ptxas failed on {kernel} ({dtype}, {launch}): {result.stderr[-2000:]}')
    if sass.returncode != 0:
        raise RuntimeError(f'nvdisasm failed on {kernel} ({dtype}, {launch}): {sass.stderr[-2000:]}')
    return parse_ptxas(result.stderr)._replace(loop_instructions=loop_instructions(sass.stdout))
