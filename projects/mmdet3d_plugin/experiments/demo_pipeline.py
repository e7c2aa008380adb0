"""The end-to-end demo on synthetic nuScenes (``tools/demo.py``, ``make demo``): data → train → official evaluation.

Steps of :func:`run_demo`, each printed as it starts and skipped when its
output is already there (so a second run, or a run after an interruption,
continues where it stopped):

1. ``tools/make_synthetic_nuscenes.py``: a small dataset in the nuScenes v1.0 format;
2. ``tools/create_data.py nuscenes``: info files and the GT database;
3. ``tools/init_checkpoint.py`` + ``tools/test.py --eval bbox``: the untrained model's metrics;
4. ``tools/train.py --auto-resume``: trains the tiny model, in ``processes``
   data-parallel processes (:func:`.tool_runner.training_processes`);
5. for the models of :data:`SENSOR_FAILURE_EPOCHS` (CMT-AQR), ``tools/train.py --auto-resume`` again: a
   fine-tune of that checkpoint on sensor failures (:func:`sensor_failure_config`, in ``<work dir>/sensor_failures``),
   so that a frame whose cameras or LiDAR fail is detected at the surviving sensor's level;
6. ``tools/test.py --eval bbox``: the trained model, scored by the nuScenes devkit's ``DetectionEval``;

then prints the metrics of both models side by side (:func:`metrics_table`)
and where the logs, TensorBoard events and checkpoints are. The tools run
through :mod:`.tool_runner`, on a copy of the demo config pointed at the data
root (``<work dir>/<config name>.py``); so do the robustness study's
(:class:`DemoStudyTools`).
"""
import copy
import glob
import hashlib
import json
import os
import os.path as osp
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from ..utils.local_resources import usable_cores
from ..utils.repo_paths import REPO_ROOT
from .tool_runner import run_tool, run_training, train_command, training_processes

# cmt_aqr: CMT-AQR with a camera decoding pass (its cameras detect alone); cmt_aqr_fused: the same detector
# decoding the fused pass only (the robustness study's stage-1 base).
CONFIGS = dict(cmt_aqr='configs/demo/cmt_aqr_synthetic_tiny_passes.py',
               cmt_aqr_heading='configs/demo/cmt_aqr_synthetic_tiny_passes_heading.py',
               cmt_aqr_fused='configs/demo/cmt_aqr_synthetic_tiny.py', cmt='configs/demo/cmt_synthetic_tiny.py',
               cmt_camera='configs/demo/cmt_camera_synthetic_tiny.py')
#: The demo models whose data differs from the others': the LiDAR intensity added to every object's front part
#: (``make_synthetic_nuscenes.py --front-intensity-offset``), the cue that tells the heading model front from back.
FRONT_INTENSITY_OFFSETS = dict(cmt_aqr_heading=40.0)
# v1.0-trainval: its official scene names allow more than the 10 scenes of v1.0-mini.
DEMO_VERSION = 'v1.0-trainval'
# The demo configs detect within +-25.6 m of the ego; objects stay inside with room for their size.
OBJECT_RANGE_M = 22.0
METRIC_PREFIX = 'pts_bbox_NuScenes/'
SUMMARY_METRICS = ('mAP', 'NDS', 'mATE', 'mASE', 'mAOE', 'mAVE', 'mAAE')
#: The demo models that end with a fine-tune on sensor failures, and its epochs (``tools/demo.py
#: --sensor-failure-epochs``, 0 leaves it out): CMT-AQR trained without a failure loses much of its mAP without its
#: cameras, and a short fine-tune on failures brings it close to the LiDAR-only model (docs/results.md).
SENSOR_FAILURE_EPOCHS = dict(cmt_aqr=4, cmt_aqr_heading=4)
#: The fine-tune's learning rate, as a fraction of the demo config's (same schedule): the full rate, restarted
#: after the cosine schedule has ended, costs clean mAP.
SENSOR_FAILURE_LR_SCALE = 0.3
#: The fine-tune's folder inside the demo's work dir.
SENSOR_FAILURE_DIR = 'sensor_failures'


def banner(step: int, total: int, text: str) -> None:
    print(f'\n[demo {step}/{total}] {text}', flush=True)


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def write_json(path: str, value) -> None:
    with open(path, 'w') as f:
        json.dump(value, f)


