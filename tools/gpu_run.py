"""The GPU run (docs/research/gpu_runs.md) as one command: its stages in order, every log and JSON file kept.

Examples::

    python tools/gpu_run.py --out gpu_run                                   # every stage
    python tools/gpu_run.py --out gpu_run --stages check accuracy --deadline 540
    python tools/gpu_run.py --dry-run                                       # the commands, nothing run

Stages: ``check`` (``check_gpu`` without the speed tables: its training check runs the demo model in float16
cross-attention under sync-debug ``error``), ``accuracy`` (half-precision cross-attention against float32:
``compare_attention_precision``; ``--trained`` adds a trained model), ``attention`` (the AQR biases in float16 at
the VoV shape against bias-free SDPA), ``model`` (CMT vs CMT-AQR at the R50 and VoV shapes, default
half-precision and float32 attention, batch 1 and 2), ``published`` (the R50 CMT-AQR and CMT configs trained 20
iterations from a synthetic nuScenes-mini with their fp16 hook, the host synchronisations listed) and ``mixed``
(the model benchmark in the configs' mixed precision). A command that fails does not stop the run.

``--deadline`` is the time the whole run may take: a command starts only with a minute left and is stopped when
the time is up. Writes ``OUT/<stage>.log``, the tools' JSON files and ``OUT/summary.md``: the machine, each
command's status and time, and the targets read from the JSON. Exits with status 1 when a command failed or did
not run. How: ``projects/mmdet3d_plugin/diagnostics/gpu_run_stages.py``.
"""
import argparse
import os
import os.path as osp
import shlex
import sys
from typing import Optional, Sequence

from projects.mmdet3d_plugin.diagnostics.gpu_run_stages import STAGES, run_stages, stage_commands, summary


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='The GPU run: every stage, its logs and JSON kept.')
    parser.add_argument('--out', default='gpu_run', help='folder for the logs, JSON files and summary.md')
    parser.add_argument('--stages', nargs='+', choices=STAGES, default=list(STAGES), help='stages to run, in order')
    parser.add_argument('--deadline', type=float, help='seconds the whole run may take (default: no limit)')
    parser.add_argument('--trained', nargs=2, metavar=('CONFIG', 'CHECKPOINT'),
                        help="a trained model the accuracy stage compares too (e.g. the demo's: "
                             'work_dirs/demo_cmt_aqr/cmt_aqr_synthetic_tiny_passes.py and its latest.pth)')
    parser.add_argument('--data-root', default='data/gpu_run_nuscenes_mini',
                        help='where the published stage writes its synthetic nuScenes-mini')
    parser.add_argument('--work-dir', default='work_dirs/gpu_run_published',
                        help="the published stage's training folders (checkpoints: not under --out)")
    parser.add_argument('--dry-run', action='store_true', help='print the commands and exit')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    args.out = osp.abspath(args.out)
    commands = stage_commands(args.out, args.data_root, args.work_dir, args.trained)
    if args.dry_run:
        for stage in args.stages:
            print('\n'.join(f'{stage}: python {shlex.join(command)}' for command in commands[stage]))
        return 0
    os.makedirs(args.out, exist_ok=True)
    results = run_stages(args.stages, commands, args.out, args.deadline)
    text = summary(results, args.out)
    with open(osp.join(args.out, 'summary.md'), 'w') as f:
        f.write(text)
    print('\n' + text)
    return 0 if all(result.status == 'ok' for result in results) else 1


if __name__ == '__main__':
    sys.exit(main())
