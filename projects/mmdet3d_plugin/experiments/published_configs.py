"""Run every published config as a user would (``tools/check_published_configs.py``): train, test, submit.

For each config (:data:`PUBLISHED_CONFIGS`, :data:`FINETUNE_CONFIGS`), in ``<work dir>/<config name>/``:

1. ``<config name>.py``: the config with the data root pointed at the given set and its schedule cut to
   ``iters`` iterations (``IterBasedRunner``, a checkpoint at the end, a log line per iteration) and
   nothing else changed: its first epoch's train pipeline (GT sampling, CBGS, GridMask where it has it),
   optimizer and optimizer hook stay (:func:`checked_config`; ``samples_per_gpu`` / ``workers_per_gpu`` and
   ``cfg_options`` only when asked; ``host_syncs``: a ``HostSyncReportHook`` lists the host synchronisations of
   the iterations after the first); a fine-tune config loads the checkpoint of its source config's check;
2. ``tools/dist_train.sh <config> <processes>``;
3. ``tools/dist_test.sh <config> <checkpoint> <processes> --eval bbox``;
4. ``tools/test.py <config> <checkpoint> --format-only``: ``results_nusc.json``, loaded back with the
   nuScenes devkit's ``load_prediction``;

and :func:`results_table` prints one row per config: seconds per iteration (median of the logged iterations
after the first), peak memory (the processes' summed proportional set size, sampled every second; the GPU's
peak as logged by mmcv on CUDA), whether every logged loss is finite, the host synchronisations per iteration
(``host_syncs``, on CUDA), the fp16 hook's loss scale saved with the checkpoint (on CUDA), NDS and the
submission's samples.
"""
import contextlib
import glob
import json
import math
import os
import os.path as osp
import re
import signal
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Set

from ..utils.local_resources import free_port
from ..utils.repo_paths import REPO_ROOT
from .tool_runner import start_tool

#: The published configs: the four CMT configs and the two CMT-AQR configs.
PUBLISHED_CONFIGS = tuple(sorted(osp.relpath(path, REPO_ROOT)
                                 for path in glob.glob(osp.join(REPO_ROOT, 'configs', 'cmt_*.py'))))
#: The fine-tune configs: each starts from the checkpoint of a published CMT config (its ``load_from``).
FINETUNE_CONFIGS = tuple(sorted(osp.relpath(path, REPO_ROOT)
                                for path in glob.glob(osp.join(REPO_ROOT, 'configs', 'finetune', '*.py'))))
#: ``load_from`` of a fine-tune config: where ``tools/train.py configs/<name>.py`` writes its checkpoints.
_WORK_DIR_CHECKPOINT = re.compile(r'^work_dirs/([^/]+)/[^/]+\.pth$')
NDS_KEY = 'pts_bbox_NuScenes/NDS'
#: ``HostSyncReportHook``'s total in the training log.
HOST_SYNCS = re.compile(r'host syncs / iter: ([0-9.eE+-]+)')


@dataclass
class ConfigCheck:
    """One row of the table: what running one config showed (``None``: the step did not get that far)."""

    config: str
    seconds_per_iter: Optional[float] = None
    peak_host_mib: Optional[float] = None
    peak_gpu_mib: Optional[float] = None
    losses_finite: Optional[bool] = None
    host_syncs_per_iter: Optional[float] = None
    loss_scale: Optional[float] = None
    nds: Optional[float] = None
    submission_samples: Optional[int] = None
    wall_seconds: Dict[str, float] = field(default_factory=dict)
    failed: str = ''


def checked_config(config: str, data_root: str, iters: int, samples_per_gpu: Optional[int] = None,
                   workers_per_gpu: Optional[int] = None, host_syncs: bool = False,
                   cfg_options: Optional[dict] = None):
    """``config`` (a path) as it runs in the check (see the module docstring); an mmcv ``Config``;
    ``cfg_options`` as ``--cfg-options`` gives them (``{'model.img_backbone.with_cp': True}``), merged last."""
    from mmcv import Config

    from ..datasets.data_root_config import retarget_data_root
    cfg = retarget_data_root(Config.fromfile(osp.join(REPO_ROOT, config)), osp.abspath(data_root))
    first_epoch_pipeline(cfg)
    cfg.runner = dict(type='IterBasedRunner', max_iters=iters)
    cfg.checkpoint_config = dict(cfg.checkpoint_config, by_epoch=False, interval=iters)
    cfg.log_config = dict(cfg.log_config, interval=1)
    if samples_per_gpu is not None:
        cfg.data.samples_per_gpu = samples_per_gpu
    if workers_per_gpu is not None:
        cfg.data.workers_per_gpu = workers_per_gpu
    if host_syncs:
        start = min(1, iters - 1)
        cfg.custom_hooks = list(cfg.get('custom_hooks', [])) + [
            dict(type='HostSyncReportHook', start=start, iters=iters - start)]
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def first_epoch_pipeline(cfg) -> None:
    """What the first epoch of ``cfg`` trains, without ``DisableObjectSampleHook`` (in place): the check's
    ``IterBasedRunner`` counts no epochs, so the hook is taken out, and with ``disable_after_epoch=0`` the GT
    sampling with it."""
    hooks = list(cfg.get('custom_hooks', None) or [])
    switches = [hook for hook in hooks if hook['type'] == 'DisableObjectSampleHook']
    if not switches:
        return
    cfg.custom_hooks = [hook for hook in hooks if hook['type'] != 'DisableObjectSampleHook']
    if not cfg.custom_hooks:
        cfg.pop('custom_hooks')
    if switches[0].get('disable_after_epoch', 15) == 0:
        from ..datasets.corruption_config import train_pipelines
        from ..mmcv_custom.disable_object_sample import GT_SAMPLING_TRANSFORMS
        removed = {transform.__name__ for transform in GT_SAMPLING_TRANSFORMS}
        for pipeline in train_pipelines(cfg):
            pipeline[:] = [step for step in pipeline if step['type'] not in removed]


