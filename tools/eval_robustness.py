"""Robustness of a CMT / CMT-AQR checkpoint: nuScenes mAP and NDS under every test-time sensor corruption.

    python tools/eval_robustness.py CONFIG CHECKPOINT [--corruptions clean camera_drop fov:120 ...]
        [--routing learned oracle] [--out DIR] [--samples N] [--corruption-seed S] [--cfg-options k=v ...]

The model is built and loaded once; for each corruption the test dataset is
rebuilt with a ``SensorCorruption`` step right after its loading steps (as
``tools/test.py --corruption`` does), the model runs over it and the
official nuScenes devkit evaluates the boxes (``dataset.evaluate``, metric
``bbox``). A corruption that fails (e.g. the model raises on its input) is
reported as failed with its error, and the others still run.

Writes ``robustness.md`` (a Markdown table: mAP, NDS and their change from
``clean`` per corruption) and ``robustness.json`` to ``--out`` (default
``work_dirs/<config name>/robustness``) and prints the table.
``--samples N`` evaluates the first N test samples only (quick runs; the
devkit's ground truth is narrowed to the same samples). ``--routing learned
oracle`` evaluates a CMT-AQR model twice per corruption: with its router's
weights and with the input's truth (LiDAR weight 1 where a query's BEV window
holds points, camera weight 1 where a live camera sees it): the headroom
routing could add. The table then has a ``routing`` column and each routing's
deltas are against its own clean run. ``--object-metrics`` adds, per
corruption, the recall at 2 m of the objects it affected, the false positives
per sample and the router's accuracy against the per-query routing targets
(``projects/mmdet3d_plugin/apis/study_metrics.py``; detections counted from
``--score-thr``), against the clean run, which then runs first.
"""
import argparse
import json
import logging
import os
import os.path as osp
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

from mmcv import Config, DictAction
from mmdet.apis import set_random_seed
from mmdet.utils import get_root_logger
from mmdet3d.apis import single_gpu_test
from mmdet3d.datasets import build_dataset
from torch import nn

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from projects.mmdet3d_plugin.apis.sample_recorder import record_samples  # noqa: E402
from projects.mmdet3d_plugin.apis.sample_subset import keep_first_samples, nuscenes_ground_truth_of  # noqa: E402
from projects.mmdet3d_plugin.apis.testing import (apply_corruption, build_test_loader,  # noqa: E402
                                                  build_test_model, corruption_spec, evaluate_results,
                                                  load_test_config, nuscenes_scores, prepare_test_config,
                                                  set_test_routing)
from projects.mmdet3d_plugin.apis.study_metrics import (MIN_LIDAR_POINTS, SCORE_THRESHOLD,  # noqa: E402
                                                        object_metrics)
from projects.mmdet3d_plugin.models.dense_heads.aqr_routing import TEST_ROUTINGS  # noqa: E402
from projects.mmdet3d_plugin.mmcv_custom.launch import default_device  # noqa: E402
from projects.mmdet3d_plugin.mmcv_custom.parallel import wrap_model  # noqa: E402

#: The uncorrupted run, the reference of the deltas.
CLEAN = 'clean'
DEFAULT_CORRUPTIONS = (CLEAN, 'lidar_drop', 'camera_drop', 'view_drop:0', 'fov:120', 'beams:16', 'points:0.1',
                       'object_drop:0.5', 'camera_fail:0.4', 'extrinsic:2', 'mixed:120')
SCORES = ('mAP', 'NDS')
#: ``--object-metrics`` columns of the Markdown table: title -> ``ObjectMetrics`` field.
OBJECT_COLUMNS = {'affected recall': 'affected_recall', 'FP / sample': 'false_positives_per_sample',
                  'router accuracy': 'router_accuracy'}
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
        routing (str): the AQR routing at test time (``learned`` or ``oracle``).
        objects (dict, optional): ``--object-metrics``: the fields of
            ``study_metrics.ObjectMetrics`` (affected-object recall, false
            positives per sample, router accuracy, their counts).
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


