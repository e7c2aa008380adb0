"""Does routing pay when sensors fail (``--design failures``) or lie (``--design lies``), or in a fine-tune from a
trained CMT (``--design finetune``)? Three seeds, one command.

    python tools/robustness_study.py [--design lies] [--quick] [--seeds 0 1 2] [--out DIR]
    make study [STUDY_ARGS="--shared-stage1"]     # study.md states the wall time its run took
    make study STUDY_ARGS="--out docs/robustness"  # regenerate the report docs/ ships

Arms (``projects/mmdet3d_plugin/experiments/study_arms.py``), all on ``make demo``'s
camera-pass detector but the camera-only model: a LiDAR-only and a camera-only
model (the same data and schedule), stage 1 (the detector with AQR's window
bias fixed: routing off), the control (stage 1 trained further with the
stage-2 corruptions, routing still off), a global gate (one weight pair per
sample, MoME's label), CMT-AQR (per-query router with per-query routing
targets; every stage-2 arm trains detector and router with the same
corruptions) and the oracle (CMT-AQR with the input's truth as routing).
Each evaluated clean and under every corruption of
``tools/eval_robustness.py`` with mAP, NDS, the recall at 2 m of the affected
objects, false positives per sample and the router's accuracy
(``apis/object_metrics.py``); ``study.md`` / ``study.json`` / the chart
(``experiments/study_report.py``) in ``--out`` (default ``<work dir>/report``). ``--design lies`` trains its arms
on the failures and the lies (ghosts, yawed views, a misaligned cloud, both at once) with targets that know where a
sensor lies, adds CMT-AQR with the muting bias and writes ``study_lies.md``; ``--design finetune`` fine-tunes stage 1
as the published fine-tune recipe with and without routing (``study_finetune.md``). The plan and its time estimate are
printed first; every step is skipped when its output exists, so a second run
continues (``experiments/robustness_study.py``). ``--quick`` runs the same steps on a
tiny set for a few iterations and four corruptions (the test suite runs it;
its numbers mean nothing; its trainings run in one process).
"""
import argparse
import os.path as osp
import sys
from dataclasses import fields
from typing import Dict, Optional, Sequence

from projects.mmdet3d_plugin.apis.object_metrics import MIN_LIDAR_POINTS, SCORE_THRESHOLD
from projects.mmdet3d_plugin.apis.robustness_eval import CLEAN
from projects.mmdet3d_plugin.experiments.demo_pipeline import DemoDataset, DemoStudyTools
from projects.mmdet3d_plugin.experiments.robustness_study import RobustnessStudy, StudyOptions
from projects.mmdet3d_plugin.experiments.study_arms import FINETUNE_TEST_CORRUPTIONS, STUDY_DESIGNS
from projects.mmdet3d_plugin.utils.repo_paths import REPO_ROOT
from tools.data_converter.synthetic.generator import GENERATOR_VERSION

