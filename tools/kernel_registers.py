"""Registers and spills of the tiled_bias Triton kernels per launch, compiled for a GPU without one.

Examples::

    # the launches the backend uses (tiled_bias/launch.py: LAUNCH), float32 and float16, sm_90
    python tools/kernel_registers.py
    # candidate tile sizes too, for sm_80
    python tools/kernel_registers.py --arch 80 --sweep

Prints a table: kernel, dtype, tile (queries x keys), warps, registers per
thread, spill stores / loads and stack bytes (``ptxas -v``), and the machine
instructions of the kernel's loop over tiles (per warp; ``nvdisasm``) with
what they make per score: loop x warps / (queries x keys), the issue slots a
score takes on a busy GPU (warps that repeat each other's rows raise it). No
speed: that needs a GPU (``tools/benchmark_attention.py --device cuda
--backends tiled_bias``).
"""
import argparse
from typing import List, Optional, Sequence

import torch

from projects.mmdet3d_plugin.diagnostics.kernel_registers import KERNEL_NAMES, TRITON_DTYPES, compile_report
from projects.mmdet3d_plugin.attention.backends.tiled_bias.launch import Launch, launch_of

#: tile sizes and warps tried by ``--sweep`` besides the backend's own
SWEEP = ((64, 64, 4), (64, 32, 4), (32, 64, 4), (32, 32, 4), (32, 32, 2), (16, 64, 4), (64, 16, 4), (64, 64, 8),
         (128, 32, 8))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Registers and spills of the tiled_bias kernels (ptxas -v).')
    parser.add_argument('--arch', type=int, default=90, help='compute capability (default 90: sm_90)')
    parser.add_argument('--dtypes', nargs='+', choices=sorted(TRITON_DTYPES), default=['float32', 'float16'])
    parser.add_argument('--kernels', nargs='+', choices=sorted(KERNEL_NAMES), default=list(KERNEL_NAMES))
    parser.add_argument('--head-dim', type=int, default=32)
    parser.add_argument('--grids', type=int, default=2, help='window grids of the bias (AQR: BEV and camera)')
    parser.add_argument('--segments', type=int, default=2, help='key segments of the bias (AQR: BEV and camera)')
    parser.add_argument('--sweep', action='store_true', help=f'also the tile sizes and warps {list(SWEEP)}')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> List[dict]:
    args = parse_args(argv)
    rows = []
    print(f'sm_{args.arch}, head dim {args.head_dim}, {args.grids} grids, {args.segments} segments\n')
    print('| kernel | dtype | queries x keys | warps | used by the backend | registers | spill stores / loads | '
          'stack | loop instructions per warp | per score |\n|---|---|---|---:|---|---:|---:|---:|---:|---:|')
    for kernel in args.kernels:
        for dtype in args.dtypes:
            own = launch_of(kernel, getattr(torch, dtype))
            launches = [own] + ([Launch(*c) for c in SWEEP if Launch(*c) != own] if args.sweep else [])
            for launch in launches:
                report = compile_report(kernel, dtype, launch, args.head_dim, args.grids, args.segments, args.arch)
                per_score = report.loop_instructions * launch.num_warps / (launch.block_q * launch.block_k)
                rows.append(dict(kernel=kernel, dtype=dtype, launch=launch._asdict(), **report._asdict(),
                                 instructions_per_score=per_score))
                print(f'| {kernel} | {dtype} | {launch.block_q} x {launch.block_k} | {launch.num_warps} | '
                      f'{"yes" if launch == own else ""} | {report.registers} | {report.spill_store_bytes} / '
                      f'{report.spill_load_bytes} B | {report.stack_bytes} B | {report.loop_instructions} | '
                      f'{per_score:.2f} |', flush=True)
    return rows


if __name__ == '__main__':
    main()