def robustness_spec(text: str) -> str:
    """``argparse`` type of ``--corruptions`` items: ``clean`` or a corruption spec."""
    return CLEAN if text.strip() == CLEAN else corruption_spec(text)


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
                        help='seed of the random corruptions (points, object_drop, camera_fail, extrinsic, mixed)')
    parser.add_argument('--seed', type=int, default=0, help='random seed')
    parser.add_argument('--object-metrics', action='store_true', help='also the recall at 2 m of the objects each '
                        'corruption affected, false positives per sample and the router\'s accuracy (needs clean)')
    parser.add_argument('--score-thr', type=float, default=SCORE_THRESHOLD,
                        help=f'--object-metrics: lowest score a detection counts with (default {SCORE_THRESHOLD})')
    parser.add_argument('--min-lidar-points', type=int, default=MIN_LIDAR_POINTS, help='--object-metrics: points '
                        f'a box must hold for LiDAR to see its object (default {MIN_LIDAR_POINTS})')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config settings')
    args = parser.parse_args(argv)
    if args.samples is not None and args.samples < 1:
        parser.error(f'--samples must be >= 1, got {args.samples}')
    duplicates = sorted({spec for spec in args.corruptions if args.corruptions.count(spec) > 1})
    if duplicates:
        parser.error(f'--corruptions lists {duplicates} more than once')
    if args.object_metrics and CLEAN not in args.corruptions:
        parser.error(f'--object-metrics compares every corruption with the clean inputs: add {CLEAN} to --corruptions')
    return args


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


def main(argv: Optional[List[str]] = None) -> List[CorruptionResult]:
    args = parse_args(argv)
    cfg = load_test_config(args.config, args.cfg_options)
    samples_per_gpu = prepare_test_config(cfg)
    out_dir = args.out or osp.join('work_dirs', osp.splitext(osp.basename(args.config))[0], 'robustness')
    os.makedirs(out_dir, exist_ok=True)
    timestamp = time.strftime('%Y%m%d_%H%M%S', time.localtime())
    logger = get_root_logger(log_file=osp.join(out_dir, f'robustness_{timestamp}.log'), log_level=cfg.log_level)
    set_random_seed(args.seed)

    dataset = build_dataset(cfg.data.test)
    num_samples = min(args.samples or len(dataset), len(dataset))
    device = default_device()
    model = wrap_model(build_test_model(cfg, args.checkpoint, dataset.CLASSES, logger=logger), device, False)
    # the object metrics compare each corruption with the clean run: that runs first
    corruptions = sorted(args.corruptions, key=lambda spec: spec != CLEAN) if args.object_metrics else args.corruptions
    runs = [(routing, corruption) for corruption in corruptions for routing in args.routing]
    for routing in args.routing:
        set_test_routing(model, routing)  # fails early for a model without AQR
    logger.info(f'Robustness of {args.checkpoint} ({args.config}) on {device}: {len(runs)} runs of '
                f'{num_samples} of {len(dataset)} test samples: {", ".join(args.corruptions)}; routing '
                f'{", ".join(args.routing)}')
    results, clean_observations = [], None
    for index, (routing, corruption) in enumerate(runs, 1):
        name = corruption if args.routing == ['learned'] else f'{corruption} ({routing} routing)'
        logger.info(f'[{index}/{len(runs)}] {name}')
        set_test_routing(model, routing)
        with record_samples(model, dataset) if args.object_metrics else nullcontext() as observations:
            result = evaluate_corruption(model, cfg, corruption, logger, args.samples, args.corruption_seed,
                                         samples_per_gpu)
        result.routing = routing
        if args.object_metrics and result.status == 'ok':
            if corruption == CLEAN and clean_observations is None:
                clean_observations = observations
            if clean_observations is None:
                logger.warning(f'{name}: no object metrics, the clean run failed')
            else:
                result.objects = asdict(object_metrics(clean_observations, observations, args.score_thr,
                                                       min_lidar_points=args.min_lidar_points))
        logger.info(f'[{index}/{len(runs)}] {name}: '
                    + (f'mAP {result.mAP:.4f}, NDS {result.NDS:.4f}' if result.status == 'ok' else result.error)
                    + f' ({result.seconds:.0f} s)')
        results.append(result)
    add_deltas(results)
    header = dict(config=args.config, checkpoint=args.checkpoint, samples=num_samples,
                  corruption_seed=args.corruption_seed, routing=args.routing)
    if args.object_metrics:
        header.update(score_threshold=args.score_thr, min_lidar_points=args.min_lidar_points)
    paths = write_report(results, out_dir, header)
    print(markdown_table(results))
    logger.info(f'wrote {" and ".join(paths)}')
    return results


if __name__ == '__main__':
    main()
