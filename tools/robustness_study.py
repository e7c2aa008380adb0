"""Does per-query routing pay under sensor failures? CMT vs CMT-AQR vs a fine-tuning control, one command.

    python tools/robustness_study.py [--quick] [--seeds 0 1] [--work-dir work_dirs/study] [--out docs/robustness]
    make study [STUDY_ARGS="--seeds 0 1 2"]     # study.md states the wall time its run took

Steps, each printed as it starts and skipped when its output is already there (a second run continues):

1. one synthetic nuScenes set, larger than the demo's (``--scenes 150``, a fifth for validation; the demo's
   generator options, ``tools/demo.py``);
2. per seed, **stage 1**: the baseline trained with the training pipeline's ``ModalMask3D`` modality drop
   (``--image-drop`` / ``--lidar-drop``: upstream CMT's 0.25 each, at most one modality per sample) for
   ``--stage1-epochs``. ``--baseline fixed_window`` (default): CMT with AQR's window bias held fixed, the
   router frozen at its initialisation so every query trusts both modalities equally
   (``configs/demo/cmt_aqr_synthetic_tiny_fixed_routing.py``: a locality prior without routing; the plain demo
   CMT does not learn to detect within a CPU budget, docs/demo.md); ``--baseline cmt``: the plain demo CMT
   (``configs/demo/cmt_synthetic_tiny.py``), the AQR modules then start from their initialisation in stage 2.
   Each seed trains its own stage 1, so the spread over the seeds covers the whole recipe, not only stage 2
   (``--shared-stage1``: one stage 1, of the first seed);
3. per seed, **stage 2** from that checkpoint, ``--stage2-epochs`` each, same data and modality drop:
   (a) **CMT-AQR** (``configs/demo/cmt_aqr_synthetic_tiny_stage2.py``): the checkpoint loaded non-strictly,
   only the AQR weight generator (the router) and the attention bias generator (with alpha) trained,
   everything else frozen with its BatchNorm statistics (``FreezeParametersHook``; MoME's stage-2 recipe);
   (b) the **control**: the stage-1 config trained further (every parameter it trains) for the same
   iterations, so that extra training is not mistaken for routing;
4. every model (stage-1 CMT, control, CMT-AQR) evaluated by ``tools/eval_robustness.py``: the official
   nuScenes ``DetectionEval`` on the validation split, clean and under every corruption of its default list;
5. ``study.md`` (NDS and mAP per corruption: mean and min–max over the seeds; CMT-AQR minus the control and
   minus CMT, with the range of the per-seed differences), ``study.json``, a bar chart (``study_nds.png``), a table
   of CMT-AQR's mean LiDAR and camera weights per corruption (best-scoring queries and all queries) and AQR
   routing pictures (``tools/visualize_aqr.py``, ``study_<corruption>_*.png``) of one validation sample
   under the object failure and the mixed failure, written to ``--out``.

``--quick`` runs the same steps on a tiny set for a few iterations and four corruptions (the test suite
runs it; its numbers mean nothing) and writes its report into the work dir.
"""
import argparse
import glob
import json
import os
import os.path as osp
import shutil
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from tools import demo  # noqa: E402
from tools.eval_robustness import CLEAN, DEFAULT_CORRUPTIONS, SCORES  # noqa: E402

#: The three models compared, in table order: stage 1, the control and CMT-AQR (both stage 2).
MODELS = ('cmt', 'control', 'cmt_aqr')
#: Per ``--baseline``: the config that stage 1 trains and the control trains further, and the table labels.
BASELINES = dict(
    fixed_window=dict(config='configs/demo/cmt_aqr_synthetic_tiny_fixed_routing.py',
                      labels=dict(cmt='CMT + fixed window bias (stage 1)',
                                  control='fixed window, fine-tuned (control)', cmt_aqr='CMT-AQR (router trained)'),
                      short='stage 1',
                      description='CMT with AQR\'s window bias held fixed: router and alpha frozen at their '
                                  'initialisation, so every query trusts LiDAR and camera equally '
                                  '(weights 0.9 ± 0.01, a +4 window bias) while everything else trains'),
    cmt=dict(config=demo.CONFIGS['cmt'],
             labels=dict(cmt='CMT (stage 1)', control='CMT fine-tuned (control)', cmt_aqr='CMT-AQR (AQR trained)'),
             short='CMT', description='the plain demo CMT'))
