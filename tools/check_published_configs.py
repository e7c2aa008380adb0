"""Run the published configs as a user would: distributed training, distributed testing, a nuScenes submission.

    python tools/check_published_configs.py --data-root DATA [--configs NAME ...] [--iters 2] [--processes 2]
                                            [--host-syncs] [--cfg-options KEY=VALUE ...]

For each config (default: the six ``configs/cmt_*.py`` and the ``configs/finetune/*.py``; a name such as
``cmt_aqr_voxel0100_r50_800x320_cbgs`` picks one; a fine-tune config trains from the checkpoint its CMT config's
check trained, that config trained first when not picked): ``tools/dist_train.sh``
for ``--iters`` iterations with the config's own pipeline and optimizer hook,
``tools/dist_test.sh ... --eval bbox`` and ``tools/test.py ... --format-only``;
then one table: seconds per iteration, peak memory, losses finite, NDS,
submission written; ``--host-syncs`` (on CUDA) also the host synchronisations per iteration after the
first, listed in each training log (``HostSyncReportHook``); ``--cfg-options`` changes every checked config
(e.g. ``model.img_backbone.with_cp=True`` for the VoV configs on a small host). ``DATA`` holds nuScenes (or a synthetic set of
``tools/make_synthetic_nuscenes.py``) prepared by ``tools/create_data.py``.
See docs/train_test.md.
"""
import argparse
import os.path as osp
import sys
from typing import List, Optional

from mmcv import DictAction

from projects.mmdet3d_plugin.experiments.published_configs import (FINETUNE_CONFIGS, PUBLISHED_CONFIGS, check_config,
                                                                   results_table, rows_as_json, source_config)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train, test and submit every published config for a few iterations.')
    parser.add_argument('--data-root', default='data/nuscenes/', help='prepared nuScenes data root')
    parser.add_argument('--configs', nargs='+', default=None,
                        help='config names or paths among the published and fine-tune configs (default: all)')
    parser.add_argument('--iters', type=int, default=2, help='training iterations per config')
    parser.add_argument('--processes', type=int, default=2, help='processes (GPUs) of dist_train.sh / dist_test.sh')
    parser.add_argument('--samples-per-gpu', type=int, default=None,
                        help="override the config's samples per process (default: the config's own)")
    parser.add_argument('--workers-per-gpu', type=int, default=None,
                        help="override the config's data-loading workers per process (default: the config's own)")
    parser.add_argument('--work-dir', default='work_dirs/published_configs', help='one folder per config inside')
    parser.add_argument('--json', default=None, help='also write the rows to this JSON file')
    parser.add_argument('--host-syncs', action='store_true', help='on CUDA: list the host synchronisations of the '
                        'iterations after the first in the training log (HostSyncReportHook) and count them')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default=None,
                        help='KEY=VALUE overrides of every checked config, as tools/train.py takes them')
    return parser.parse_args(argv)


def select_configs(names: Optional[List[str]]) -> List[str]:
    """The published configs named by ``names`` (file names with or without ``.py``, or paths); all by default."""
    if not names:
        return list(PUBLISHED_CONFIGS + FINETUNE_CONFIGS)
    by_name = {osp.splitext(osp.basename(path))[0]: path for path in PUBLISHED_CONFIGS + FINETUNE_CONFIGS}
    unknown = [name for name in names if osp.splitext(osp.basename(name))[0] not in by_name]
    if unknown:
        raise SystemExit(f'not published configs: {unknown}; choose among {sorted(by_name)}')
    return [by_name[osp.splitext(osp.basename(name))[0]] for name in names]


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.iters < 1 or args.processes < 1:
        raise SystemExit('--iters and --processes must be >= 1')
    rows = []
    configs = sorted(select_configs(args.configs), key=lambda config: config in FINETUNE_CONFIGS)  # sources first
    sources = [source for source in dict.fromkeys(map(source_config, configs)) if source and source not in configs]
    for config in sources + configs:
        train_only = config in sources
        print(f'\n== {config}: {args.iters} iterations in {args.processes} processes'
              + (' (trained only: the source of a fine-tune config)' if train_only else ''), flush=True)
        rows.append(check_config(config, args.data_root, args.work_dir, args.iters, args.processes,
                                 args.samples_per_gpu, args.workers_per_gpu, args.host_syncs, args.cfg_options,
                                 train_only=train_only))
        print(results_table(rows[-1:]), flush=True)
    print('\n' + results_table(rows))
    if args.json:
        with open(args.json, 'w') as f:
            f.write(rows_as_json(rows))
    return 1 if any(row.failed or not row.losses_finite for row in rows) else 0


if __name__ == '__main__':
    sys.exit(main())