QUICK_CORRUPTIONS = dict(failures=(CLEAN, 'lidar_drop', 'object_drop:0.5', 'mixed:120'),
                         lies=(CLEAN, 'lidar_ghost:3', 'view_yaw:2:20', 'mixed_lie:120'),
                         finetune=FINETUNE_TEST_CORRUPTIONS)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Does routing pay under sensor failures? The robustness study')
    parser.add_argument('--design', choices=sorted(STUDY_DESIGNS), default='failures', help='the study: sensors '
                        'that fail (default; report study.md), that lie (study_lies.md), or the fine-tune recipe '
                        'from a trained CMT (study_finetune.md)')
    parser.add_argument('--quick', action='store_true', help='a tiny set, a few iterations, four corruptions')
    parser.add_argument('--seeds', type=int, nargs='+', help='training seeds (default: 0 1 2; --quick: 0)')
    parser.add_argument('--scenes', type=int, help='synthetic scenes of 2 samples, a fifth for validation '
                        '(default 150, the demo has 100; --quick: 2)')
    parser.add_argument('--stage1-epochs', type=int, help='stage-1 training epochs (default 12; --quick: 2)')
    parser.add_argument('--stage2-epochs', type=int, help='epochs of every stage-2 arm and of the control '
                        '(default 4; --quick: 1)')
    parser.add_argument('--shared-stage1', action='store_true', help='train stage 1 once (first seed) and start '
                        'every seed\'s stage 2 from it (the spread then covers stage 2 only)')
    parser.add_argument('--image-drop', type=float, default=0.0, help='ModalMask3D: probability that a training '
                        'sample loses its images (default 0: make demo\'s recipe; upstream CMT: 0.25)')
    parser.add_argument('--lidar-drop', type=float, default=0.0, help='ModalMask3D: probability that a training '
                        'sample loses its points instead (default 0: make demo\'s recipe, whose frames without '
                        'points go to the camera pass; upstream CMT: 0.25)')
    parser.add_argument('--processes', type=int, help="data-parallel processes of every training (default: each "
                        "config's demo_processes on a machine without a GPU that has as many cores, else 1; "
                        "--quick: 1, which trains its few samples faster than two processes)")
    parser.add_argument('--corruptions', nargs='+', help="default: the design's list (failures: "
                        "tools/eval_robustness.py's)")
    parser.add_argument('--score-thr', dest='score_threshold', type=float, default=SCORE_THRESHOLD,
                        help='object metrics: lowest score of '
                        f'a counted detection (default {SCORE_THRESHOLD})')
    parser.add_argument('--min-lidar-points', type=int, default=MIN_LIDAR_POINTS, help='object metrics: points a '
                        f'box must hold for LiDAR to see its object (default {MIN_LIDAR_POINTS})')
    parser.add_argument('--no-attention-mass', dest='attention_mass', action='store_false',
                        help='object metrics without the fused cross-attention\'s mass on the dead sensor\'s keys '
                        '(dense attention probabilities at evaluation)')
    parser.add_argument('--picture-sample', type=int, default=0, help='validation sample of the routing pictures')
    parser.add_argument('--data-root', help='default: data/synthetic_study (--quick: data/synthetic_study_quick)')
    parser.add_argument('--work-dir', help='default: work_dirs/<report> (study, study_lies; --quick: '
                        'work_dirs/<report>_quick)')
    parser.add_argument('--out', help='report folder (default: <work dir>/report; docs/robustness regenerates the '
                        'report the documentation ships)')
    args = parser.parse_args(argv)
    args.command = ' '.join(['python tools/robustness_study.py'] + list(sys.argv[1:] if argv is None else argv))
    quick = args.quick
    args.seeds = args.seeds or ([0] if quick else [0, 1, 2])
    args.scenes = args.scenes or (2 if quick else 150)
    args.stage1_epochs = args.stage1_epochs or (2 if quick else 12)
    args.stage2_epochs = args.stage2_epochs or (1 if quick else 4)
    if args.processes is None and quick:
        args.processes = 1
    design = STUDY_DESIGNS[args.design]
    args.corruptions = [CLEAN] + [spec for spec in args.corruptions or (QUICK_CORRUPTIONS[args.design] if quick
                                                                         else design.corruptions) if spec != CLEAN]
    args.data_root = args.data_root or ('data/synthetic_study_quick' if quick else 'data/synthetic_study')
    args.work_dir = args.work_dir or f'work_dirs/{design.report}' + ('_quick' if quick else '')
    args.out = args.out or osp.join(args.work_dir, 'report')
    return args


def study_options(args: argparse.Namespace) -> StudyOptions:
    """The parsed arguments as the study's options."""
    return StudyOptions(**{field.name: getattr(args, field.name) for field in fields(StudyOptions)})


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, dict]:
    args = parse_args(argv)
    # the demo's generator with --scenes
    tools = DemoStudyTools(DemoDataset(args.data_root, args.scenes, samples=2, seed=0,
                                       generator_version=GENERATOR_VERSION), args.processes)
    return RobustnessStudy(study_options(args), tools, REPO_ROOT).run()


if __name__ == '__main__':
    main()
