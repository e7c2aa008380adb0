"""The end-to-end demo on synthetic nuScenes (``make demo``): data → train → official evaluation.

    python tools/demo.py [--model cmt_aqr|cmt_aqr_fused|cmt|cmt_camera] [--work-dir DIR] [--epochs N]

Steps, each printed as it starts and skipped when its output is already there
(so a second run, or a run after an interruption, continues where it stopped):

1. ``tools/make_synthetic_nuscenes.py``: a small dataset in the nuScenes v1.0 format
   (many short scenes, for many different layouts; official v1.0-trainval scene names);
2. ``tools/create_data.py nuscenes``: info files and the GT database;
3. ``tools/init_checkpoint.py`` + ``tools/test.py --eval bbox``: the untrained model's metrics;
4. ``tools/train.py --auto-resume``: trains the tiny model (progress and ETA in the log lines); a config
   that sets ``demo_processes = N`` (its recipe written for N processes of ``samples_per_gpu`` samples, as
   mmdet's ``8x2`` configs) trains, on a machine without a GPU that has N cores, as N data-parallel processes
   (``torch.distributed.run``, gloo) with the cores split between them (PyTorch's CPU kernels at the demo's
   sizes keep 2 threads of one process about 1.3 cores busy; see ``--processes``);
5. ``tools/test.py --eval bbox``: the trained model, scored by the nuScenes devkit's ``DetectionEval``;

then prints the metrics of both models side by side and where the logs,
TensorBoard events and checkpoints are. The tools run on a copy of the demo
config pointed at ``--data-root`` (``<work dir>/<config name>.py``).
"""
import argparse
import glob
import hashlib
import json
import os
import os.path as osp
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
# cmt_aqr: CMT-AQR with a camera decoding pass (its cameras detect alone); cmt_aqr_fused: the same detector
# decoding the fused pass only (the robustness study's stage-1 base).
CONFIGS = dict(cmt_aqr='configs/demo/cmt_aqr_synthetic_tiny_passes.py',
               cmt_aqr_fused='configs/demo/cmt_aqr_synthetic_tiny.py', cmt='configs/demo/cmt_synthetic_tiny.py',
               cmt_camera='configs/demo/cmt_camera_synthetic_tiny.py')
# v1.0-trainval: its official scene names allow more than the 10 scenes of v1.0-mini.
DEMO_VERSION = 'v1.0-trainval'
# The demo configs detect within +-25.6 m of the ego; objects stay inside with room for their size.
OBJECT_RANGE_M = 22.0
METRIC_PREFIX = 'pts_bbox_NuScenes/'
SUMMARY_METRICS = ('mAP', 'NDS', 'mATE', 'mASE', 'mAOE', 'mAVE', 'mAAE')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Synthetic nuScenes demo: generate, train, evaluate')
    parser.add_argument('--model', choices=sorted(CONFIGS), default='cmt_aqr',
                        help='cmt_aqr (default: CMT-AQR with a camera pass), cmt_aqr_fused (its fused pass only), the '
                             'baseline cmt, or the camera-only cmt_camera, trained on identical data')
    parser.add_argument('--data-root', default='data/synthetic_nuscenes', help='where the synthetic set is written')
    parser.add_argument('--work-dir', help='logs, checkpoints and metrics (default: work_dirs/demo_<model>)')
    parser.add_argument('--epochs', type=int, help="training epochs (default: the demo config's)")
    parser.add_argument('--scenes', type=int, default=100, help='synthetic scenes (a fifth of them for validation)')
    parser.add_argument('--samples', type=int, default=2, help='key frames per scene')
    parser.add_argument('--seed', type=int, default=0, help='seed of the data generator and of training')
    parser.add_argument('--processes', type=int,
                        help="data-parallel training processes, each of the config's samples_per_gpu; default: the "
                             "config's demo_processes on a machine without a GPU that has as many cores, else 1")
    parser.add_argument('--cfg-options', nargs='+', default=[], help='passed on to tools/train.py and tools/test.py')
    return parser.parse_args(argv)


def banner(step: int, total: int, text: str) -> None:
    print(f'\n[demo {step}/{total}] {text}', flush=True)


def run(command: List[str], env: Optional[Dict[str, str]] = None) -> None:
    """Run a tool of this repository with the same interpreter (and ``env`` added to the environment); stop the
    demo naming the step if it fails."""
    assignments = [f'{name}={value}' for name, value in (env or {}).items()]
    print('  $ ' + ' '.join(assignments + command), flush=True)
    result = subprocess.run([sys.executable] + command, cwd=REPO_ROOT, env=dict(os.environ, **(env or {})))
    if result.returncode != 0:
        raise SystemExit(f'demo stopped: `{" ".join(command)}` exited with code {result.returncode}')


def dataset_arguments(args: argparse.Namespace) -> List[str]:
    """The generator's options; the demo config reads 384 x 216 images and 3 sweeps."""
    return ['--root', args.data_root, '--version', DEMO_VERSION, '--scenes', str(args.scenes), '--samples',
            str(args.samples), '--seed', str(args.seed), '--image-size', '384', '216', '--lidar-azimuths', '360',
            '--sweeps', '3', '--object-range', str(OBJECT_RANGE_M)]


