"""Where a training iteration's time goes: data loading, each module of CMT(-AQR), matching, backward, optimizer.

    python tools/profile_train_step.py CONFIG [--iters 10] [--warmup 2] [--workers N] [--cfg-options k=v ...]

Builds the config's training set and model as ``tools/train.py`` does (CPU),
runs ``--warmup`` + ``--iters`` iterations (AdamW step included) and prints a
Markdown table: mean seconds per iteration of each part and its share of the
iteration. Module rows are forward times measured with forward hooks (nested
rows — the AQR modules and the transformer inside the head — are part of
their parent's time); ``loss`` includes the Hungarian matching
(``assigner``); ``data`` is the time spent waiting for the next batch
(``projects/mmdet3d_plugin/diagnostics/train_step_profile.py``).
"""
import argparse
from typing import Dict, Optional, Sequence

import torch
from mmcv import DictAction

from projects.mmdet3d_plugin.diagnostics.train_step_profile import format_table, profile_train_step


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Profile the training iteration of a config (CPU)')
    parser.add_argument('config')
    parser.add_argument('--iters', type=int, default=10, help='timed iterations')
    parser.add_argument('--warmup', type=int, default=2, help='untimed iterations first')
    parser.add_argument('--workers', type=int, help="data loader workers (default: the config's)")
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config settings')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    args = parse_args(argv)
    if args.iters < 1:
        raise SystemExit('--iters must be >= 1')
    means, batch_size = profile_train_step(args.config, args.iters, args.warmup, args.seed, args.workers,
                                           args.cfg_options)
    print(f'\n{args.config}: {args.iters} iterations after {args.warmup} warm-up, '
          f'{torch.get_num_threads()} torch threads\n')
    print(format_table(means, batch_size))
    return means


if __name__ == '__main__':
    main()