def source_config(config: str) -> Optional[str]:
    """The published config whose checkpoint a fine-tune ``config`` loads (its ``load_from`` is
    ``work_dirs/<name>/<file>.pth`` and ``configs/<name>.py`` is published); None for the others."""
    from mmcv import Config
    match = _WORK_DIR_CHECKPOINT.match(Config.fromfile(osp.join(REPO_ROOT, config)).get('load_from') or '')
    source = osp.join('configs', f'{match.group(1)}.py') if match else None
    return source if source in PUBLISHED_CONFIGS else None


def process_tree(root_pid: int) -> Set[int]:
    """``root_pid`` and all its descendants (from ``/proc``)."""
    parents = {}
    for entry in os.listdir('/proc'):
        try:
            with open(f'/proc/{entry}/stat') as f:
                parents[int(entry)] = int(f.read().rpartition(')')[2].split()[1])
        except (ValueError, OSError):
            continue
    tree, frontier = {root_pid}, [root_pid]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid and child not in tree]
        tree.update(children)
        frontier.extend(children)
    return tree


def process_tree_mib(root_pid: int) -> float:
    """The summed proportional set size (``Pss``; ``Rss`` where it is not given) of ``root_pid`` and all its
    descendants, MiB (0 for processes that ended meanwhile)."""
    total_kb = 0
    for pid in process_tree(root_pid):
        fields = {}
        try:
            with open(f'/proc/{pid}/smaps_rollup') as f:
                for line in f:
                    key, _, value = line.partition(':')
                    if key in ('Pss', 'Rss'):
                        fields[key] = int(value.split()[0])
        except OSError:
            continue
        total_kb += fields.get('Pss', fields.get('Rss', 0))
    return total_kb / 1024