@dataclass
class DemoDataset:
    """The demo's synthetic set: where it is and the generator options it is made with.

    Attributes:
        data_root (str): its folder, relative to the repository root or absolute.
        scenes (int): synthetic scenes (a fifth of them for validation).
        samples (int): key frames per scene.
        seed (int): the generator's seed.
        generator_version (str): ``GENERATOR_VERSION`` of
            ``tools/data_converter/synthetic/generator.py``, given by the tool (the plugin never imports tools/):
            a set made by another version is made again.
        front_intensity_offset (float): LiDAR intensity added to every object's front part (0: none).
    """

    data_root: str
    scenes: int
    samples: int
    seed: int
    generator_version: str
    front_intensity_offset: float = 0.0

    def generator_arguments(self) -> List[str]:
        """The generator's options; the demo config reads 384 x 216 images and 3 sweeps."""
        return ['--root', self.data_root, '--version', DEMO_VERSION, '--scenes', str(self.scenes), '--samples',
                str(self.samples), '--seed', str(self.seed), '--image-size', '384', '216', '--lidar-azimuths', '360',
                '--sweeps', '3', '--object-range', str(OBJECT_RANGE_M)] + (
                    ['--front-intensity-offset', str(self.front_intensity_offset)] if self.front_intensity_offset
                    else [])

    def stamp(self) -> dict:
        """What identifies the set: the generator's version and options, and create_data's options."""
        return dict(generator=self.generator_arguments(), generator_version=self.generator_version,
                    infos='--max-sweeps 3')

    def prepare(self, total: int) -> None:
        """Steps 1 and 2, skipped when the stamp of the previous run has the same generator options."""
        stamp = osp.join(REPO_ROOT, self.data_root, '.demo_dataset.json')
        wanted = self.stamp()
        if osp.exists(stamp) and read_json(stamp) == wanted:
            banner(1, total, f'synthetic nuScenes already in {self.data_root} (delete it to regenerate)')
            banner(2, total, 'info files and GT database already created')
            return
        banner(1, total, f'generating synthetic nuScenes in {self.data_root}')
        run_tool(['tools/make_synthetic_nuscenes.py'] + self.generator_arguments())
        banner(2, total, 'creating the info files and the GT database')
        run_tool(['tools/create_data.py', 'nuscenes', '--root-path', self.data_root, '--out-dir', self.data_root,
                  '--extra-tag', 'nuscenes', '--version', DEMO_VERSION, '--max-sweeps', '3'])
        write_json(stamp, wanted)


def latest_metrics(eval_dir: str, newer_than: Optional[str] = None) -> Optional[Dict[str, float]]:
    """The metrics of the newest ``eval_*.json`` that tools/test.py wrote in ``eval_dir``, if any (with
    ``newer_than``, a checkpoint: only if written after it)."""
    files = sorted(glob.glob(osp.join(eval_dir, 'eval_*.json')))
    if not files or (newer_than is not None and osp.getmtime(files[-1]) < osp.getmtime(newer_than)):
        return None
    return read_json(files[-1])['metrics']


