"""Reproduce (or rule out) the spconv CPU sparse-convolution race: every conv vs a dense ``F.conv3d``.

    python tools/check_spconv_race.py [--configs CFG ...] [--runs 50] [--threads 1 2] [--load 2]
        [--scatter builtin patched] [--sites 4000] [--grid 128] [--out report.json]

For each config's ``pts_middle_encoder`` (its BEV grid cropped to ``--grid``
cells) the encoder runs ``--runs`` times on one fixed random input of
``--sites`` active voxels, and the output of every sparse convolution is
compared with a dense ``F.conv3d`` of the layer's own input, while ``--load``
busy-loop processes load the cores (the race only shows under CPU
contention). Each thread count runs in its own process with
``OMP_NUM_THREADS`` set. ``--scatter builtin`` runs spconv's own CPU sparse
convolutions (its compiled, racy scatter-add), ``patched`` the plugin's
race-free replacement (``projects/mmdet3d_plugin/diagnostics/spconv_race_check.py``).

Prints a table per config, thread count and scatter: runs with any wrong
layer, wrong layer outputs per layer type, the worst error relative to the
layer's output scale, and whether every run's encoder output is bit-identical
to the first. Exits 1 when the patched scatter gives a wrong or
non-reproducible result.
"""
import argparse
import json
import sys
from typing import Optional, Sequence

from projects.mmdet3d_plugin.diagnostics.spconv_race_check import (SCATTERS, RaceCheckOptions, check_spconv_race,
                                                                   format_table, patched_failures)

DEFAULTS = RaceCheckOptions()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='spconv CPU sparse convolutions vs dense conv3d, under CPU load')
    parser.add_argument('--configs', nargs='+', default=DEFAULTS.configs,
                        help='configs whose pts_middle_encoder is checked')
    parser.add_argument('--runs', type=int, default=DEFAULTS.runs,
                        help='encoder runs per config, thread count and scatter')
    parser.add_argument('--threads', type=int, nargs='+', default=DEFAULTS.threads, help='OMP_NUM_THREADS values')
    parser.add_argument('--load', type=int, default=DEFAULTS.load,
                        help='busy-loop processes loading the cores meanwhile')
    parser.add_argument('--scatter', nargs='+', choices=SCATTERS, default=DEFAULTS.scatter,
                        help="spconv's own CPU sparse convolutions (builtin) and/or the plugin's replacement (patched)")
    parser.add_argument('--sites', type=int, default=DEFAULTS.sites, help='active voxels of the random input')
    parser.add_argument('--grid', type=int, default=DEFAULTS.grid, help='largest BEV side of the cropped sparse grid')
    parser.add_argument('--seed', type=int, default=DEFAULTS.seed, help='seed of the random input')
    parser.add_argument('--out', help='also write the results as JSON here')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    results = check_spconv_race(RaceCheckOptions(**{k: v for k, v in vars(args).items() if k != 'out'}))
    print(format_table(results))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=2)
    failed = patched_failures(results)
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