def run_measured(command: List[str], env: Dict[str, str], interval_s: float = 1.0):
    """Run a tool (``tool_runner.start_tool``); ``(return code, seconds, peak process-tree MiB)``."""
    start = time.time()
    process = start_tool(command, env)
    peak = [0.0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], process_tree_mib(process.pid))
            time.sleep(interval_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        returncode = process.wait()
    except BaseException:  # interrupted (Ctrl-C, a timeout): end the tool and the processes it started
        for pid in process_tree(process.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        raise
    sampler.join()
    return returncode, time.time() - start, peak[0]


def train_log_summary(work_dir: str) -> Dict[str, Optional[float]]:
    """From the newest ``*.log.json`` of ``work_dir``: median seconds per iteration after the first, whether
    every logged loss is finite, the GPU's peak MiB; from the newest ``*.log``: the host synchronisations per
    iteration (each ``None`` when not logged)."""
    logs = sorted(glob.glob(osp.join(work_dir, '*.log.json')))
    with open(logs[-1]) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    train = [entry for entry in entries if entry.get('mode') == 'train']
    times = [entry['time'] for entry in train]
    losses = [value for entry in train for key, value in entry.items() if key.startswith('loss')]
    memory = [entry['memory'] for entry in train if 'memory' in entry]
    text_logs = sorted(glob.glob(osp.join(work_dir, '*.log')))
    syncs = HOST_SYNCS.findall(open(text_logs[-1]).read()) if text_logs else []
    return dict(seconds_per_iter=statistics.median(times[1:] or times) if times else None,
                losses_finite=bool(losses) and all(math.isfinite(value) for value in losses),
                peak_gpu_mib=max(memory) if memory else None,
                host_syncs_per_iter=float(syncs[-1]) if syncs else None)


def checkpoint_loss_scale(path: str) -> Optional[float]:
    """The dynamic loss scale an fp16 optimizer hook saved with the checkpoint at ``path`` (mmcv keeps its
    ``GradScaler``'s state in ``meta['fp16']['loss_scaler']``); None without one, or with the scaler disabled
    (no CUDA: the hook trains in fp32)."""
    import torch
    meta = torch.load(path, map_location='cpu', weights_only=False).get('meta') or {}
    return meta.get('fp16', {}).get('loss_scaler', {}).get('scale')


def submission_samples(path: str) -> int:
    """The samples of a ``results_nusc.json`` as the nuScenes devkit loads it (an error if it does not)."""
    from nuscenes.eval.common.loaders import load_prediction
    from nuscenes.eval.detection.data_classes import DetectionBox
    boxes, _ = load_prediction(path, 500, DetectionBox, verbose=False)
    return len(boxes.sample_tokens)


def trained_checkpoint(work_dir: str, config: str) -> str:
    """Where :func:`check_config` leaves the checkpoint ``config`` trained."""
    return osp.abspath(osp.join(work_dir, osp.splitext(osp.basename(config))[0], 'train', 'latest.pth'))


def check_config(config: str, data_root: str, work_dir: str, iters: int, processes: int,
                 samples_per_gpu: Optional[int] = None, workers_per_gpu: Optional[int] = None,
                 host_syncs: bool = False, cfg_options: Optional[dict] = None,
                 train_only: bool = False) -> ConfigCheck:
    """Steps 1–4 of the module docstring for one config (step 2 only with ``train_only``); stops at the first
    step that fails (``failed``). A fine-tune config (:func:`source_config`) loads the checkpoint its source
    config's check trained in ``work_dir`` (``failed`` without one)."""
    name = osp.splitext(osp.basename(config))[0]
    folder = osp.abspath(osp.join(work_dir, name))
    os.makedirs(folder, exist_ok=True)
    cfg_path = osp.join(folder, f'{name}.py')
    row = ConfigCheck(config)
    source = source_config(config)
    if source is not None:
        cfg_options = dict(cfg_options or {}, load_from=trained_checkpoint(work_dir, source))
        if not osp.isfile(cfg_options['load_from']):
            row.failed = f'no checkpoint of {source} at {cfg_options["load_from"]} (check that config first)'
            return row
    checked_config(config, data_root, iters, samples_per_gpu, workers_per_gpu, host_syncs, cfg_options).dump(cfg_path)
    train_dir, checkpoint = osp.join(folder, 'train'), trained_checkpoint(work_dir, config)
    steps = [('train', ['tools/dist_train.sh', cfg_path, str(processes), '--work-dir', train_dir]),
             ('test', ['tools/dist_test.sh', cfg_path, checkpoint, str(processes), '--eval', 'bbox', '--work-dir',
                       osp.join(folder, 'test')]),
             ('format', ['tools/test.py', cfg_path, checkpoint, '--format-only', '--work-dir', osp.join(folder, 'test'),
                         '--eval-options', f'jsonfile_prefix={osp.join(folder, "submission")}'])]
    for step, command in steps[:1] if train_only else steps:
        returncode, seconds, peak = run_measured(command, dict(PORT=str(free_port())))
        row.wall_seconds[step] = round(seconds, 1)
        row.peak_host_mib = max(row.peak_host_mib or 0.0, peak)
        if returncode != 0:
            row.failed = f'{step} exited with code {returncode}'
            return row
        if step == 'train':
            vars(row).update(train_log_summary(train_dir), loss_scale=checkpoint_loss_scale(checkpoint))
            if train_only:
                return row
        elif step == 'test':
            with open(sorted(glob.glob(osp.join(folder, 'test', 'eval_*.json')))[-1]) as f:
                row.nds = json.load(f)['metrics'].get(NDS_KEY)
    row.submission_samples = submission_samples(osp.join(folder, 'submission', 'pts_bbox', 'results_nusc.json'))
    return row


def _number(value: Optional[float], digits: int) -> str:
    return '-' if value is None else f'{value:,.{digits}f}'.replace(',', ' ')


def results_table(rows: List[ConfigCheck]) -> str:
    """The Markdown table of the checked configs (one row each)."""
    lines = ['| config | s / iter | peak host MiB | peak GPU MiB | losses finite | host syncs / iter '
             '| loss scale (end) | NDS | submission | minutes (train / test / format) | failed |',
             '|---|---:|---:|---:|---|---:|---:|---:|---|---|---|']
    for row in rows:
        submission = '-' if row.submission_samples is None else f'results_nusc.json, {row.submission_samples} samples'
        minutes = ' / '.join(f'{seconds / 60:.1f}' for seconds in row.wall_seconds.values())
        finite = '-' if row.losses_finite is None else ('yes' if row.losses_finite else '**no**')
        lines.append(f'| {osp.basename(row.config)} | {_number(row.seconds_per_iter, 1)} | '
                     f'{_number(row.peak_host_mib, 0)} | {_number(row.peak_gpu_mib, 0)} | {finite} | '
                     f'{_number(row.host_syncs_per_iter, 1)} | {_number(row.loss_scale, 0)} | {_number(row.nds, 4)} | '
                     f'{submission} | {minutes} | '
                     f'{row.failed or "-"} |')
    return '\n'.join(lines)


def rows_as_json(rows: List[ConfigCheck]) -> str:
    """The rows for machines."""
    return json.dumps([asdict(row) for row in rows], indent=1)