#: Stage 2 of CMT-AQR: only the router and alpha train.
AQR_STAGE2_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny_stage2.py'
QUICK_CORRUPTIONS = (CLEAN, 'lidar_drop', 'object_drop:0.5', 'mixed:120')
#: Routing pictures: the object failure and the mixed failure (the modes helper tools/eval_robustness.py lists).
PICTURE_CORRUPTIONS = ('object_drop:0.5', 'mixed:120')
#: The queries whose routing weights the routing table averages: the best-scoring ones of each sample.
TOP_QUERIES = 20
TOTAL_STEPS = 5


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='CMT vs CMT-AQR vs a fine-tuning control under sensor failures')
    parser.add_argument('--quick', action='store_true', help='a tiny set, a few iterations, four corruptions')
    parser.add_argument('--baseline', choices=sorted(BASELINES), default='fixed_window',
                        help='stage 1: CMT with a fixed AQR window bias (default) or the plain demo CMT')
    parser.add_argument('--seeds', type=int, nargs='+', help='training seeds (default: 0 1; --quick: 0)')
    parser.add_argument('--scenes', type=int, help='synthetic scenes of 2 samples, a fifth for validation '
                        '(default 150, the demo has 100; --quick: 2)')
    parser.add_argument('--stage1-epochs', type=int, help='stage-1 training epochs (default 12; --quick: 2)')
    parser.add_argument('--stage2-epochs', type=int, help='epochs of CMT-AQR and of the control (default 4)')
    parser.add_argument('--shared-stage1', action='store_true', help='train stage 1 once (first seed) and start '
                        'every seed\'s stage 2 from it (the spread then covers stage 2 only)')
    parser.add_argument('--image-drop', type=float, default=0.25, help='ModalMask3D: probability that a training '
                        'sample loses its images (upstream CMT: 0.25)')
    parser.add_argument('--lidar-drop', type=float, default=0.25, help='ModalMask3D: probability that a training '
                        'sample loses its points instead (upstream CMT: 0.25)')
    parser.add_argument('--corruptions', nargs='+', help="default: tools/eval_robustness.py's list")
    parser.add_argument('--routing-samples', type=int, default=10, help='validation samples of the routing table')
    parser.add_argument('--picture-sample', type=int, default=0, help='validation sample of the routing pictures')
    parser.add_argument('--data-root', help='default: data/synthetic_study (--quick: data/synthetic_study_quick)')
    parser.add_argument('--work-dir', help='default: work_dirs/study_<baseline> (--quick: work_dirs/study_quick)')
    parser.add_argument('--out', help='report folder (default: docs/robustness; --quick: <work dir>/report)')
    args = parser.parse_args(argv)
    args.command = ' '.join(['python tools/robustness_study.py'] + list(sys.argv[1:] if argv is None else argv))
    quick = args.quick
    args.seeds = args.seeds or ([0] if quick else [0, 1])
    args.scenes = args.scenes or (2 if quick else 150)
    args.stage1_epochs = args.stage1_epochs or (2 if quick else 12)
    args.stage2_epochs = args.stage2_epochs or (1 if quick else 4)
    args.corruptions = list(args.corruptions or (QUICK_CORRUPTIONS if quick else DEFAULT_CORRUPTIONS))
    if CLEAN not in args.corruptions:
        args.corruptions.insert(0, CLEAN)
    args.data_root = args.data_root or ('data/synthetic_study_quick' if quick else 'data/synthetic_study')
    args.work_dir = args.work_dir or ('work_dirs/study_quick' if quick else f'work_dirs/study_{args.baseline}')
    args.out = args.out or (osp.join(args.work_dir, 'report') if quick else 'docs/robustness')
    return args