def dataset_stamp(args: argparse.Namespace) -> dict:
    """What identifies the demo's dataset: the generator's version and options, and create_data's options."""
    from tools.data_converter.synthetic.generator import GENERATOR_VERSION
    return dict(generator=dataset_arguments(args), generator_version=GENERATOR_VERSION, infos='--max-sweeps 3')


def prepare_data(args: argparse.Namespace, total: int) -> None:
    """Steps 1 and 2, skipped when the stamp of the previous run has the same generator options."""
    stamp = osp.join(REPO_ROOT, args.data_root, '.demo_dataset.json')
    wanted = dataset_stamp(args)
    if osp.exists(stamp) and read_json(stamp) == wanted:
        banner(1, total, f'synthetic nuScenes already in {args.data_root} (delete it to regenerate)')
        banner(2, total, 'info files and GT database already created')
        return
    banner(1, total, f'generating synthetic nuScenes in {args.data_root}')
    run(['tools/make_synthetic_nuscenes.py'] + dataset_arguments(args))
    banner(2, total, 'creating the info files and the GT database')
    run(['tools/create_data.py', 'nuscenes', '--root-path', args.data_root, '--out-dir', args.data_root,
         '--extra-tag', 'nuscenes', '--version', DEMO_VERSION, '--max-sweeps', '3'])
    write_json(stamp, wanted)


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def write_json(path: str, value) -> None:
    with open(path, 'w') as f:
        json.dump(value, f)


def latest_metrics(eval_dir: str) -> Optional[Dict[str, float]]:
    """The metrics of the newest ``eval_*.json`` that tools/test.py wrote in ``eval_dir``, if any."""
    files = sorted(glob.glob(osp.join(eval_dir, 'eval_*.json')))
    return read_json(files[-1])['metrics'] if files else None


def evaluate(config: str, checkpoint: str, eval_dir: str, cfg_options: List[str]) -> Dict[str, float]:
    run(['tools/test.py', config, checkpoint, '--eval', 'bbox', '--work-dir', eval_dir]
        + (['--cfg-options'] + cfg_options if cfg_options else []))
    metrics = latest_metrics(osp.join(REPO_ROOT, eval_dir))
    if metrics is None:
        raise SystemExit(f'demo stopped: tools/test.py wrote no eval_*.json in {eval_dir}')
    return metrics


def metrics_table(columns: Dict[str, Dict[str, float]], class_names: Sequence[str] = ()) -> str:
    """A Markdown table: one row per summary metric (and per class AP at 2 m), one column per model."""
    names = list(columns)
    lines = ['| metric | ' + ' | '.join(names) + ' |', '|---|' + '---:|' * len(names)]
    rows = [(name, METRIC_PREFIX + name) for name in SUMMARY_METRICS]
    rows += [(f'AP {cls} (2 m)', f'{METRIC_PREFIX}{cls}_AP_dist_2.0') for cls in class_names]
    for label, key in rows:
        values = [columns[name].get(key) for name in names]
        if all(value is None for value in values):
            continue
        lines.append(f'| {label} | ' + ' | '.join('-' if v is None else f'{v:.4f}' for v in values) + ' |')
    return '\n'.join(lines)


def demo_config(model: str, data_root: str):
    """The demo config of ``model`` (an mmcv ``Config``) reading ``data_root``."""
    from mmcv import Config

    from projects.mmdet3d_plugin.datasets.data_root_config import retarget_data_root
    return retarget_data_root(Config.fromfile(osp.join(REPO_ROOT, CONFIGS[model])), osp.join(REPO_ROOT, data_root))


def claim_work_dir(work_dir: str, fingerprint: dict) -> None:
    """Mark ``work_dir`` as this demo run's, or stop if it holds a run of another config or dataset.

    Resuming a checkpoint of another model or data (an older version of the
    demo, another ``--seed``) would silently mix the two, so the work dir
    keeps ``.demo_run.json``: the config and the dataset stamp it was made for.
    """
    stamp = osp.join(REPO_ROOT, work_dir, '.demo_run.json')
    if osp.exists(stamp):
        if read_json(stamp) != fingerprint:
            raise SystemExit(f'demo stopped: {work_dir} holds a demo run of another config or dataset ({stamp}); '
                             'delete that folder to start over, or pass another --work-dir')
        return
    if any(not name.startswith('.') for name in os.listdir(osp.join(REPO_ROOT, work_dir))):
        raise SystemExit(f'demo stopped: {work_dir} holds files of an earlier run that is not marked as a run of '
                         'this demo (an older version of it?); delete that folder to start over, or pass another '
                         '--work-dir')
    write_json(stamp, fingerprint)


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)


