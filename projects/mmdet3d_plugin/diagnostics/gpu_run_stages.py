"""The GPU run's stages (``tools/gpu_run.py``; docs/research/gpu_runs.md): the tools each stage runs, a runner that
keeps every command's output and stops at a deadline, and the summary with the machine and the targets.

Each command is a ``tools/...`` argv run with this Python in the repository root, in its own process group (a
command past the deadline is killed with its children); its output goes to the stage's log after a
``$ command`` line and before a ``[status, seconds]`` line. :func:`summary` reads the benchmark JSON files the
stages wrote (:mod:`.gpu_targets`).
"""
import json
import os
import os.path as osp
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, TextIO

from ..utils.repo_paths import REPO_ROOT
from .gpu_targets import attention_target_rows, model_target_rows, targets_table

R50_CONFIGS = ('cmt_aqr_voxel0100_r50_800x320_cbgs', 'cmt_voxel0100_r50_800x320_cbgs')
#: a command starts only with this many seconds of the deadline left
MIN_START_SECONDS = 60
#: the model benchmark's batch sizes, and the JSON files :func:`summary` reads the targets from
BATCH_SIZES = (1, 2)
HALF_MODEL_JSON = 'model_half_bs{batch}.json'
ATTENTION_JSON = 'attention_float16.json'


@dataclass
class CommandResult:
    """One command of a stage: ``status`` is ``'ok'``, ``'failed (exit N)'``, ``'timed out'`` or
    ``'not run (deadline)'``; ``seconds`` its wall time."""

    stage: str
    command: List[str]
    status: str
    seconds: float = 0.0


def stage_commands(out: str, data_root: str, work_dir: str,
                   trained: Optional[Sequence[str]] = None) -> Dict[str, List[List[str]]]:
    """Stage name -> the commands (``tools/...`` argv, run with this Python) in the order they run (the model
    benchmark's half-precision and float32 runs of a batch size together, so that a deadline leaves pairs);
    ``trained``: a (config, checkpoint) pair the accuracy stage compares too."""
    accuracy = [['tools/compare_attention_precision.py', '--device', 'cuda', '--dtypes', 'float16', 'bfloat16',
                 '--out', f'{out}/accuracy.json']]
    if trained:
        accuracy.append(['tools/compare_attention_precision.py', '--device', 'cuda', '--configs', trained[0],
                         '--checkpoint', trained[1], '--dtypes', 'float16', 'bfloat16',
                         '--out', f'{out}/accuracy_trained.json'])
    model = [['tools/benchmark_model.py', '--device', 'cuda', '--pairs', '3', '--batch-size', str(batch), *dtype_args,
              '--out', osp.join(out, json_name.format(batch=batch))]
             for batch in BATCH_SIZES for json_name, dtype_args in (
                 (HALF_MODEL_JSON, []), ('model_float32_bs{batch}.json', ['--attention-dtype', 'float32']))]
    return {
        'check': [['tools/check_gpu.py', '--skip-benchmark']],
        'accuracy': accuracy,
        'attention': [['tools/benchmark_attention.py', '--device', 'cuda', '--dtype', 'float16', '--layouts', 'vov',
                       '--biases', 'local', 'global', '--passes', 'fwdbwd', '--no-construction', '--queries', '900',
                       '--batch-sizes', '1', '2', '--backends', 'tiled_bias', 'segment', 'sdpa', '--repeats', '5',
                       '--out', osp.join(out, ATTENTION_JSON)]],
        'model': model,
        'published': [
            ['tools/make_synthetic_nuscenes.py', '--preset', 'nuscenes-mini', '--root', data_root, '--scenes', '2',
             '--samples', '2', '--quiet'],
            ['tools/create_data.py', 'nuscenes', '--root-path', data_root, '--version', 'v1.0-mini'],
            ['tools/check_published_configs.py', '--data-root', data_root, '--configs', *R50_CONFIGS, '--iters', '20',
             '--processes', '1', '--host-syncs', '--work-dir', work_dir, '--json', f'{out}/published.json']],
        'mixed': [['tools/benchmark_model.py', '--device', 'cuda', '--pairs', '3', '--mixed-precision',
                   '--out', f'{out}/model_mixed.json']],
    }


