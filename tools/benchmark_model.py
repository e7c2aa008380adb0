"""Paired benchmark of two detector configs (default: CMT vs CMT-AQR) on fixed synthetic inputs.

Examples::

    # R50 800x320 (voxel 0.1) and VoV 1600x640 (voxel 0.075), inference and a training step, 5 pairs each
    python tools/benchmark_model.py --threads 2 --out bench.json
    # R50 inference only, 3 pairs
    python tools/benchmark_model.py --shapes r50 --modes inference --pairs 3
    # VoV training step with the image backbone frozen (the full step needs far more host memory)
    python tools/benchmark_model.py --shapes vov --modes train --freeze img_backbone
    # the full VoV training step, with the image backbone's activations checkpointed (less memory)
    python tools/benchmark_model.py --shapes vov --modes train --cfg-options model.img_backbone.with_cp=True
    # on a GPU: half-precision cross-attention (the default, as upstream CMT), then the float32 pair
    python tools/benchmark_model.py --device cuda --pairs 3
    python tools/benchmark_model.py --device cuda --pairs 3 --attention-dtype float32  # or --mixed-precision
    # any two configs; tiny shapes (seconds)
    python tools/benchmark_model.py --configs A.py B.py --tiny

B gets A's weights, both run the same fixed synthetic batch, alternately
(A B A B ...) after the warm-up; the tables give each one's median time, the
median of the paired ratios B/A with their min and max, the peak memory and
the mean milliseconds of every part (indented rows are part of the row above
them); each row states the attention kernels and precision each model ran. How
each number is measured: ``projects/mmdet3d_plugin/diagnostics/model_benchmark.py``.
"""
import argparse
import json
from typing import Optional, Sequence

import torch
from mmcv import DictAction

from projects.mmdet3d_plugin.attention import BACKENDS, dispatch
from projects.mmdet3d_plugin.attention.slots.window_slots import (FORMULATION_NAMES, default_formulation,
                                                                              set_formulation)
from projects.mmdet3d_plugin.diagnostics.model_benchmark import (MODES, SHAPES, TINY, ModelBenchmarkOptions,
                                                                 run_model_benchmark)
from projects.mmdet3d_plugin.diagnostics.model_benchmark_tables import markdown_tables
from tools.cli.attention_dtype import add_attention_dtype_argument
from tools.cli.tiled_bias_launch import add_tiled_bias_launch_argument, apply_tiled_bias_launches

DEFAULTS = ModelBenchmarkOptions()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Paired benchmark of two detector configs (CMT vs CMT-AQR).')
    parser.add_argument('--shapes', nargs='+', choices=sorted(SHAPES), default=DEFAULTS.shapes,
                        help='config pairs to compare (default: r50 vov)')
    parser.add_argument('--configs', nargs=2, metavar=('A', 'B'), help='compare these two configs instead')
    parser.add_argument('--modes', nargs='+', choices=MODES, default=DEFAULTS.modes)
    parser.add_argument('--pairs', type=int, default=DEFAULTS.pairs, help='timed (A, B) pairs per shape and mode')
    parser.add_argument('--warmup', type=int, default=DEFAULTS.warmup, help='untimed runs of each model first')
    parser.add_argument('--threads', type=int, help='torch.set_num_threads (default: torch\'s)')
    parser.add_argument('--device', default=DEFAULTS.device, help="'cpu' (default) or 'cuda'")
    parser.add_argument('--seed', type=int, default=DEFAULTS.seed, help='weights and inputs')
    parser.add_argument('--batch-size', type=int, default=DEFAULTS.batch_size)
    parser.add_argument('--boxes', type=int, help='ground-truth boxes per sample (default 30)')
    parser.add_argument('--points', type=int, help='LiDAR points per sample, around the boxes (default 30000)')
    parser.add_argument('--image-size', type=int, nargs=2, metavar=('H', 'W'),
                        help="camera image size (default: the config's)")
    parser.add_argument('--range', type=float, dest='half_range', metavar='METRES',
                        help="half side of the point cloud range, voxel size kept (default: the config's)")
    parser.add_argument('--queries', type=int, help="the head's queries (default: the config's)")
    parser.add_argument('--freeze', nargs='+', default=[], metavar='MODULE',
                        help='detector submodules (e.g. img_backbone) whose parameters do not train, in A and B: '
                             'their backward is skipped, so a training step needs far less memory')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={}, metavar='KEY=VALUE',
                        help='override settings of both configs, e.g. model.img_backbone.with_cp=True (activation '
                             'checkpointing: the full VoV training step in less memory)')
    parser.add_argument('--tiny', action='store_true',
                        help=f'small inputs and grids for a smoke run ({TINY}); explicit options win')
    parser.add_argument('--memory', choices=('auto', 'none'), default=DEFAULTS.memory,
                        help='peak memory: auto (CUDA allocator stats, or a separate CPU process) or none')
    parser.add_argument('--keep-freed-memory', action='store_true',
                        help='on the CPU, have glibc keep freed memory in the timing process: no page faults of '
                             'memory returned between steps, which otherwise move parts with the same code in both '
                             'models by hundreds of ms (docs/performance.md); both models run faster, so the ratio '
                             'is of another base')
    parser.add_argument('--slot-formulation', choices=FORMULATION_NAMES,
                        help="the window slot products of the local bias and the router's window attention on "
                             "--device (default: 'sparse' on the CPU, 'triton' on CUDA (the fused kernels; "
                             "'gather' without the triton package), 'gather' elsewhere)")
    parser.add_argument('--prefer-backend', choices=sorted(BACKENDS),
                        help="the attention backend 'auto' tries first for the AQR biases on --device (e.g. "
                             "tiled_bias: the bias inside the kernel's tiles, CUDA only); calls it cannot run fall "
                             'back to the usual choice, logged')
    add_tiled_bias_launch_argument(parser)
    add_attention_dtype_argument(parser)
    parser.add_argument('--mixed-precision', action='store_true', help="(CUDA) as the configs' fp16 optimizer hook")
    parser.add_argument('--out', help='write the results as JSON here')
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.warmup < 0 or (args.boxes is not None and args.boxes < 1):
        parser.error('--pairs and --boxes must be >= 1 and --warmup >= 0')
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        parser.error('no CUDA device is visible to torch')
    if args.mixed_precision and not args.device.startswith('cuda'):
        parser.error("--mixed-precision needs --device cuda (on the CPU the configs' fp16 hook trains in fp32)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    if args.slot_formulation:
        set_formulation(args.device, args.slot_formulation)
    if args.prefer_backend:
        dispatch.set_structured_bias_first(torch.device(args.device).type, args.prefer_backend)
    apply_tiled_bias_launches(args.tiled_bias_launch)
    tool_only = ('out', 'slot_formulation', 'prefer_backend', 'tiled_bias_launch')
    report = run_model_benchmark(ModelBenchmarkOptions(**{k: v for k, v in vars(args).items() if k not in tool_only}))
    report['settings'].update(out=args.out, slot_formulation=default_formulation(args.device),
                              prefer_backend=args.prefer_backend, tiled_bias_launch=args.tiled_bias_launch)
    print('\n' + markdown_tables(report['results']))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == '__main__':
    main()
