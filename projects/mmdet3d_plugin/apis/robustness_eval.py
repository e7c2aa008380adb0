"""Robustness of a checkpoint: nuScenes mAP and NDS under every test-time sensor corruption
(``tools/eval_robustness.py``).

The model is built and loaded once; for each corruption the test dataset is
rebuilt with a ``SensorCorruption`` step right after its loading steps (as
``tools/test.py --corruption`` does), the model runs over it and the
official nuScenes devkit evaluates the boxes (``dataset.evaluate``, metric
``bbox``). A corruption that fails (e.g. the model raises on its input) is
reported as failed with its error, and the others still run
(:func:`evaluate_corruption`).

:func:`evaluate_robustness` writes ``robustness.md`` (:func:`markdown_table`:
mAP, NDS and their change from ``clean`` per corruption) and
``robustness.json``. ``samples`` evaluates the first N test samples only (the
devkit's ground truth is narrowed to the same samples). Routings ``learned``
and ``oracle`` evaluate a CMT-AQR model twice per corruption: with its
router's weights and with the input's truth; each routing's deltas are against
its own clean run. ``object_metrics`` adds, per corruption, the recall at 2 m
of the objects it affected, the false positives per sample and the router's
accuracy against the per-query routing targets (:mod:`.object_metrics`),
against the clean run, which then runs first.
"""
import json
import logging
import os
import os.path as osp
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from mmcv import Config
from mmdet.apis import set_random_seed
from mmdet.utils import get_root_logger
from mmdet3d.apis import single_gpu_test
from mmdet3d.datasets import build_dataset
from torch import nn

from ..mmcv_custom.launch import default_device
from ..mmcv_custom.parallel import wrap_model
from .object_metrics import MIN_LIDAR_POINTS, SCORE_THRESHOLD, object_metrics
from .sample_recorder import record_samples
from .sample_subset import keep_first_samples, nuscenes_ground_truth_of
from .test import (apply_corruption, build_test_loader, build_test_model, evaluate_results, load_test_config,
                   nuscenes_scores, prepare_test_config, set_test_routing)

#: The uncorrupted run, the reference of the deltas.
CLEAN = 'clean'
DEFAULT_CORRUPTIONS = (CLEAN, 'lidar_drop', 'camera_drop', 'view_drop:0', 'fov:120', 'beams:16', 'points:0.1',
                       'object_drop:0.5', 'camera_fail:0.4', 'extrinsic:2', 'mixed:120')
SCORES = ('mAP', 'NDS')
#: ``--object-metrics`` columns of the Markdown table: title -> ``ObjectMetrics`` field.
OBJECT_COLUMNS = {'affected recall': 'affected_recall', 'FP / sample': 'false_positives_per_sample',
                  'FP near ghosts / sample': 'ghost_false_positives_per_sample', 'router accuracy': 'router_accuracy'}
#: Longest error message shown in the Markdown table (the JSON has it all).
TABLE_ERROR_CHARS = 160


@dataclass
class CorruptionResult:
    """The evaluation of one corruption.

    Attributes:
        corruption (str): ``clean`` or the corruption spec.
        status (str): ``'ok'`` or ``'failed'``.
        mAP (float, optional): nuScenes mAP (None if failed).
        NDS (float, optional): nuScenes detection score (None if failed).
        delta_mAP (float, optional): ``mAP - clean mAP`` (None without both).
        delta_NDS (float, optional): ``NDS - clean NDS``.
        error (str, optional): ``'ErrorType: message'`` of a failed run.
        seconds (float): wall time of inference and evaluation.
        routing (str): the AQR routing at test time (``learned`` or an oracle, ``query_router.TEST_ROUTINGS``).
        objects (dict, optional): ``--object-metrics``: the fields of
            ``object_metrics.ObjectMetrics`` (affected-object recall, false
            positives per sample and those near ghosts, router accuracy, their counts).
    """

    corruption: str
    status: str
    mAP: Optional[float] = None
    NDS: Optional[float] = None
    delta_mAP: Optional[float] = None
    delta_NDS: Optional[float] = None
    error: Optional[str] = None
    seconds: float = 0.0
    routing: str = 'learned'
    objects: Optional[dict] = None


