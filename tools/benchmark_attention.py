"""Benchmark the bias-aware attention backends at CMT-AQR's real shapes.

Examples::

    # the table of docs/attention.md: CPU fp32, 900 queries x 56 400 keys x 8 heads, bs 1
    python tools/benchmark_attention.py --layouts vov --queries 900 --batch-sizes 1 --out bench.json
    # everything the issue lists (Q 900/1800, K 22 384/56 400, bs 1/2): long on CPU
    python tools/benchmark_attention.py
    # a small smoke run (seconds)
    python tools/benchmark_attention.py --quick
    # where backend='auto' switches from dense sdpa to segment (docs/attention.md, "auto by size")
    python tools/benchmark_attention.py --crossover

Each backend's median time, its median paired ratio to bias-free SDPA and its
peak memory beyond its inputs, per shape, bias and pass; then the bias
construction times (structured, densified, the seed design's per-query loop).
``--crossover`` tabulates the cases by dense size ``bs * heads * Q * K`` with
the backend ``auto`` picks. How each number is measured:
``projects/mmdet3d_plugin/diagnostics/attention_benchmark.py``.
"""
import argparse
import json
import sys
from typing import Optional, Sequence

import torch

from projects.mmdet3d_plugin.attention.slots.window_slots import FORMULATION_NAMES, set_formulation
from projects.mmdet3d_plugin.diagnostics.attention_benchmark import BenchmarkOptions, run_attention_benchmark
from projects.mmdet3d_plugin.diagnostics.attention_benchmark_tables import benchmark_report
from projects.mmdet3d_plugin.diagnostics.attention_cases import DTYPES, KEY_LAYOUTS, SEGMENT_WITH_RECOMPUTE
from tools.cli.tiled_bias_launch import add_tiled_bias_launch_argument, apply_tiled_bias_launches

DEFAULTS = BenchmarkOptions()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Benchmark the attention backends with AQR biases.')
    parser.add_argument('--layouts', nargs='+', choices=sorted(KEY_LAYOUTS), default=None,
                        help='key layouts: r50 = BEV 128x128 + 6x20x50 camera (K=22384), '
                        'vov = 180x180 + 6x40x100 (K=56400), demo = 32x32 + 6x6x12 (K=1456), '
                        'quick = 12x16 + 2x6x10 (K=312); default r50 vov (--crossover: quick demo r50)')
    parser.add_argument('--queries', nargs='+', type=int, default=None,
                        help='default 900 1800 (--crossover: 12 50 200 900)')
    parser.add_argument('--batch-sizes', nargs='+', type=int, default=None, help='default 1 2 (--crossover: 2)')
    parser.add_argument('--heads', type=int, default=None, help='default 8 (--crossover: per layout, LAYOUT_DIMS)')
    parser.add_argument('--head-dim', type=int, default=None, help='default 32 (--crossover: per layout)')
    parser.add_argument('--biases', nargs='+', choices=['global', 'local'], default=DEFAULTS.biases)
    parser.add_argument('--passes', nargs='+', choices=['fwd', 'fwdbwd'], default=DEFAULTS.passes)
    parser.add_argument('--backends', nargs='+', default=None,
                        help='backends to time (default: segment, segment+recompute, flashbias, sdpa; cuda adds '
                        'tiled_bias, flex, flash_attn); '
                        f'{SEGMENT_WITH_RECOMPUTE!r} adds the cost of segment\'s accelerator recomputation')
    parser.add_argument('--repeats', type=int, default=DEFAULTS.repeats,
                        help='timed runs per backend (median reported)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', choices=sorted(DTYPES), default=None,
                        help='default float32 on CPU, float16 on CUDA')
    parser.add_argument('--window-size', type=int, default=None, help='default 15 (--crossover: per layout)')
    parser.add_argument('--memory', choices=['auto', 'rss', 'cuda', 'none'], default=DEFAULTS.memory,
                        help='peak memory: rss (CPU, a subprocess per case), cuda, none; auto picks by device')
    parser.add_argument('--seed-loop-queries', type=int, default=DEFAULTS.seed_loop_queries,
                        help='queries on which the seed per-query loop is timed before extrapolating')
    parser.add_argument('--no-construction', action='store_true', help='skip the bias construction timings')
    parser.add_argument('--quick', action='store_true',
                        help='tiny shapes, every backend, 3 repeats, no memory: a smoke test in seconds')
    parser.add_argument('--crossover', action='store_true',
                        help="where backend='auto' switches from a dense exact path to segment: segment, sdpa "
                        '(dense bias) and flashbias against bias-free SDPA from tiny decoders to R50, by '
                        'dense size bs*heads*Q*K, with the pick of auto (no memory, no construction)')
    parser.add_argument('--min-sample-ms', type=float, default=None,
                        help='repeat each call in a timed sample until it lasts about this long (default 0: one '
                        'call; --crossover: 20), so that sub-millisecond calls are timed above the clock noise')
    parser.add_argument('--seed', type=int, default=DEFAULTS.seed)
    parser.add_argument('--slot-formulation', choices=FORMULATION_NAMES,
                        help="the window slot products of the local bias and the router's window attention on "
                             "--device (default: 'sparse' on the CPU, 'triton' on CUDA (the fused kernels; "
                             "'gather' without the triton package), 'gather' elsewhere)")
    add_tiled_bias_launch_argument(parser)
    parser.add_argument('--out', default=None, help='write the results as JSON here')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    if args.slot_formulation:
        set_formulation(args.device, args.slot_formulation)
    apply_tiled_bias_launches(args.tiled_bias_launch)
    options = BenchmarkOptions(**{key: value for key, value in vars(args).items()
                                  if key not in ('out', 'slot_formulation', 'tiled_bias_launch')})
    command = ' '.join(['tools/benchmark_attention.py'] + list(sys.argv[1:] if argv is None else argv))
    result = run_attention_benchmark(options, command)
    print()
    print(benchmark_report(result))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == '__main__':
    main()
