"""The benchmarks' ``--tiled-bias-launch`` option: other tile sizes for the ``tiled_bias`` kernels, for a timed sweep
on a GPU (``tools/benchmark_attention.py``, ``tools/benchmark_model.py``)."""
import argparse
from typing import Optional, Sequence

from projects.mmdet3d_plugin.attention.backends.tiled_bias.launch import parse_launch, set_launch


def add_tiled_bias_launch_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--tiled-bias-launch KERNEL=QxKxW [...]`` to a tool's parser."""
    parser.add_argument('--tiled-bias-launch', nargs='+', metavar='KERNEL=QxKxW', default=None,
                        help='tile sizes and warps of the tiled_bias kernels for this run, both precisions, e.g. '
                             'forward=64x32x4 key_grad=32x64x4 query_grad=16x64x4 (default: tiled_bias/launch.py; '
                             'tools/kernel_registers.py --sweep says which spill registers)')


def apply_tiled_bias_launches(texts: Optional[Sequence[str]]) -> None:
    """Set every launch of ``--tiled-bias-launch`` (a ValueError names a malformed one before anything runs)."""
    launches = [parse_launch(text) for text in texts or ()]
    for kernel, launch in launches:
        set_launch(kernel, launch)
