"""Can a router see a lie? Issue 68's step 0: a small probe of the per-query lie targets on a frozen checkpoint.

    python tools/probe_lie_router.py CONFIG CHECKPOINT [--out DIR] [--train-draws 2] [--val-draws 3]
        [--samples N] [--families logistic mlp] [--hidden 64] [--epochs 30]

On the lie study's data (the config's data root), every query of every training and validation sample, clean and
under seeded draws of ``lidar_ghost:3`` and ``view_yaw:2:20``, gives (a) what today's router sees (its hidden
state before the weight head, the query embedding, the mean of its BEV and camera windows) and (b) that plus the
disagreement of the LiDAR-only and camera-only decoding passes near the query and the windows' cosine similarity;
its targets: the LiDAR lies (a ghost's box within 2 m) and the camera lies (it projects into a yawed view).
Probes of the same family and size are fitted on the training queries for (a) and (b) and scored on the
validation queries with the balanced accuracy. The design goes on only if (b) beats (a) by >= 0.10 on ghost
queries. Writes ``lie_probe.md`` and ``lie_probe.json`` and caches the features under ``--out``
(``projects/mmdet3d_plugin/experiments/lie_probe_run.py``).
"""
import argparse
import sys
from typing import List, Optional

from projects.mmdet3d_plugin.experiments.lie_probe import PROBE_FAMILIES, ProbeSpec
from projects.mmdet3d_plugin.experiments.lie_probe_report import write_report
from projects.mmdet3d_plugin.experiments.lie_probe_run import (GHOST_CORRUPTION, YAW_CORRUPTION, ProbeRunOptions,
                                                               extract_features, score_probes)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Issue 68's step 0: probe the per-query lie targets from what the "
                                     'router sees (a) and with the modalities\' disagreement (b)')
    parser.add_argument('config', help='the checkpoint\'s config (the study dumps it next to the checkpoint)')
    parser.add_argument('checkpoint', help='a CMT-AQR checkpoint (the lie study\'s stage 1)')
    parser.add_argument('--out', default='work_dirs/lie_probe', help='feature cache and report folder '
                        '(default: work_dirs/lie_probe)')
    parser.add_argument('--ghost', default=GHOST_CORRUPTION, help=f'the LiDAR lie (default {GHOST_CORRUPTION})')
    parser.add_argument('--yaw', default=YAW_CORRUPTION, help=f'the camera lie (default {YAW_CORRUPTION})')
    parser.add_argument('--train-draws', type=int, default=2, help='seeded draws of each lie per training sample '
                        '(default 2)')
    parser.add_argument('--val-draws', type=int, default=3, help='per validation sample (default 3)')
    parser.add_argument('--samples', type=int, help='the first N samples of each split only (a quick check)')
    parser.add_argument('--families', nargs='+', choices=PROBE_FAMILIES, default=['mlp', 'logistic'],
                        help='probe families; the first decides (default: mlp logistic)')
    defaults = ProbeSpec()
    parser.add_argument('--hidden', type=int, default=defaults.hidden, help='MLP hidden units, the same for (a) and '
                        f'(b) (default {defaults.hidden})')
    parser.add_argument('--epochs', type=int, default=defaults.epochs, help=f'probe epochs (default {defaults.epochs};'
                        ' the best on held-out training samples is kept)')
    parser.add_argument('--seed', type=int, default=0, help='probe seed (default 0)')
    args = parser.parse_args(argv)
    for name in ('train_draws', 'val_draws', 'hidden', 'epochs'):
        if getattr(args, name) < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1')
    if args.samples is not None and args.samples < 2:
        parser.error('--samples must be >= 2 (the probe holds whole samples out)')
    args.command = ' '.join(['python tools/probe_lie_router.py'] + list(sys.argv[1:] if argv is None else argv))
    return args


def main(argv: Optional[List[str]] = None) -> List[dict]:
    args = parse_args(argv)
    options = ProbeRunOptions(config=args.config, checkpoint=args.checkpoint, out=args.out, ghost=args.ghost,
                              yaw=args.yaw, train_draws=args.train_draws, val_draws=args.val_draws,
                              samples=args.samples, families=args.families,
                              spec=ProbeSpec(hidden=args.hidden, epochs=args.epochs, seed=args.seed),
                              command=args.command)
    try:
        features = extract_features(options)
    except FileNotFoundError as error:
        raise SystemExit(f'probe_lie_router: {error}')
    rows = score_probes(options, features)
    setup = (f'Checkpoint `{args.checkpoint}`; every query of the training samples (clean, {args.train_draws} '
             f'draws of `{args.ghost}` and of `{args.yaw}`) fits the probes, the validation samples (clean, '
             f'{args.val_draws} draws each) score them. Balanced accuracy (positives / negatives): ghost queries are '
             f'the queries of the `{args.ghost}` samples against "the LiDAR lies" (a ghost\'s box within 2 m), '
             f'yawed-view queries those of the `{args.yaw}` samples against "the camera lies" (it projects into a '
             f'yawed view); all queries: every validation query, clean included. Probes: {", ".join(args.families)}'
             f' (MLP: {args.hidden} hidden units), standardised inputs, class-balanced loss, the epoch of the best '
             f'held-out balanced accuracy on a fifth of the training samples.')
    print(write_report(rows, args.out, args.command, setup))
    return rows


if __name__ == '__main__':
    main()