def record_seconds(args: argparse.Namespace, step: str, seconds: float) -> None:
    """Keep a finished step's wall time in ``<work dir>/.study_seconds.json`` (a resumed study keeps the total).

    A step run again (or skipped, as the data step is inside tools/demo.py) keeps its longest time.
    """
    path = osp.join(REPO_ROOT, args.work_dir, '.study_seconds.json')
    times = demo.read_json(path) if osp.exists(path) else {}
    times[step] = max(seconds, times.get(step, 0.0))
    os.makedirs(osp.dirname(path), exist_ok=True)
    demo.write_json(path, times)


def total_minutes(args: argparse.Namespace) -> float:
    """The wall time of every step the study ran, over all its invocations."""
    path = osp.join(REPO_ROOT, args.work_dir, '.study_seconds.json')
    return sum(demo.read_json(path).values()) / 60 if osp.exists(path) else 0.0


def dataset_options(args: argparse.Namespace) -> argparse.Namespace:
    """The options tools/demo.py's data functions take: the demo's generator with ``--scenes``."""
    return argparse.Namespace(data_root=args.data_root, scenes=args.scenes, samples=2, seed=0)


def prepare_data(args: argparse.Namespace) -> None:
    """Step 1: the synthetic set, info files and GT database (tools/demo.py; skipped when its stamp matches)."""
    start = time.time()
    demo.prepare_data(dataset_options(args), TOTAL_STEPS)
    record_seconds(args, f'data {args.data_root} ({args.scenes} scenes)', time.time() - start)


def set_modality_drop(cfg, image_drop: float, lidar_drop: float) -> None:
    """Set the drop probabilities of the ``ModalMask3D`` step of ``cfg``'s training pipeline (in place).

    Raises:
        ValueError: the training pipeline has no ``ModalMask3D`` step.
    """
    train = cfg.data.train
    pipeline = train.get('pipeline') or train.dataset.pipeline
    steps = [step for step in pipeline if step['type'] == 'ModalMask3D']
    if not steps:
        raise ValueError('the training pipeline has no ModalMask3D step: the study trains with modality drop')
    for step in steps:
        step.update(image_drop_prob=image_drop, points_drop_prob=lidar_drop)


def labels(args: argparse.Namespace) -> Dict[str, str]:
    """The table label of each of :data:`MODELS` under ``--baseline``."""
    return BASELINES[args.baseline]['labels']


def model_config(args: argparse.Namespace, name: str) -> str:
    """The config that trains model ``name``: stage 1 and the control the baseline's, CMT-AQR its stage 2."""
    return AQR_STAGE2_CONFIG if name == 'cmt_aqr' else BASELINES[args.baseline]['config']


def study_config(args: argparse.Namespace, name: str, epochs: int, load_from: Optional[str]):
    """The mmcv ``Config`` that trains ``name`` (see :func:`model_config`) on the study set."""
    from mmcv import Config

    from projects.mmdet3d_plugin.datasets.data_root_config import retarget_data_root
    cfg = retarget_data_root(Config.fromfile(osp.join(REPO_ROOT, model_config(args, name))),
                             osp.join(REPO_ROOT, args.data_root))
    set_modality_drop(cfg, args.image_drop, args.lidar_drop)
    cfg.merge_from_dict({'runner.max_epochs': epochs, 'checkpoint_config.max_keep_ckpts': 1, 'load_from': load_from})
    return cfg


def config_path(args: argparse.Namespace, work_dir: str, name: str) -> str:
    return osp.join(work_dir, osp.basename(model_config(args, name)))