def evaluate(config: str, checkpoint: str, eval_dir: str, cfg_options: List[str]) -> Dict[str, float]:
    """``tools/test.py --eval bbox`` of a checkpoint; the metrics it wrote."""
    run_tool(['tools/test.py', config, checkpoint, '--eval', 'bbox', '--work-dir', eval_dir]
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

    from ..datasets.data_root_config import retarget_data_root
    return retarget_data_root(Config.fromfile(osp.join(REPO_ROOT, CONFIGS[model])), osp.join(REPO_ROOT, data_root))


def claim_work_dir(work_dir: str, fingerprint: dict) -> None:
    """Mark ``work_dir`` as this demo run's, or stop if it holds a run of another config or dataset.

    Resuming a checkpoint of another model or data (an older version of the
    demo, another seed) would silently mix the two, so the work dir keeps
    ``.demo_run.json``: the config and the dataset stamp it was made for.
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


def fine_tune_epochs(model: str, requested: Optional[int]) -> int:
    """Epochs of ``model``'s fine-tune on sensor failures: ``requested`` (``--sensor-failure-epochs``), or by
    default :data:`SENSOR_FAILURE_EPOCHS` of ``model`` (0 for the models without one)."""
    if requested is None:
        return SENSOR_FAILURE_EPOCHS.get(model, 0)
    if requested < 0:
        raise SystemExit(f'demo stopped: --sensor-failure-epochs must be >= 0, got {requested}')
    return requested


def sensor_failure_config(cfg, epochs: int, load_from: str):
    """A copy of the demo config ``cfg`` (an mmcv ``Config``) that fine-tunes the checkpoint ``load_from`` for
    ``epochs`` epochs with ``SENSOR_FAILURE_CORRUPTIONS`` in its training pipeline (one failure or none per
    sample: boxes without points, dead views, a cut sector, no cameras at all), at
    :data:`SENSOR_FAILURE_LR_SCALE` of the config's learning rate."""
    from ..datasets.corruption_config import SENSOR_FAILURE_CORRUPTIONS, add_train_corruptions
    cfg = copy.deepcopy(cfg)
    add_train_corruptions(cfg, SENSOR_FAILURE_CORRUPTIONS)
    cfg.merge_from_dict({'runner.max_epochs': epochs, 'load_from': load_from,
                         'optimizer.lr': cfg.optimizer.lr * SENSOR_FAILURE_LR_SCALE})
    return cfg


def run_fingerprint(cfg, dataset: DemoDataset) -> dict:
    """What a work dir's checkpoints depend on: the whole config and the dataset stamp."""
    config = json.dumps(cfg._cfg_dict.to_dict(), sort_keys=True, default=str)
    return dict(config_sha256=hashlib.sha256(config.encode()).hexdigest(), dataset=dataset.stamp())


class DemoStudyTools:
    """The robustness study's ``StudyTools``: the demo's data generator and work-dir claims, :mod:`.tool_runner`.

    Args:
        dataset (DemoDataset): the study's synthetic set.
        processes (int, optional): data-parallel processes of every training (``--processes``); None: each
            config's ``demo_processes`` where :func:`.tool_runner.training_processes` allows it.
    """

    def __init__(self, dataset: DemoDataset, processes: Optional[int] = None) -> None:
        self.dataset = dataset
        self.processes = processes

    def prepare_data(self) -> None:
        self.dataset.prepare(2)

    def run(self, command: List[str]) -> None:
        run_tool(command)

    def train(self, arguments: List[str], processes: int) -> None:
        run_training(arguments, self.processes, processes)

    def claim_work_dir(self, work_dir: str, cfg, seed: int) -> None:
        claim_work_dir(work_dir, dict(run_fingerprint(cfg, self.dataset), seed=seed))


def train(config: str, work_dir: str, epochs: int, seed: int, options: Sequence[str], processes: int,
          cores: int) -> None:
    """``tools/train.py`` of ``config`` into ``work_dir``, resuming its latest checkpoint, in ``processes``
    processes; not started when ``work_dir`` holds the checkpoint of the last of its ``epochs`` (mmcv's
    ``CheckpointHook`` always keeps the last one): a finished run has nothing to do."""
    last = osp.join(work_dir, f'epoch_{epochs}.pth')
    if osp.exists(osp.join(REPO_ROOT, last)):
        print(f'  already trained: {last}', flush=True)
        return
    arguments = [config, '--work-dir', work_dir, '--auto-resume', '--no-validate', '--seed', str(seed)]
    run_tool(*train_command(arguments + (['--cfg-options'] + list(options) if options else []), processes, cores))


def run_demo(model: str, dataset: DemoDataset, work_dir: Optional[str] = None, epochs: Optional[int] = None,
             processes: Optional[int] = None, cfg_options: Sequence[str] = (),
             sensor_failure_epochs: Optional[int] = None) -> None:
    """The steps of the module doc for ``model`` (a key of :data:`CONFIGS`), then the metrics table.

    Args:
        model (str): the demo config to train.
        dataset (DemoDataset): the synthetic set (made unless it is there).
        work_dir (str, optional): logs, checkpoints and metrics (default ``work_dirs/demo_<model>``).
        epochs (int, optional): training epochs (default: the config's).
        processes (int, optional): data-parallel training processes (see :func:`.tool_runner.training_processes`).
        cfg_options (Sequence[str]): ``key=value`` settings passed on to tools/train.py and tools/test.py.
        sensor_failure_epochs (int, optional): epochs of the fine-tune on sensor failures (default:
            :data:`SENSOR_FAILURE_EPOCHS` of ``model``, else none; 0: none).
    """
    from ..datasets.corruption_config import SENSOR_FAILURE_CORRUPTIONS, describe_corruptions
    start = time.time()
    work_dir = work_dir or osp.join('work_dirs', f'demo_{model}')
    cfg_options = list(cfg_options)
    train_options = cfg_options + ([f'runner.max_epochs={epochs}'] if epochs is not None else [])
    sensor_failure_epochs = fine_tune_epochs(model, sensor_failure_epochs)
    total = 6 if sensor_failure_epochs else 5
    for folder in (work_dir, dataset.data_root):
        os.makedirs(osp.join(REPO_ROOT, folder), exist_ok=True)
    cfg = demo_config(model, dataset.data_root)
    import torch
    cores = usable_cores()
    processes = training_processes(processes, cfg.get('demo_processes', 1), cores, torch.cuda.is_available())
    claim_work_dir(work_dir, run_fingerprint(cfg, dataset))
    config = osp.join(work_dir, osp.basename(CONFIGS[model]))
    cfg.dump(osp.join(REPO_ROOT, config))
    dataset.prepare(total)

    untrained_dir = osp.join(work_dir, 'untrained')
    untrained = latest_metrics(osp.join(REPO_ROOT, untrained_dir))
    if untrained is None:
        banner(3, total, 'evaluating the untrained model (the reference the trained one must beat)')
        os.makedirs(osp.join(REPO_ROOT, untrained_dir), exist_ok=True)
        init_checkpoint = osp.join(untrained_dir, 'init.pth')
        run_tool(['tools/init_checkpoint.py', config, init_checkpoint, '--seed', str(dataset.seed)])
        untrained = evaluate(config, init_checkpoint, untrained_dir, cfg_options)
    else:
        banner(3, total, f'untrained model already evaluated ({untrained_dir})')

    banner(4, total, f'training {CONFIGS[model]} (resumes from {work_dir}/latest.pth if a previous run stopped)'
           + (f' in {processes} processes of {cfg.data.samples_per_gpu} samples each' if processes > 1 else ''))
    train_start = time.time()
    train(config, work_dir, cfg.runner.max_epochs if epochs is None else epochs, dataset.seed, train_options,
          processes, cores)
    checkpoint = osp.join(work_dir, 'latest.pth')
    if sensor_failure_epochs:
        finetune_dir = osp.join(work_dir, SENSOR_FAILURE_DIR)
        finetune_cfg = sensor_failure_config(cfg, sensor_failure_epochs, checkpoint)
        banner(5, total, f'fine-tuning it on sensor failures for {sensor_failure_epochs} epochs (one per sample or '
               f'none: {describe_corruptions(SENSOR_FAILURE_CORRUPTIONS)}; resumes from {finetune_dir}/latest.pth if '
               'a previous run stopped)')
        os.makedirs(osp.join(REPO_ROOT, finetune_dir), exist_ok=True)
        # a fine-tune of another stage-1 training (other epochs or options) would be stale
        claim_work_dir(finetune_dir, dict(run_fingerprint(finetune_cfg, dataset), stage1_options=train_options))
        config = osp.join(finetune_dir, osp.basename(CONFIGS[model]))
        finetune_cfg.dump(osp.join(REPO_ROOT, config))
        train(config, finetune_dir, sensor_failure_epochs, dataset.seed, cfg_options, processes, cores)
        checkpoint = osp.join(finetune_dir, 'latest.pth')
    train_minutes = (time.time() - train_start) / 60
    log_dirs = [work_dir] + ([finetune_dir] if sensor_failure_epochs else [])

    trained_dir = osp.join(work_dir, 'trained')
    trained = latest_metrics(osp.join(REPO_ROOT, trained_dir), newer_than=osp.join(REPO_ROOT, checkpoint))
    if trained is None:
        banner(total, total, 'evaluating the trained model with the nuScenes devkit')
        trained = evaluate(config, checkpoint, trained_dir, cfg_options)
    else:
        banner(total, total, f'trained model already evaluated ({trained_dir}, after {checkpoint} was written)')

    table = metrics_table({'untrained': untrained, f'trained {model}': trained}, cfg.get('class_names', ()))
    with open(osp.join(REPO_ROOT, work_dir, 'demo_metrics.md'), 'w') as f:
        f.write(table + '\n')
    print(f'\n{model} on synthetic nuScenes ({dataset.data_root}, val split), official DetectionEval:\n')
    print(table)
    print(f'\ntraining: {train_minutes:.1f} min; whole demo: {(time.time() - start) / 60:.1f} min')
    print(f'checkpoint:   {checkpoint}')
    for folder in log_dirs:
        print(f'logs:         {folder}/*.log (text), {folder}/*.log.json (per iteration)')
        print(f'TensorBoard:  tensorboard --logdir {folder}/tf_logs')
    print(f'metrics:      {work_dir}/trained/eval_*.json, table in {work_dir}/demo_metrics.md')
