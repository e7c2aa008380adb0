"""Paired benchmark of two detector configs (default: CMT vs CMT-AQR) on fixed synthetic inputs.

Examples::

    # R50 800x320 (voxel 0.1) and VoV 1600x640 (voxel 0.075), inference and a training step, 5 pairs each
    python tools/benchmark_model.py --threads 2 --out bench.json
    # R50 inference only, 3 pairs (a few minutes on two CPU cores)
    python tools/benchmark_model.py --shapes r50 --modes inference --pairs 3
    # VoV training step with the image backbone frozen (the full step needs more than 24 GB of host memory)
    python tools/benchmark_model.py --shapes vov --modes train --freeze img_backbone
    # the full VoV training step, with the image backbone's activations checkpointed (about 12 GB)
    python tools/benchmark_model.py --shapes vov --modes train --cfg-options model.img_backbone.with_cp=True
    # any two configs; tiny shapes (seconds)
    python tools/benchmark_model.py --configs A.py B.py --tiny

For every shape (a pair of configs, A and B), both detectors are built and
initialised with the same seed, then B gets every parameter and buffer of A
with the same name and shape (``share_weights``; B keeps only its own new
modules, e.g. AQR's). The inputs are fixed: one synthetic batch (seeded) of
LiDAR points around random boxes and six cameras with valid ``lidar2img``
(``projects/mmdet3d_plugin/apis/synthetic_batch.py``); no dataset is read.

Modes: ``inference`` is ``simple_test`` under ``torch.no_grad`` (eval mode);
``train`` is one training step: ``train_step`` (forward and losses, matching
included), backward, the config's gradient clipping and optimizer step
(mmcv ``build_optimizer``: AdamW with the config's per-module learning rates),
in fp32. ``--freeze MODULE ...`` stops those submodules' parameters from
training in A and B (no gradients, no saved activations, no optimizer
state): AQR adds nothing to e.g. the image backbone, so a ratio measured with
it frozen bounds the full step's ratio from above. After ``--warmup`` runs of each, A and B run alternately (A B A B
...) ``--pairs`` times; the table gives each one's median time and the median
of the paired ratios B/A with their min and max, so that a machine whose load
changes affects both sides of each ratio alike. On the CPU, time is
``time.perf_counter``; on CUDA, CUDA events around the run.

Per part: forward hooks on the backbones, necks, voxel layers and encoders,
head, AQR weight and bias generators, transformer and each attention of each
decoder layer, and wrappers around the head's ``loss`` (Hungarian matching
included) and its assigner's ``assign``; in training also the forward,
backward and optimizer step as a whole. Mean milliseconds per run over the
timed runs; indented rows are part of the row above them.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` minus the memory
allocated before the run, the largest over the timed runs. On the CPU, as
``tools/benchmark_attention.py`` does: in a separate process with glibc's mmap
threshold fixed (freed buffers leave the resident set), after one warm-up run
the kernel's resident-set high-water mark is reset and the peak is
``VmHWM - VmRSS`` around one more run: the memory the run needs beyond the
models and inputs (activations, gradients, outputs). ``--memory none`` skips it.
"""
import argparse
import gc
import json
import logging
import os
import os.path as osp
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from mmcv import Config, DictAction
from torch import nn

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from projects.mmdet3d_plugin.apis.model_benchmark import (PartTimer, build_detector, instrument,  # noqa: E402
                                                          share_weights, shrink_config)
from projects.mmdet3d_plugin.apis.synthetic_batch import random_demo_batch  # noqa: E402
from tools.benchmark_attention import _read_status_kb  # noqa: E402