def train(args: argparse.Namespace, name: str, work_dir: str, epochs: int, seed: int,
          load_from: Optional[str] = None) -> str:
    """Train model ``name`` into ``work_dir`` (skipped when done, resumed when interrupted); its checkpoint.

    The work dir is marked with the config and dataset it was made for (tools/demo.py's ``claim_work_dir``):
    changing an option stops the study instead of mixing old checkpoints into new results.
    """
    checkpoint = osp.join(work_dir, f'epoch_{epochs}.pth')
    cfg = study_config(args, name, epochs, load_from)
    os.makedirs(osp.join(REPO_ROOT, work_dir), exist_ok=True)
    demo.claim_work_dir(work_dir, dict(demo.run_fingerprint(cfg, dataset_options(args)), seed=seed))
    if osp.exists(osp.join(REPO_ROOT, checkpoint)):
        print(f'  {checkpoint} exists', flush=True)
        return checkpoint
    config = config_path(args, work_dir, name)
    cfg.dump(osp.join(REPO_ROOT, config))
    start = time.time()
    demo.run(['tools/train.py', config, '--work-dir', work_dir, '--auto-resume', '--no-validate', '--seed',
              str(seed)])
    record_seconds(args, f'train {work_dir}', time.time() - start)
    return checkpoint


def evaluate(args: argparse.Namespace, name: str, checkpoint: str, out_dir: str) -> Dict[str, dict]:
    """tools/eval_robustness.py on one checkpoint (skipped when its report has every corruption).

    Returns:
        dict[str, dict]: corruption -> its result (``status``, ``mAP``, ``NDS``, ...).
    """
    report = osp.join(REPO_ROOT, out_dir, 'robustness.json')
    results = {}
    if osp.exists(report):
        results = {result['corruption']: result for result in demo.read_json(report)['results']}
    if set(args.corruptions) - set(results):
        start = time.time()
        demo.run(['tools/eval_robustness.py', config_path(args, osp.dirname(checkpoint), name), checkpoint, '--out',
                  out_dir, '--corruptions'] + args.corruptions)
        record_seconds(args, f'evaluate {out_dir}', time.time() - start)
        results = {result['corruption']: result for result in demo.read_json(report)['results']}
    else:
        print(f'  {out_dir}/robustness.json has every corruption', flush=True)
    return results


def _stats(values: List[float]) -> Optional[dict]:
    return dict(mean=statistics.fmean(values), min=min(values), max=max(values), n=len(values)) if values else None


def summarise(runs: Dict[str, List[Dict[str, dict]]], corruptions: Sequence[str]) -> Dict[str, dict]:
    """Per corruption: each model's NDS / mAP over the seeds, and CMT-AQR's per-seed differences.

    Args:
        runs (dict): model -> one ``{corruption: result}`` per seed (same seed order for every model).
        corruptions (Sequence[str]): the rows.

    Returns:
        dict: ``summary[corruption][model][score]`` and ``summary[corruption]['aqr_minus_' + other][score]``
        (``other`` in ``control``, ``cmt``): ``dict(mean, min, max, n)`` over the seeds where both runs
        succeeded, or None.
    """
    def score_of(result: dict, score: str) -> Optional[float]:
        return result[score] if result.get('status') == 'ok' else None

    summary = {}
    for corruption in corruptions:
        row = {}
        for model in MODELS:
            seeds = [seed.get(corruption, {}) for seed in runs[model]]
            row[model] = {score: _stats([v for v in (score_of(r, score) for r in seeds) if v is not None])
                          for score in SCORES}
        for other in ('control', 'cmt'):
            pairs = list(zip(runs['cmt_aqr'], runs[other]))
            row[f'aqr_minus_{other}'] = {
                score: _stats([score_of(a.get(corruption, {}), score) - score_of(b.get(corruption, {}), score)
                               for a, b in pairs
                               if None not in (score_of(a.get(corruption, {}), score),
                                               score_of(b.get(corruption, {}), score))])
                for score in SCORES}
        summary[corruption] = row
    return summary


def _cell(stats: Optional[dict], signed: bool = False) -> str:
    if stats is None:
        return 'failed'
    sign = '+' if signed else ''
    spread = f' ({stats["min"]:{sign}.3f} … {stats["max"]:{sign}.3f})' if stats['n'] > 1 else ''
    return f'{stats["mean"]:{sign}.3f}{spread}'


def _epochs(count: int) -> str:
    return f'{count} epoch' + ('s' if count != 1 else '')


