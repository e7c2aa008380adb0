"""A detector's scores and boxes with half-precision cross-attention against float32, on the same batch.

Examples::

    # on a GPU: both published CMT-AQR configs, random weights, float16 (the CUDA default) vs float32
    python tools/compare_attention_precision.py --device cuda
    # a trained model (every tensor of the config must be in the checkpoint)
    python tools/compare_attention_precision.py --device cuda --configs configs/demo/cmt_aqr_synthetic_tiny.py \\
        --checkpoint work_dirs/demo/latest.pth
    # tiny shapes on the CPU (seconds), bfloat16 too
    python tools/compare_attention_precision.py --tiny --configs configs/demo/cmt_aqr_synthetic_tiny.py \\
        --dtypes float16 bfloat16

Prints a Markdown table: per config, the float32 floor (float32 run twice)
and each half dtype against float32, with the largest change of any class
score and of the detections' centres, sizes, headings and velocities. Exits
with status 1 when a half run exceeds its tolerance. What each number is:
``projects/mmdet3d_plugin/diagnostics/precision_comparison.py``.
"""
import argparse
import dataclasses
import json
import logging
import sys
from typing import Optional, Sequence

import torch
from mmcv import DictAction

from projects.mmdet3d_plugin.diagnostics.model_benchmark import SHAPES, ModelBenchmarkOptions
from projects.mmdet3d_plugin.diagnostics.precision_comparison import TOLERANCES, compare_config, markdown_table

#: the published CMT-AQR configs (the B side of each benchmark shape)
DEFAULT_CONFIGS = [SHAPES[shape][1] for shape in sorted(SHAPES)]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Half-precision cross-attention against float32: scores and boxes.')
    parser.add_argument('--configs', nargs='+', default=DEFAULT_CONFIGS,
                        help='detector configs (default: the published CMT-AQR R50 and VoV configs)')
    parser.add_argument('--checkpoint', help='trained weights (one config only); default: random weights from --seed')
    parser.add_argument('--dtypes', nargs='+', choices=sorted(TOLERANCES), default=['float16'],
                        help='half dtypes to compare with float32 (default: float16, the CUDA default)')
    parser.add_argument('--device', default='cpu', help="'cpu' (default) or 'cuda'")
    parser.add_argument('--seed', type=int, default=0, help='weights and inputs')
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--tiny', action='store_true', help='small inputs and grids (tools/benchmark_model.py --tiny)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={}, metavar='KEY=VALUE',
                        help='override settings of every config')
    parser.add_argument('--out', help='write the rows as JSON here')
    args = parser.parse_args(argv)
    if args.checkpoint and len(args.configs) != 1:
        parser.error(f'--checkpoint needs exactly one config (got {len(args.configs)})')
    if args.batch_size < 1:
        parser.error('--batch-size must be >= 1')
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        parser.error('no CUDA device is visible to torch')
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.getLogger('mmcv').setLevel(logging.WARNING)  # init_weights lists every parameter at INFO
    options = ModelBenchmarkOptions(device=args.device, seed=args.seed, batch_size=args.batch_size, tiny=args.tiny,
                                    cfg_options=args.cfg_options)
    device_name = torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'
    print(f'# compare_attention_precision: torch {torch.__version__}, device {device_name}, '
          f'batch size {args.batch_size}, {"tiny" if args.tiny else "full"} shapes', flush=True)
    rows = []
    for config in args.configs:
        config_rows = compare_config(config, args.dtypes, options, args.checkpoint)
        rows += config_rows
        print(f'{config}: ' + ', '.join(f'{row["run"]} max |d score| {row["score"]:.2e}' for row in config_rows),
              flush=True)
    print('\n' + markdown_table(rows))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(torch=torch.__version__, device=device_name,
                           settings=dict(vars(args), options=dataclasses.asdict(options)), rows=rows), f, indent=1)
    failed = [f'{row["config"]} {row["run"]}: {"; ".join(row["failures"])}' for row in rows if row['failures']]
    print('\ncompare_attention_precision ' + ('passed' if not failed else
                                              f'FAILED ({len(failed)}):\n  ' + '\n  '.join(failed)))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
