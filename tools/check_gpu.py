"""GPU self-check: the first command to run on a new GPU machine (see docs/gpu.md).

Examples::

    python tools/check_gpu.py                  # on the GPU: R50 and VoV shapes, every dtype
    python tools/check_gpu.py --device cpu     # tiny shapes on the CPU (seconds; run by the test suite)
    python tools/check_gpu.py --attention-dtype float32   # training and model benchmark in float32 attention

Checks, each printed as it runs: the attention backends' accuracy against
float64 ``math`` (every dtype and bias), the gradient of AQR's learned
``alpha``, ``--steps`` real training iterations of the demo model (on CUDA
with every host synchronisation outside the permitted regions an error), the
attention speed and memory table and, on CUDA, the CMT vs CMT-AQR model
benchmark (``projects/mmdet3d_plugin/diagnostics/gpu_check.py``). A check that
raises is reported with its traceback and the others still run; the exit
status is non-zero when any fails, and the summary names every failing case.
"""
import argparse
import sys
from typing import Optional, Sequence

import torch

from projects.mmdet3d_plugin.diagnostics.attention_cases import KEY_LAYOUTS
from projects.mmdet3d_plugin.diagnostics.gpu_check import TOLERANCES, GpuCheckOptions, failure_summary, run_gpu_checks
from tools.cli.attention_dtype import add_attention_dtype_argument


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Check the attention backends and the training path on this GPU.')
    parser.add_argument('--device', default='cuda', help="'cuda' (default) or 'cpu' (tiny shapes)")
    parser.add_argument('--layouts', nargs='+', choices=sorted(KEY_LAYOUTS), default=None,
                        help='key layouts (default: r50 vov on CUDA, quick on CPU)')
    parser.add_argument('--queries', type=int, default=None, help='queries (default 900 on CUDA, 12 on CPU)')
    parser.add_argument('--dtypes', nargs='+', choices=sorted(TOLERANCES), default=sorted(TOLERANCES))
    parser.add_argument('--steps', type=int, default=20, help='training iterations of the demo model')
    parser.add_argument('--repeats', type=int, default=5, help='timed runs per backend')
    parser.add_argument('--skip-benchmark', action='store_true')
    add_attention_dtype_argument(parser)
    args = parser.parse_args(argv)
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error('no CUDA device is visible to torch; run with --device cpu for the CPU self-test')
    tiny = args.device == 'cpu'
    args.layouts = args.layouts or (['quick'] if tiny else ['r50', 'vov'])
    args.queries = args.queries or (12 if tiny else 900)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    device_name = torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'
    print(f'# check_gpu: torch {torch.__version__}, device {device_name}, layouts {args.layouts}, '
          f'Q {args.queries}')
    summary, status = failure_summary(run_gpu_checks(GpuCheckOptions(**vars(args))))
    print(summary)
    return status


if __name__ == '__main__':
    sys.exit(main())