@dataclass
class RobustnessOptions:
    """What :func:`evaluate_robustness` evaluates (``tools/eval_robustness.py``'s options).

    Attributes:
        config (str): the test config.
        checkpoint (str): the checkpoint file.
        corruptions (list[str]): ``clean`` and corruption specs, evaluated in this order.
        routing (list[str]): AQR routings at test time (``query_router.TEST_ROUTINGS``).
        out (str, optional): output folder (default ``work_dirs/<config name>/robustness``).
        samples (int, optional): evaluate the first N test samples only.
        corruption_seed (int): seed of the random corruptions.
        seed (int): random seed.
        object_metrics (bool): also the object metrics (needs ``clean``).
        score_thr (float): object metrics: the lowest score a detection counts with.
        min_lidar_points (int): object metrics: points a box must hold for LiDAR to see its object.
        attention_mass (bool): object metrics: also the fused cross-attention's mass on the dead sensor's keys
            (``dead_camera_attention``, ``dead_lidar_attention``; dense attention probabilities, slower).
        cfg_options (dict, optional): config settings to override.
    """

    config: str
    checkpoint: str
    corruptions: List[str] = field(default_factory=lambda: list(DEFAULT_CORRUPTIONS))
    routing: List[str] = field(default_factory=lambda: ['learned'])
    out: Optional[str] = None
    samples: Optional[int] = None
    corruption_seed: int = 0
    seed: int = 0
    object_metrics: bool = False
    score_thr: float = SCORE_THRESHOLD
    min_lidar_points: int = MIN_LIDAR_POINTS
    attention_mass: bool = False
    cfg_options: Optional[dict] = None


def describe_error(error: BaseException) -> str:
    """``'ErrorType: message'``; for an error re-raised from a data loader worker, the worker's original one."""
    message = str(error).strip()
    if 'Original Traceback' in message:  # torch's ExceptionWrapper: the worker's traceback ends with the error
        return message.splitlines()[-1]
    return f'{type(error).__name__}: {message}'


def evaluate_corruption(model: nn.Module, cfg: Config, corruption: str, logger: logging.Logger,
                        num_samples: Optional[int] = None, seed: int = 0,
                        samples_per_gpu: int = 1) -> CorruptionResult:
    """Run and evaluate the wrapped ``model`` on the test set under one corruption.

    Args:
        model (nn.Module): the detector, wrapped (``MMDataParallel``, ...).
        cfg (Config): the test config (see ``prepare_test_config``).
        corruption (str): ``clean`` or a corruption spec.
        logger (logging.Logger): progress and errors (with their traceback).
        num_samples (int, optional): evaluate the first N test samples only.
        seed (int): seed of the random corruptions.
        samples_per_gpu (int): batch size.

    Returns:
        CorruptionResult: its scores, or ``status='failed'`` and the error:
        any exception is caught, so the caller can go on.
    """
    start = time.time()
    try:
        corrupted = apply_corruption(cfg, None if corruption == CLEAN else corruption, seed=seed, logger=logger)
        dataset = build_dataset(corrupted.data.test)
        sample_tokens = keep_first_samples(dataset, num_samples)
        outputs = single_gpu_test(model, build_test_loader(dataset, corrupted, samples_per_gpu))
        if sample_tokens is None:
            metrics = evaluate_results(dataset, outputs, corrupted, ['bbox'], logger=logger)
        else:
            with nuscenes_ground_truth_of(sample_tokens):
                metrics = evaluate_results(dataset, outputs, corrupted, ['bbox'], logger=logger)
        scores = nuscenes_scores(metrics)
    except Exception as error:  # report the corruption as failed and go on with the others
        logger.exception(f'{corruption}: failed')
        return CorruptionResult(corruption, 'failed', error=describe_error(error), seconds=time.time() - start)
    return CorruptionResult(corruption, 'ok', seconds=time.time() - start, **scores)


def add_deltas(results: Sequence[CorruptionResult]) -> None:
    """Fill in each result's change from the ``clean`` result of its routing (None without a successful one)."""
    clean = {r.routing: r for r in results if r.corruption == CLEAN and r.status == 'ok'}
    for result in results:
        if result.status == 'ok' and result.routing in clean:
            for score in SCORES:
                setattr(result, f'delta_{score}', getattr(result, score) - getattr(clean[result.routing], score))


def _number(value: Optional[float], signed: bool = False) -> str:
    if value is None:
        return 'n/a'
    value = round(value, 4) + 0.0  # no '-0.0000' for a tiny negative change
    return f'{value:+.4f}' if signed else f'{value:.4f}'


def _status(result: CorruptionResult) -> str:
    if result.status == 'ok':
        return 'ok'
    error = ' '.join(result.error.split()).replace('|', '\\|')
    if len(error) > TABLE_ERROR_CHARS:
        error = error[:TABLE_ERROR_CHARS - 3] + '...'
    return f'failed: {error}'


def markdown_table(results: Sequence[CorruptionResult]) -> str:
    """The results as a Markdown table: corruption, mAP, NDS, their deltas from clean, status.

    A ``routing`` column follows the corruption when the results hold more than the learned routing.
    """
    with_routing = any(result.routing != 'learned' for result in results)
    with_objects = any(result.objects is not None for result in results)
    titles = ['corruption'] + ['routing'] * with_routing + ['mAP', 'NDS', 'ΔmAP', 'ΔNDS'] \
        + list(OBJECT_COLUMNS) * with_objects + ['status']
    lines = ['| ' + ' | '.join(titles) + ' |',
             '|---|' + '---|' * with_routing + '---:|' * (len(titles) - 2 - with_routing) + '---|']
    for result in results:
        routing = f' {result.routing} |' if with_routing else ''
        objects = ''.join(f' {_number((result.objects or {}).get(key))} |'
                          for key in OBJECT_COLUMNS.values()) if with_objects else ''
        lines.append(f'| {result.corruption} |{routing} {_number(result.mAP)} | {_number(result.NDS)} | '
                     f'{_number(result.delta_mAP, True)} | {_number(result.delta_NDS, True)} |{objects} '
                     f'{_status(result)} |')
    return '\n'.join(lines)


