"""The options tools/train.py, tools/test.py and tools/init_checkpoint.py share.

The parsed options go to ``projects/mmdet3d_plugin/mmcv_custom/launch.py``
(``load_config``, ``resolve_work_dir``, ``init_distributed``).
"""
import argparse

from mmcv import DictAction


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--seed``, ``--deterministic``, ``--cfg-options``, ``--launcher`` and ``--local_rank`` to ``parser``."""
    parser.add_argument('--seed', type=int, default=0, help='random seed')
    parser.add_argument('--deterministic', action='store_true', help='deterministic cuDNN kernels')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, e.g. data.samples_per_gpu=1')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none',
                        help='job launcher (tools/dist_*.sh use pytorch)')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
