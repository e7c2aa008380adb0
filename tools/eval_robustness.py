"""Robustness of a CMT / CMT-AQR checkpoint: nuScenes mAP and NDS under every test-time sensor corruption.

    python tools/eval_robustness.py CONFIG CHECKPOINT [--corruptions clean camera_drop fov:120 ...]
        [--routing learned oracle] [--out DIR] [--samples N] [--corruption-seed S] [--cfg-options k=v ...]

The model is built and loaded once; for each corruption the test dataset is
rebuilt with a ``SensorCorruption`` step right after its loading steps (as
``tools/test.py --corruption`` does), the model runs over it and the
official nuScenes devkit evaluates the boxes. A corruption that fails is
reported as failed with its error, and the others still run.

Writes ``robustness.md`` (a Markdown table: mAP, NDS and their change from
``clean`` per corruption) and ``robustness.json`` to ``--out`` (default
``work_dirs/<config name>/robustness``) and prints the table.
``--samples N`` evaluates the first N test samples only (the devkit's ground
truth is narrowed to the same samples). ``--routing learned oracle``
evaluates a CMT-AQR model twice per corruption: with its router's weights and
with the input's truth: the headroom routing could add (``oracle_objects``:
the truth counting only LiDAR points above the local ground; ``oracle_lies``:
that truth with the lying sensors muted); each routing's
deltas are against its own clean run. ``--object-metrics`` adds, per
corruption, the recall at 2 m of the objects it affected, the false positives
per sample (and those within 2 m of a ghost: ``lidar_ghost``, ``mixed_lie``)
and the router's accuracy against the per-query routing targets
(``projects/mmdet3d_plugin/apis/object_metrics.py``; detections counted from
``--score-thr``), against the clean run, which then runs first
(``projects/mmdet3d_plugin/apis/robustness_eval.py``).
"""
import argparse
from typing import List, Optional

from mmcv import DictAction
from mmdet.utils import get_root_logger

from projects.mmdet3d_plugin.apis.object_metrics import MIN_LIDAR_POINTS, SCORE_THRESHOLD
from projects.mmdet3d_plugin.apis.robustness_eval import (CLEAN, DEFAULT_CORRUPTIONS, CorruptionResult,
                                                          RobustnessOptions, evaluate_robustness, markdown_table)
from projects.mmdet3d_plugin.models.dense_heads.query_router import TEST_ROUTINGS
from tools.cli.corruption import robustness_spec


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='nuScenes mAP / NDS of a detector under test-time sensor corruptions')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--corruptions', nargs='+', type=robustness_spec, default=list(DEFAULT_CORRUPTIONS),
                        metavar='SPEC', help=f'"clean" and corruption specs to evaluate, in order (default: '
                        f'{" ".join(DEFAULT_CORRUPTIONS)})')
    parser.add_argument('--routing', nargs='+', choices=TEST_ROUTINGS, default=['learned'],
                        help='AQR routing(s) to evaluate: the router\'s weights and/or the oracle\'s')
    parser.add_argument('--out', help='output folder (default: work_dirs/<config name>/robustness)')
    parser.add_argument('--samples', type=int, help='evaluate the first N test samples only')
    parser.add_argument('--corruption-seed', type=int, default=0,
                        help='seed of the random corruptions (all but lidar_drop, camera_drop, view_drop, fov, beams)')
    parser.add_argument('--seed', type=int, default=0, help='random seed')
    parser.add_argument('--object-metrics', action='store_true', help='also the recall at 2 m of the objects each '
                        'corruption affected, false positives per sample (all, and within 2 m of a ghost) and the '
                        'router\'s accuracy (needs clean)')
    parser.add_argument('--score-thr', type=float, default=SCORE_THRESHOLD,
                        help=f'--object-metrics: lowest score a detection counts with (default {SCORE_THRESHOLD})')
    parser.add_argument('--min-lidar-points', type=int, default=MIN_LIDAR_POINTS, help='--object-metrics: points '
                        f'a box must hold for LiDAR to see its object (default {MIN_LIDAR_POINTS})')
    parser.add_argument('--attention-mass', action='store_true', help='--object-metrics: also the share of the '
                        'fused cross-attention on the dead sensor\'s keys (dense attention probabilities, slower)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config settings')
    args = parser.parse_args(argv)
    if args.samples is not None and args.samples < 1:
        parser.error(f'--samples must be >= 1, got {args.samples}')
    duplicates = sorted({spec for spec in args.corruptions if args.corruptions.count(spec) > 1})
    if duplicates:
        parser.error(f'--corruptions lists {duplicates} more than once')
    if args.attention_mass and not args.object_metrics:
        parser.error('--attention-mass is an object metric: add --object-metrics')
    if args.object_metrics and CLEAN not in args.corruptions:
        parser.error(f'--object-metrics compares every corruption with the clean inputs: add {CLEAN} to --corruptions')
    return args


def main(argv: Optional[List[str]] = None) -> List[CorruptionResult]:
    results, paths = evaluate_robustness(RobustnessOptions(**vars(parse_args(argv))))
    print(markdown_table(results))
    get_root_logger().info(f'wrote {" and ".join(paths)}')
    return results


if __name__ == '__main__':
    main()