def write_report(results: Sequence[CorruptionResult], out_dir: str, header: Dict[str, object]) -> List[str]:
    """Write ``robustness.md`` and ``robustness.json`` to ``out_dir``; return their paths."""
    markdown_path, json_path = osp.join(out_dir, 'robustness.md'), osp.join(out_dir, 'robustness.json')
    details = '\n'.join(f'- {key}: {value}' for key, value in header.items())
    with open(markdown_path, 'w') as file:
        file.write(f'# Robustness to sensor corruptions\n\n{details}\n\n{markdown_table(results)}\n')
    with open(json_path, 'w') as file:
        json.dump(dict(header, results=[asdict(result) for result in results]), file, indent=2)
    return [markdown_path, json_path]


def evaluate_robustness(options: RobustnessOptions) -> Tuple[List[CorruptionResult], List[str]]:
    """Evaluate the checkpoint under every corruption (and routing) of ``options``; write the report.

    Logs progress to ``<out>/robustness_<timestamp>.log``.

    Returns:
        tuple: the results in run order (deltas filled in) and the paths of
        ``robustness.md`` and ``robustness.json``.

    Raises:
        ValueError: a routing other than ``learned`` for a model without AQR (before anything runs).
    """
    cfg = load_test_config(options.config, options.cfg_options)
    samples_per_gpu = prepare_test_config(cfg)
    out_dir = options.out or osp.join('work_dirs', osp.splitext(osp.basename(options.config))[0], 'robustness')
    os.makedirs(out_dir, exist_ok=True)
    timestamp = time.strftime('%Y%m%d_%H%M%S', time.localtime())
    logger = get_root_logger(log_file=osp.join(out_dir, f'robustness_{timestamp}.log'), log_level=cfg.log_level)
    set_random_seed(options.seed)

    dataset = build_dataset(cfg.data.test)
    num_samples = min(options.samples or len(dataset), len(dataset))
    device = default_device()
    model = wrap_model(build_test_model(cfg, options.checkpoint, dataset.CLASSES, logger=logger), device, False)
    # the object metrics compare each corruption with the clean run: that runs first
    corruptions = (sorted(options.corruptions, key=lambda spec: spec != CLEAN) if options.object_metrics
                   else options.corruptions)
    runs = [(routing, corruption) for corruption in corruptions for routing in options.routing]
    for routing in options.routing:
        set_test_routing(model, routing)  # fails early for a model without AQR
    logger.info(f'Robustness of {options.checkpoint} ({options.config}) on {device}: {len(runs)} runs of '
                f'{num_samples} of {len(dataset)} test samples: {", ".join(options.corruptions)}; routing '
                f'{", ".join(options.routing)}')
    results, clean_observations = [], None
    for index, (routing, corruption) in enumerate(runs, 1):
        name = corruption if options.routing == ['learned'] else f'{corruption} ({routing} routing)'
        logger.info(f'[{index}/{len(runs)}] {name}')
        set_test_routing(model, routing)
        with (record_samples(model, dataset, options.attention_mass) if options.object_metrics
              else nullcontext()) as observations:
            result = evaluate_corruption(model, cfg, corruption, logger, options.samples, options.corruption_seed,
                                         samples_per_gpu)
        result.routing = routing
        if options.object_metrics and result.status == 'ok':
            if corruption == CLEAN and clean_observations is None:
                clean_observations = observations
            if clean_observations is None:
                logger.warning(f'{name}: no object metrics, the clean run failed')
            else:
                result.objects = asdict(object_metrics(clean_observations, observations, options.score_thr,
                                                       min_lidar_points=options.min_lidar_points))
        logger.info(f'[{index}/{len(runs)}] {name}: '
                    + (f'mAP {result.mAP:.4f}, NDS {result.NDS:.4f}' if result.status == 'ok' else result.error)
                    + f' ({result.seconds:.0f} s)')
        results.append(result)
    add_deltas(results)
    header = dict(config=options.config, checkpoint=options.checkpoint, samples=num_samples,
                  corruption_seed=options.corruption_seed, routing=options.routing)
    if options.object_metrics:
        header.update(score_threshold=options.score_thr, min_lidar_points=options.min_lidar_points,
                      attention_mass=options.attention_mass)
    return results, write_report(results, out_dir, header)