def markdown_report(summary: Dict[str, dict], args: argparse.Namespace, minutes: float,
                    routing: Dict[str, dict], pictures: Dict[str, List[str]]) -> str:
    """The text of ``study.md``: setup, one NDS and one mAP table, the chart, the routing table and pictures."""
    stage1 = (f'once (seed {args.seeds[0]}), shared by every seed\'s stage 2, so the spread covers stage 2 only'
              if args.shared_stage1 else 'per seed')
    baseline = BASELINES[args.baseline]
    names = labels(args)
    lines = [
        '# Robustness study: CMT vs CMT-AQR vs a fine-tuning control', '',
        f'Written by `{args.command}` (seeds {" ".join(map(str, args.seeds))}; {minutes:.0f} min of steps on '
        f'this machine). Numbers are the official nuScenes `DetectionEval` on the validation split of one '
        f'synthetic nuScenes set of {args.scenes} scenes x 2 samples (a fifth of the scenes for validation), '
        f'mean over the seeds with the min … max in brackets.', '',
        f'- stage 1, {stage1}: {baseline["description"]} (`{baseline["config"]}`, `--baseline {args.baseline}`), '
        f'trained {_epochs(args.stage1_epochs)} with ModalMask3D modality drop (images dropped with probability '
        f'{args.image_drop}, else points with probability {args.lidar_drop});',
        f'- stage 2 from that checkpoint, {_epochs(args.stage2_epochs)} each, same data and modality drop: '
        f'**CMT-AQR** (`{AQR_STAGE2_CONFIG}`: only the AQR weight generator (the router) and the attention bias '
        f'generator with alpha train, everything else frozen with its BatchNorm statistics) and the **control** '
        f'(`{baseline["config"]}` trained further for the same iterations: every parameter it trains, no routing);',
        f'- the differences are per seed (CMT-AQR minus the control / minus {baseline["short"]} of the same seed), '
        f'mean and range.',
        '']
    for score in SCORES:
        lines += [f'## {score}', '',
                  f'| corruption | {" | ".join(names[m] for m in MODELS)} | CMT-AQR − control | '
                  f'CMT-AQR − {baseline["short"]} |',
                  '|---|' + '---:|' * (len(MODELS) + 2)]
        for corruption, row in summary.items():
            cells = [_cell(row[m][score]) for m in MODELS]
            cells += [_cell(row[f'aqr_minus_{other}'][score], signed=True) for other in ('control', 'cmt')]
            lines.append(f'| {corruption} | ' + ' | '.join(cells) + ' |')
        lines.append('')
    lines += ['![NDS per corruption and model, the seeds\' range as error bars](study_nds.png)', '']
    lines += ['## Routing', '',
              f'Mean AQR weights of CMT-AQR (seed {args.seeds[0]}) over the first '
              f'{routing[args.corruptions[0]]["samples"]} validation samples: of the {TOP_QUERIES} best-scoring '
              'queries of each sample (those that make the detections) and of all queries. 1 trusts the modality '
              'fully.', '',
              f'| corruption | LiDAR, top {TOP_QUERIES} | camera, top {TOP_QUERIES} | LiDAR, all | camera, all |',
              '|---|---:|---:|---:|---:|']
    for corruption in args.corruptions:
        weights = [routing[corruption][group][modality] for group in ('top', 'all') for modality in ('lidar', 'camera')]
        lines.append(f'| {corruption} | ' + ' | '.join(f'{weight:.3f}' for weight in weights) + ' |')
    lines.append('')
    if pictures:
        lines += [f'CMT-AQR (seed {args.seeds[0]}) on validation sample {args.picture_sample}: LiDAR weight of each '
                  'query in the BEV (with the points that are left, ground truth green, predictions red), camera '
                  'weight of each query in the camera that sees it, and the attention bias of the highest-scoring '
                  'query (`tools/visualize_aqr.py`).', '']
        for corruption, files in pictures.items():
            lines += [f'### {corruption}', ''] + [f'![{corruption}: {name}]({name})' for name in files] + ['']
    return '\n'.join(lines)