#: shape name -> (config A, config B)
SHAPES = {
    'r50': ('configs/cmt_voxel0100_r50_800x320_cbgs.py', 'configs/cmt_aqr_voxel0100_r50_800x320_cbgs.py'),
    'vov': ('configs/cmt_voxel0075_vov_1600x640_cbgs.py', 'configs/cmt_aqr_voxel0075_vov_1600x640_cbgs.py'),
}
CUSTOM_SHAPE = 'custom'
MODES = ('inference', 'train')
#: ``--tiny``: a 19.2 m x 19.2 m range (a whole number of 16-voxel blocks at 0.1 m and 0.075 m), 64 x 160 images,
#: 60 queries, 5 boxes and 2 000 points per sample
TINY = dict(half_range=9.6, image_size=[64, 160], queries=60, boxes=5, points=2000)
TRAIN_ROWS = ('forward (train_step)', 'backward', 'optimizer step')
TOTAL_ROW = 'total'
MEMORY_ENV = dict(MALLOC_MMAP_THRESHOLD_='131072')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Paired benchmark of two detector configs (CMT vs CMT-AQR).')
    parser.add_argument('--shapes', nargs='+', choices=sorted(SHAPES), default=sorted(SHAPES),
                        help='config pairs to compare (default: r50 vov)')
    parser.add_argument('--configs', nargs=2, metavar=('A', 'B'), help='compare these two configs instead')
    parser.add_argument('--modes', nargs='+', choices=MODES, default=list(MODES))
    parser.add_argument('--pairs', type=int, default=5, help='timed (A, B) pairs per shape and mode')
    parser.add_argument('--warmup', type=int, default=1, help='untimed runs of each model first')
    parser.add_argument('--threads', type=int, help='torch.set_num_threads (default: torch\'s)')
    parser.add_argument('--device', default='cpu', help="'cpu' (default) or 'cuda'")
    parser.add_argument('--seed', type=int, default=0, help='weights and inputs')
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--boxes', type=int, help='ground-truth boxes per sample (default 30)')
    parser.add_argument('--points', type=int, help='LiDAR points per sample, around the boxes (default 30000)')
    parser.add_argument('--image-size', type=int, nargs=2, metavar=('H', 'W'),
                        help="camera image size (default: the config's)")
    parser.add_argument('--range', type=float, dest='half_range', metavar='METRES',
                        help="half side of the point cloud range, voxel size kept (default: the config's)")
    parser.add_argument('--queries', type=int, help="the head's queries (default: the config's)")
    parser.add_argument('--freeze', nargs='+', default=[], metavar='MODULE',
                        help='detector submodules (e.g. img_backbone) whose parameters do not train, in A and B: '
                             'their backward is skipped, so a training step needs far less memory')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={}, metavar='KEY=VALUE',
                        help='override settings of both configs, e.g. model.img_backbone.with_cp=True (activation '
                             'checkpointing: the full VoV training step in less memory)')
    parser.add_argument('--tiny', action='store_true',
                        help=f'small inputs and grids for a smoke run ({TINY}); explicit options win')
    parser.add_argument('--memory', choices=('auto', 'none'), default='auto',
                        help='peak memory: auto (CUDA allocator stats, or a separate CPU process) or none')
    parser.add_argument('--out', help='write the results as JSON here')
    parser.add_argument('--memory-worker', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = TINY if args.tiny else dict(boxes=30, points=30000)
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.pairs < 1 or args.warmup < 0 or args.boxes < 1:
        parser.error('--pairs and --boxes must be >= 1 and --warmup >= 0')
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        parser.error('no CUDA device is visible to torch')
    return args


def shape_configs(args: argparse.Namespace) -> Dict[str, Tuple[str, str]]:
    """Shape name -> (config A, config B) paths to run."""
    if args.configs:
        return {CUSTOM_SHAPE: tuple(args.configs)}
    return {shape: SHAPES[shape] for shape in args.shapes}


def load_config(path: str, args: argparse.Namespace) -> Config:
    """The config at ``path`` (relative to the repository root or not), shrunk as the options say."""
    cfg = Config.fromfile(path if osp.isabs(path) else osp.join(REPO_ROOT, path))
    cfg.merge_from_dict(args.cfg_options)
    return shrink_config(cfg, args.half_range, args.image_size, args.queries)


def freeze_modules(model: nn.Module, names: Sequence[str]) -> None:
    """Stop the parameters of ``model``'s submodules ``names`` (e.g. ``img_backbone``) from requiring gradients."""
    for name in names:
        module = getattr(model, name, None)
        if not isinstance(module, nn.Module):
            children = ', '.join(child for child, _ in model.named_children())
            raise ValueError(f'--freeze {name}: {type(model).__name__} has no submodule {name!r} '
                             f'(it has: {children})')
        module.requires_grad_(False)


def build_pair(paths: Tuple[str, str], args: argparse.Namespace) -> Tuple[List[nn.Module], List[Config], int]:
    """Models A and B (B with A's shared weights, ``--freeze`` applied) on ``args.device``, their configs, and the
    shared tensor count."""
    cfgs = [load_config(path, args) for path in paths]
    models = [build_detector(cfg, args.seed) for cfg in cfgs]
    shared = share_weights(models[0], models[1])
    for model in models:
        freeze_modules(model, args.freeze)
    return [model.to(args.device) for model in models], cfgs, len(shared)


def make_batch(cfg: Config, args: argparse.Namespace) -> dict:
    """The fixed input batch of a shape (the same for A and B, every run)."""
    generator = torch.Generator().manual_seed(args.seed)
    return random_demo_batch(cfg, [args.boxes] * args.batch_size, args.device, generator,
                             points_per_box=max(1, args.points // args.boxes))


def make_run(model: nn.Module, cfg: Config, mode: str, batch: dict, timer: PartTimer) -> Callable[[], None]:
    """One run of ``mode`` on ``batch``: ``simple_test`` without gradients, or a whole training step."""
    from mmcv.runner import build_optimizer

    if mode == 'inference':
        model.eval()

        def run_inference() -> None:
            with torch.no_grad():
                model.simple_test(batch['points'], batch['img_metas'], batch['img'])

        return run_inference
    model.train()
    optimizer = build_optimizer(model, cfg.optimizer)
    grad_clip = (cfg.get('optimizer_config') or {}).get('grad_clip')

    def update() -> None:
        if grad_clip:
            nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], **grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    forward = timer.wrap(TRAIN_ROWS[0], model.train_step)
    backward = timer.wrap(TRAIN_ROWS[1], torch.Tensor.backward)
    update = timer.wrap(TRAIN_ROWS[2], update)

    def run_train_step() -> None:
        backward(forward(batch, None)['loss'])
        update()

    return run_train_step


def timed_run(run: Callable[[], None], device: str) -> Tuple[float, Optional[float]]:
    """Milliseconds of one run and, on CUDA, the peak memory (MiB) it allocated beyond what was allocated before."""
    gc.collect()
    if not device.startswith('cuda'):
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1e3, None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    run()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end), (torch.cuda.max_memory_allocated() - before) / 2**20


def paired_runs(runs: Sequence[Callable[[], None]], timers: Sequence[PartTimer],
                args: argparse.Namespace) -> dict:
    """``--warmup`` then ``--pairs`` alternated runs of A and B: times, peak memory and mean ms per part."""
    for warmup in range(args.warmup):
        for side, run in enumerate(runs):
            start = time.perf_counter()
            run()
            print(f'  warm-up {warmup + 1}/{args.warmup} {"AB"[side]}: {time.perf_counter() - start:.1f} s', flush=True)
    for timer in timers:
        timer.collect()
    times: List[List[float]] = [[], []]
    peaks: List[List[float]] = [[], []]
    parts = [dict(), dict()]
    for pair in range(args.pairs):
        for side, run in enumerate(runs):
            milliseconds, peak = timed_run(run, args.device)
            times[side].append(milliseconds)
            if peak is not None and args.memory == 'auto':
                peaks[side].append(peak)
            for name, value in timers[side].collect().items():
                parts[side][name] = parts[side].get(name, 0.0) + value
        print(f'  pair {pair + 1}/{args.pairs}: A {times[0][-1] / 1e3:.2f} s, B {times[1][-1] / 1e3:.2f} s, '
              f'B/A {times[1][-1] / times[0][-1]:.3f}', flush=True)
    ratios = [b / a for a, b in zip(*times)]
    return dict(
        times_ms=dict(A=times[0], B=times[1]),
        median_ms=dict(A=statistics.median(times[0]), B=statistics.median(times[1])),
        ratio=dict(median=statistics.median(ratios), min=min(ratios), max=max(ratios), pairs=ratios),
        peak_mib=dict(A=max(peaks[0]) if peaks[0] else None, B=max(peaks[1]) if peaks[1] else None),
        parts_ms=[{name: value / args.pairs for name, value in side.items()} for side in parts])


def merge_rows(first: Sequence[str], second: Sequence[str]) -> List[str]:
    """``first`` with every row only in ``second`` inserted after its predecessor there (data-flow order)."""
    merged = list(first)
    for index, row in enumerate(second):
        if row not in merged:
            merged.insert(merged.index(second[index - 1]) + 1 if index else 0, row)
    return merged


def benchmark_shape(shape: str, paths: Tuple[str, str], args: argparse.Namespace) -> List[dict]:
    """Every mode of one config pair: a result dict per mode (see :func:`paired_runs`, plus the part rows)."""
    models, cfgs, num_shared = build_pair(paths, args)
    batch = make_batch(cfgs[0], args)
    timers = [PartTimer(torch.device(args.device)) for _ in models]
    part_rows = [instrument(model, timer) for model, timer in zip(models, timers)]
    points = [len(p) for p in batch['points']]
    frozen = f'; frozen (no training): {", ".join(args.freeze)}' if args.freeze else ''
    frozen += ''.join(f'; {key}={value}' for key, value in args.cfg_options.items())
    print(f'\n{shape}: A = {paths[0]}, B = {paths[1]}; B got {num_shared} of A\'s tensors{frozen}; inputs: '
          f'{args.batch_size} x ({points[0]} points, {args.boxes} boxes, 6 cameras '
          f'{"x".join(map(str, batch["img"].shape[-2:]))}); {cfgs[0].model.pts_bbox_head.num_query} queries',
          flush=True)
    results = []
    for mode in args.modes:
        runs = [make_run(model, cfg, mode, batch, timer) for model, cfg, timer in zip(models, cfgs, timers)]
        result = dict(shape=shape, mode=mode, configs=list(paths), shared_tensors=num_shared, frozen=list(args.freeze),
                      cfg_options=dict(args.cfg_options),
                      points_per_sample=points, **paired_runs(runs, timers, args))
        extra = list(TRAIN_ROWS) if mode == 'train' else []
        rows = merge_rows(part_rows[0] + extra, part_rows[1] + extra)
        result['part_rows'] = [row for row in rows if any(row in side for side in result['parts_ms'])] + [TOTAL_ROW]
        for side, name in enumerate('AB'):
            result['parts_ms'][side][TOTAL_ROW] = statistics.mean(result['times_ms'][name])
        results.append(result)
        print(f'{shape} {mode}: A {result["median_ms"]["A"]:.1f} ms, B {result["median_ms"]["B"]:.1f} ms, '
              f'B/A {result["ratio"]["median"]:.3f}', flush=True)
    return results


def measure_memory(args: argparse.Namespace, shape: str, paths: Tuple[str, str]) -> Dict[str, List[float]]:
    """Mode -> [peak MiB of A, of B] of one run beyond the models and inputs (CPU; see the module doc)."""
    models, cfgs, _ = build_pair(paths, args)
    batch = make_batch(cfgs[0], args)
    peaks = {}
    for mode in args.modes:
        peaks[mode] = []
        for model, cfg in zip(models, cfgs):
            run = make_run(model, cfg, mode, batch, PartTimer(torch.device('cpu')))
            run()
            gc.collect()
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')
            before = _read_status_kb('VmRSS')
            run()
            peaks[mode].append((_read_status_kb('VmHWM') - before) / 1024)
    return peaks


def memory_in_subprocess(args: argparse.Namespace, shape: str, paths: Tuple[str, str]) -> Dict[str, List[float]]:
    """:func:`measure_memory` in a fresh interpreter with glibc's mmap threshold fixed."""
    worker = dict(vars(args), memory_worker=None, out=None)
    proc = subprocess.run([sys.executable, osp.abspath(__file__), '--memory-worker',
                           json.dumps(dict(args=worker, shape=shape, paths=list(paths)))],
                          capture_output=True, text=True, env=dict(os.environ, **MEMORY_ENV), cwd=REPO_ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f'the memory measurement of {shape} failed:\n{proc.stderr[-3000:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ms(value: Optional[float], signed: bool = False) -> str:
    if value is None:
        return '—'
    return f'{value:{"+" if signed else ""}.{1 if abs(value) >= 10 else 2}f}'


def _mib(value: Optional[float]) -> str:
    return '—' if value is None else f'{value:.0f} MiB'


def _mode_label(result: dict) -> str:
    """The mode, with the frozen modules (training) and the config overrides it ran with."""
    notes = [f'{", ".join(result["frozen"])} frozen'] if result['frozen'] and result['mode'] == 'train' else []
    notes += [f'{key}={value}' for key, value in result.get('cfg_options', {}).items()]
    return f'{result["mode"]} ({"; ".join(notes)})' if notes else result['mode']


def markdown_tables(results: List[dict]) -> str:
    """The summary table (median times, paired ratio, peak memory) and a per-part table of each shape and mode."""
    lines = ['| shape | mode | A median ms | B median ms | B/A median [min, max] | peak A | peak B |',
             '|---|---|---:|---:|---|---:|---:|']
    for r in results:
        ratio = r['ratio']
        lines.append(f'| {r["shape"]} | {_mode_label(r)} | {_ms(r["median_ms"]["A"])} | {_ms(r["median_ms"]["B"])} | '
                     f'{ratio["median"]:.3f} [{ratio["min"]:.3f}, {ratio["max"]:.3f}] | '
                     f'{_mib(r["peak_mib"]["A"])} | {_mib(r["peak_mib"]["B"])} |')
    for r in results:
        a_name, b_name = (osp.splitext(osp.basename(path))[0] for path in r['configs'])
        lines += ['', f'{r["shape"]} {r["mode"]}: mean ms per run over {len(r["times_ms"]["A"])} runs '
                  f'(A = {a_name}, B = {b_name}; indented rows are part of the row above)', '',
                  '| part | A ms | B ms | B − A ms |', '|---|---:|---:|---:|']
        for row in r['part_rows']:
            a, b = (side.get(row) for side in r['parts_ms'])
            difference = b - a if a is not None and b is not None else None
            label = '· ' * ((len(row) - len(row.lstrip())) // 2) + row.lstrip()
            lines.append(f'| {label} | {_ms(a)} | {_ms(b)} | {_ms(difference, signed=True)} |')
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    job = json.loads(args.memory_worker) if args.memory_worker else None
    if job:
        args = argparse.Namespace(**job['args'])
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger('mmcv').setLevel(logging.WARNING)  # init_weights lists every parameter at INFO
    if job:
        peaks = measure_memory(args, job['shape'], tuple(job['paths']))
        print(json.dumps(peaks))
        return peaks
    device_name = torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'
    print(f'# benchmark_model: torch {torch.__version__}, device {device_name}, {torch.get_num_threads()} threads, '
          f'{args.pairs} pairs after {args.warmup} warm-up runs each, modes {args.modes}', flush=True)
    results = []
    for shape, paths in shape_configs(args).items():
        shape_results = benchmark_shape(shape, paths, args)
        gc.collect()  # the shape's models (reference cycles through the timers' wrappers) before the next ones
        if args.memory == 'auto' and not args.device.startswith('cuda'):
            peaks = memory_in_subprocess(args, shape, paths)
            for result in shape_results:
                result['peak_mib'] = dict(zip('AB', peaks[result['mode']]))
        results += shape_results
    print('\n' + markdown_tables(results))
    report = dict(torch=torch.__version__, device=device_name, threads=torch.get_num_threads(),
                  settings={key: value for key, value in vars(args).items() if key != 'memory_worker'},
                  results=results)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == '__main__':
    main()
