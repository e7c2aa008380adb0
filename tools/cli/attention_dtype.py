"""The ``--attention-dtype`` option: the cross-attention's precision for a run (``tools/benchmark_model.py``,
``tools/check_gpu.py``)."""
import argparse

from projects.mmdet3d_plugin.attention.precision import ATTENTION_DTYPES


def add_attention_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--attention-dtype {auto,float16,bfloat16,float32}`` (default None: the configs' own, ``'auto'``)."""
    parser.add_argument('--attention-dtype', choices=list(ATTENTION_DTYPES), default=None,
                        help="precision of every cross-attention between its float32 projections (default: the "
                             "configs', 'auto': float16 on CUDA as upstream CMT, float32 on the CPU); float32 runs "
                             'the float32 pair')
