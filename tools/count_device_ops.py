"""Device ops (kernel launches on a GPU) of CMT and CMT-AQR's heads and optimizer steps, counted without a GPU.

Examples::

    python tools/count_device_ops.py                       # R50: CMT vs CMT-AQR, batch 1
    python tools/count_device_ops.py --shapes vov --batch-size 2
    python tools/count_device_ops.py --configs A.py B.py --tiny
    python tools/count_device_ops.py --prefer-backend tiled_bias   # the AQR biases through tiled_bias

The backbones run on the CPU; the head's forward (at inference; in training,
with the ground truth, then one optimizer step) runs on fake CUDA tensors
(``FakeTensorMode``), where every op that would launch device work is counted
(``projects/mmdet3d_plugin/utils/device_ops.py``); a backward cannot run on fake
CUDA, so it is not counted. Where
a GPU is launch-bound (the AQR weight generator at R50, the optimizer step),
the count says how much work the host queues; it is no time: time it with
``tools/benchmark_model.py --device cuda``.
"""
import argparse
import json
from typing import Optional, Sequence

from projects.mmdet3d_plugin.attention import BACKENDS, dispatch
from projects.mmdet3d_plugin.diagnostics.device_op_count import MODES, count_pair, count_table
from projects.mmdet3d_plugin.diagnostics.model_benchmark import SHAPES, ModelBenchmarkOptions, shape_configs


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Device ops of two detectors\' heads and optimizer steps on '
                                     'fake CUDA.')
    parser.add_argument('--shapes', nargs='+', choices=sorted(SHAPES), default=['r50'])
    parser.add_argument('--configs', nargs=2, metavar=('A', 'B'), help='two configs instead of --shapes')
    parser.add_argument('--modes', nargs='+', choices=MODES, default=list(MODES),
                        help='inference: the head\'s forward; train: its training forward and an optimizer step')
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--tiny', action='store_true', help='small range, images and query count (seconds)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--prefer-backend', choices=sorted(BACKENDS),
                        help="the attention backend 'auto' tries first for the AQR biases on CUDA (as "
                             'tools/benchmark_model.py --prefer-backend)')
    parser.add_argument('--out', help='write the counts as JSON here')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    if args.prefer_backend:
        dispatch.set_structured_bias_first('cuda', args.prefer_backend)
    options = ModelBenchmarkOptions(shapes=args.shapes, configs=args.configs, batch_size=args.batch_size,
                                    tiny=args.tiny, seed=args.seed).resolved()
    results = {}
    for shape, paths in shape_configs(options).items():
        print(f'## {shape}, batch {options.batch_size}: A = {paths[0]}, B = {paths[1]}\n', flush=True)
        results[shape] = count_pair(paths, options, args.modes)
        for mode, result in results[shape].items():
            print(f'{mode}:\n\n{count_table(result)}\n', flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(settings=dict(vars(args), batch_size=options.batch_size), results=results), f, indent=1)
    return results


if __name__ == '__main__':
    main()