def bar_chart(summary: Dict[str, dict], names: Dict[str, str], path: str) -> None:
    """Grouped bars of the mean NDS per corruption and model, with the seeds' min … max as error bars."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    corruptions = list(summary)
    width = 0.8 / len(MODELS)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(corruptions)), 3.5))
    for index, model in enumerate(MODELS):
        stats = [summary[corruption][model]['NDS'] for corruption in corruptions]
        means = [s['mean'] if s else 0.0 for s in stats]
        errors = [[s['mean'] - s['min'] if s else 0.0 for s in stats],
                  [s['max'] - s['mean'] if s else 0.0 for s in stats]]
        offset = (index - (len(MODELS) - 1) / 2) * width
        ax.bar([i + offset for i in range(len(corruptions))], means, width, yerr=errors, capsize=2,
               label=names[model])
    ax.set_xticks(range(len(corruptions)))
    ax.set_xticklabels(corruptions, rotation=30, ha='right', fontsize=8)
    ax.set_ylabel('NDS (synthetic val)')
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def routing_weights(args: argparse.Namespace, checkpoint: str) -> Dict[str, dict]:
    """CMT-AQR's mean LiDAR and camera weights per corruption over the first ``--routing-samples`` val samples.

    ``top`` averages the :data:`TOP_QUERIES` best-scoring queries of each sample (those that make the
    detections), ``all`` every query. Cached in ``<checkpoint dir>/routing.json``.

    Returns:
        dict[str, dict]: corruption -> ``{'top': {'lidar': w, 'camera': w}, 'all': {...}, 'samples': n}``.
    """
    cache = osp.join(REPO_ROOT, osp.dirname(checkpoint), 'routing.json')
    table = demo.read_json(cache) if osp.exists(cache) else {}
    missing = [corruption for corruption in args.corruptions if corruption not in table]
    if not missing:
        return table
    import torch
    from mmdet.utils import get_root_logger
    from mmdet3d.datasets import build_dataset

    from projects.mmdet3d_plugin.apis.decoder_capture import query_scores
    from projects.mmdet3d_plugin.apis.testing import (apply_corruption, build_test_model, load_test_config,
                                                      prepare_test_config)
    from tools.visualize_aqr import run_sample
    start = time.time()
    cfg = load_test_config(osp.join(REPO_ROOT, config_path(args, osp.dirname(checkpoint), 'cmt_aqr')))
    prepare_test_config(cfg)
    logger = get_root_logger(log_level=cfg.log_level)
    detector = None
    for corruption in missing:
        corrupted = apply_corruption(cfg, None if corruption == CLEAN else corruption, logger=logger)
        dataset = build_dataset(corrupted.data.test)
        detector = detector or build_test_model(cfg, osp.join(REPO_ROOT, checkpoint), dataset.CLASSES, logger)
        weights = dict(top=dict(lidar=[], camera=[]), all=dict(lidar=[], camera=[]))
        for index in range(min(args.routing_samples, len(dataset))):
            run = run_sample(detector, dataset, index)
            top = query_scores(run.snapshot.preds_dicts)[0][0].topk(TOP_QUERIES).indices
            for modality in ('lidar', 'camera'):
                values = getattr(run.snapshot.routing, f'{modality}_weights')[0].float()
                weights['top'][modality].append(values[top].mean().item())
                weights['all'][modality].append(values.mean().item())
        table[corruption] = {group: {modality: statistics.fmean(values) for modality, values in pair.items()}
                             for group, pair in weights.items()}
        table[corruption]['samples'] = len(weights['all']['lidar'])
        print(f'  routing under {corruption}: {table[corruption]}', flush=True)
    demo.write_json(cache, table)
    record_seconds(args, f'routing {checkpoint}', time.time() - start)
    return table


def _known_corruption(spec: str) -> bool:
    from projects.mmdet3d_plugin.datasets.pipelines.corruption import parse_corruption
    try:
        parse_corruption(spec)
    except ValueError as error:
        print(f'  skipping the routing picture under {spec}: {error}', flush=True)
        return False
    return True


def routing_pictures(args: argparse.Namespace, checkpoint: str) -> Dict[str, List[str]]:
    """AQR pictures of ``--picture-sample`` under each of :data:`PICTURE_CORRUPTIONS` that exists, copied to
    ``--out`` as ``study_<corruption>_<picture>.png``.

    Returns:
        dict[str, list[str]]: corruption -> the file names written (relative to ``--out``).
    """
    config = config_path(args, osp.dirname(checkpoint), 'cmt_aqr')
    written = {}
    for corruption in filter(_known_corruption, PICTURE_CORRUPTIONS):
        tag = corruption.replace(':', '_').replace('.', 'p')
        folder = osp.join(osp.dirname(checkpoint), 'pictures', tag)
        if not glob.glob(osp.join(REPO_ROOT, folder, '*.png')):
            start = time.time()
            demo.run(['tools/visualize_aqr.py', config, checkpoint, '--sample', str(args.picture_sample), '--out',
                      folder, '--score-thr', '0.2', '--corruption', corruption])
            record_seconds(args, f'pictures {folder}', time.time() - start)
        names = []
        for source in sorted(glob.glob(osp.join(REPO_ROOT, folder, '*.png'))):
            kind = osp.basename(source)[:-len('.png')].rsplit('_', 1)[-1]  # bev, cameras or bias
            names.append(f'study_{tag}_{kind}.png')
            shutil.copyfile(source, osp.join(REPO_ROOT, args.out, names[-1]))
        written[corruption] = names
    return written


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, dict]:
    args = parse_args(argv)
    prepare_data(args)
    runs: Dict[str, List[Dict[str, dict]]] = {model: [] for model in MODELS}
    first_aqr = None
    for seed in args.seeds:
        seed_dir = osp.join(args.work_dir, f'seed{seed}')
        stage1_seed = args.seeds[0] if args.shared_stage1 else seed
        demo.banner(3, TOTAL_STEPS, f'seed {seed}: stage 1, {labels(args)["cmt"]} with modality drop '
                    f'({args.stage1_epochs} epochs, seed {stage1_seed})')
        stage1_dir = osp.join(args.work_dir, f'seed{stage1_seed}', 'cmt')
        checkpoints = dict(cmt=train(args, 'cmt', stage1_dir, args.stage1_epochs, stage1_seed))
        for name in ('cmt_aqr', 'control'):
            demo.banner(3, TOTAL_STEPS, f'seed {seed}: stage 2, {labels(args)[name]} ({args.stage2_epochs} epochs)')
            checkpoints[name] = train(args, name, osp.join(seed_dir, name), args.stage2_epochs, seed,
                                      load_from=checkpoints['cmt'])
        first_aqr = first_aqr or checkpoints['cmt_aqr']
        for name in MODELS:
            demo.banner(4, TOTAL_STEPS, f'seed {seed}: {labels(args)[name]} clean and under '
                        f'{len(args.corruptions) - 1} corruptions')
            runs[name].append(evaluate(args, name, checkpoints[name],
                                       osp.join(osp.dirname(checkpoints[name]), 'robustness')))
    demo.banner(5, TOTAL_STEPS, f'report, chart and routing pictures in {args.out}')
    os.makedirs(osp.join(REPO_ROOT, args.out), exist_ok=True)
    summary = summarise(runs, args.corruptions)
    bar_chart(summary, labels(args), osp.join(REPO_ROOT, args.out, 'study_nds.png'))
    routing = routing_weights(args, first_aqr)
    pictures = routing_pictures(args, first_aqr)
    minutes = total_minutes(args)
    report = markdown_report(summary, args, minutes, routing, pictures)
    with open(osp.join(REPO_ROOT, args.out, 'study.md'), 'w') as f:
        f.write(report)
    with open(osp.join(REPO_ROOT, args.out, 'study.json'), 'w') as f:
        json.dump(dict(vars(args), summary=summary, runs=runs, routing=routing, minutes=minutes), f, indent=2)
    print(report)
    print(f'study: {minutes:.1f} min; report {osp.join(args.out, "study.md")}', flush=True)
    return summary


if __name__ == '__main__':
    main()