def training_processes(requested: Optional[int], config_processes: int, cores: int, has_gpu: bool) -> int:
    """How many data-parallel processes train the demo.

    Args:
        requested (int, optional): ``--processes``; None takes the config's
            ``config_processes`` on a CPU machine with at least as many cores, else 1.
        config_processes (int): the config's ``demo_processes`` (1 when it sets none).
        cores (int): usable CPU cores.
        has_gpu (bool): whether CUDA is available (then one process drives the GPU).
    """
    if requested is None:
        return config_processes if not has_gpu and cores >= config_processes else 1
    if requested < 1:
        raise SystemExit(f'demo stopped: --processes must be >= 1, got {requested}')
    return requested


def free_port() -> int:
    """A TCP port of this machine that nothing listens on now (the processes' rendezvous)."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def train_command(arguments: List[str], processes: int, cores: int) -> Tuple[List[str], Dict[str, str]]:
    """The command and environment that run ``tools/train.py arguments`` in ``processes`` processes.

    Several processes run under ``torch.distributed.run`` with the ``pytorch``
    launcher (gloo without a GPU), each with ``cores // processes`` threads.
    """
    if processes == 1:
        return ['tools/train.py'] + arguments, {}
    launcher = ['-m', 'torch.distributed.run', '--nnodes', '1', '--nproc_per_node', str(processes),
                '--master_addr', '127.0.0.1', '--master_port', str(free_port())]
    threads = str(max(1, cores // processes))
    return launcher + ['tools/train.py', '--launcher', 'pytorch'] + arguments, dict(OMP_NUM_THREADS=threads,
                                                                                 MKL_NUM_THREADS=threads)


def run_fingerprint(cfg, args: argparse.Namespace) -> dict:
    """What a work dir's checkpoints depend on: the whole config and the dataset stamp."""
    config = json.dumps(cfg._cfg_dict.to_dict(), sort_keys=True, default=str)
    return dict(config_sha256=hashlib.sha256(config.encode()).hexdigest(), dataset=dataset_stamp(args))


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    start = time.time()
    work_dir = args.work_dir or osp.join('work_dirs', f'demo_{args.model}')
    train_options = list(args.cfg_options)
    if args.epochs is not None:
        train_options.append(f'runner.max_epochs={args.epochs}')
    total = 5
    for folder in (work_dir, args.data_root):
        os.makedirs(osp.join(REPO_ROOT, folder), exist_ok=True)
    cfg = demo_config(args.model, args.data_root)
    import torch
    cores = usable_cores()
    processes = training_processes(args.processes, cfg.get('demo_processes', 1), cores, torch.cuda.is_available())
    claim_work_dir(work_dir, run_fingerprint(cfg, args))
    config = osp.join(work_dir, osp.basename(CONFIGS[args.model]))
    cfg.dump(osp.join(REPO_ROOT, config))
    prepare_data(args, total)

    untrained_dir = osp.join(work_dir, 'untrained')
    untrained = latest_metrics(osp.join(REPO_ROOT, untrained_dir))
    if untrained is None:
        banner(3, total, 'evaluating the untrained model (the reference the trained one must beat)')
        os.makedirs(osp.join(REPO_ROOT, untrained_dir), exist_ok=True)
        init_checkpoint = osp.join(untrained_dir, 'init.pth')
        run(['tools/init_checkpoint.py', config, init_checkpoint, '--seed', str(args.seed)])
        untrained = evaluate(config, init_checkpoint, untrained_dir, args.cfg_options)
    else:
        banner(3, total, f'untrained model already evaluated ({untrained_dir})')

    banner(4, total, f'training {CONFIGS[args.model]} (resumes from {work_dir}/latest.pth if a previous run stopped)'
           + (f' in {processes} processes of {cfg.data.samples_per_gpu} samples each' if processes > 1 else ''))
    train_start = time.time()
    run(*train_command([config, '--work-dir', work_dir, '--auto-resume', '--no-validate', '--seed', str(args.seed)]
                       + (['--cfg-options'] + train_options if train_options else []), processes, cores))
    train_minutes = (time.time() - train_start) / 60

    banner(5, total, 'evaluating the trained model with the nuScenes devkit')
    checkpoint = osp.join(work_dir, 'latest.pth')
    trained = evaluate(config, checkpoint, osp.join(work_dir, 'trained'), args.cfg_options)

    class_names = cfg.get('class_names', ())
    table = metrics_table({'untrained': untrained, f'trained {args.model}': trained}, class_names)
    with open(osp.join(REPO_ROOT, work_dir, 'demo_metrics.md'), 'w') as f:
        f.write(table + '\n')
    print(f'\n{args.model} on synthetic nuScenes ({args.data_root}, val split), official DetectionEval:\n')
    print(table)
    print(f'\ntraining: {train_minutes:.1f} min; whole demo: {(time.time() - start) / 60:.1f} min')
    print(f'checkpoint:   {checkpoint}')
    print(f'logs:         {work_dir}/*.log (text), {work_dir}/*.log.json (per iteration)')
    print(f'TensorBoard:  tensorboard --logdir {work_dir}/tf_logs')
    print(f'metrics:      {work_dir}/trained/eval_*.json, table in {work_dir}/demo_metrics.md')


if __name__ == '__main__':
    main()