STAGES = tuple(stage_commands('OUT', 'DATA', 'WORK'))


def run_stages(stages: Sequence[str], commands: Dict[str, List[List[str]]], out: str,
               deadline: Optional[float] = None) -> List[CommandResult]:
    """Run ``stages`` in order, each one's log in ``out/<stage>.log``, a progress line per command; every command
    until ``deadline`` seconds from now."""
    start, results = time.monotonic(), []
    for stage in stages:
        with open(osp.join(out, f'{stage}.log'), 'w') as log:
            for command in commands[stage]:
                left = None if deadline is None else deadline - (time.monotonic() - start)
                print(f'[gpu_run {time.monotonic() - start:5.0f} s] {stage}: python {shlex.join(command)}', flush=True)
                results.append(run_command(stage, command, log, left))
                print(f'[gpu_run {time.monotonic() - start:5.0f} s] {stage}: {results[-1].status}', flush=True)
    return results


def run_command(stage: str, command: List[str], log: TextIO, seconds_left: Optional[float]) -> CommandResult:
    """Run ``command`` in the repository root, its output appended to ``log``; stopped after ``seconds_left``."""
    if seconds_left is not None and seconds_left < MIN_START_SECONDS:
        log.write(f'$ {shlex.join(command)}\nnot run: {seconds_left:.0f} s of the deadline left\n')
        return CommandResult(stage, command, 'not run (deadline)')
    log.write(f'$ {shlex.join(command)}\n')
    log.flush()
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, *command], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        code = process.wait(timeout=seconds_left)
        status = 'ok' if code == 0 else f'failed (exit {code})'
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        status = 'timed out'
    log.write(f'\n[{status}, {time.monotonic() - start:.0f} s]\n')
    log.flush()
    return CommandResult(stage, command, status, time.monotonic() - start)


def machine_lines() -> List[str]:
    """The GPU, driver, torch, CUDA, Triton and commit this run used."""
    def output(args: Sequence[str]) -> str:
        try:
            return subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ''

    versions = output([sys.executable, '-c', 'import torch, importlib.util as u; print(torch.__version__, '
                       'torch.version.cuda, (__import__("triton").__version__ if u.find_spec("triton") else "none"))'])
    gpu = output(['nvidia-smi', '--query-gpu=name,driver_version,memory.total', '--format=csv,noheader'])
    return [f'- GPU: {gpu or "none visible (nvidia-smi)"}',
            f'- torch, CUDA, Triton: {versions or "torch did not import"}',
            f'- commit: {output(["git", "rev-parse", "HEAD"]) or "unknown (no git)"}']


def target_rows(out: str) -> List[dict]:
    """The targets of every benchmark JSON the run wrote (half-precision model runs and the attention run)."""
    files = [(HALF_MODEL_JSON.format(batch=batch), model_target_rows) for batch in BATCH_SIZES]
    rows = []
    for name, read_rows in files + [(ATTENTION_JSON, attention_target_rows)]:
        if osp.exists(osp.join(out, name)):
            with open(osp.join(out, name)) as f:
                rows += read_rows(json.load(f))
    return rows


def summary(results: Sequence[CommandResult], out: str) -> str:
    """``OUT/summary.md``'s text."""
    lines = ['# GPU run', '', *machine_lines(), '', '| stage | command | status | s |', '|---|---|---|---|']
    lines += [f'| {r.stage} | `{shlex.join(r.command)}` | {r.status} | {r.seconds:.0f} |' for r in results]
    rows = target_rows(out)
    if rows:
        lines += ['', '## Targets', '', targets_table(rows)]
    return '\n'.join(lines) + '\n'
