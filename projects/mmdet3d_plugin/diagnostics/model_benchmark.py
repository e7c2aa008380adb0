"""Paired benchmark of two detector configs (default: CMT vs CMT-AQR) on fixed synthetic inputs
(``tools/benchmark_model.py``; ``tools/check_gpu.py`` runs it on CUDA).

Per shape (a pair of configs A and B) both detectors are built with the same seed and B gets every parameter
and buffer of A with the same name and shape (:func:`share_weights`); both run one seeded synthetic batch
(:mod:`.synthetic_batch`). :func:`shrink_config` makes a config cheaper (range, image size, queries) without
changing its architecture.

Modes: ``inference`` is ``simple_test`` under ``torch.no_grad``; ``train`` is one training step: forward and
losses, backward, gradient clipping and the optimizer step (:class:`.optimizer_step.OptimizerStep`), in fp32, or
with ``mixed_precision`` (CUDA) as the configs' fp16 optimizer hook trains: ``auto_fp16`` modules under autocast
but those ``custom_fp16`` keeps in fp32, the loss scaled by a dynamic ``GradScaler``. ``freeze`` keeps those
submodules from training in A and B. After ``warmup`` runs of each, A and B alternate ``pairs`` times; a result
has each one's median time and the median, min and max of the paired ratios B/A, so that a change of machine
load affects both sides of a ratio alike. Time is ``time.perf_counter`` on the CPU, CUDA events on CUDA.

Per part (:mod:`.part_timer`): mean milliseconds of the backbones, necks, voxel layers, encoders, head, AQR
generators, transformer, each attention, the head's ``loss`` and its assigner; in training also forward, backward
and optimizer step; per model, the attention kernels and dtypes its runs used (``attention``; ``attention_dtype``
sets every cross-attention's precision). Peak memory: ``torch.cuda.max_memory_allocated`` beyond the memory
before the run on CUDA; on the CPU ``VmHWM - VmRSS`` around one run in a separate process
(:mod:`.process_memory`).
"""
import dataclasses
import gc
import logging
import statistics
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmcv import Config
from torch import nn

from ..attention.dispatch import recorded_backends
from ..mmcv_custom.fp16_optimizer_hook import enable_config_fp16
from ..models.utils.petr_attention import set_attention_dtype
from ..utils.cpu_allocator import keep_freed_memory
from .optimizer_step import OptimizerStep
from .part_timer import PartTimer, instrument
from .process_memory import memory_in_subprocess, peak_rss_mib
from ..utils.repo_paths import repo_path
from .synthetic_batch import random_demo_batch

#: shape name -> (config A, config B)
SHAPES = {
    'r50': ('configs/cmt_voxel0100_r50_800x320_cbgs.py', 'configs/cmt_aqr_voxel0100_r50_800x320_cbgs.py'),
    'vov': ('configs/cmt_voxel0075_vov_1600x640_cbgs.py', 'configs/cmt_aqr_voxel0075_vov_1600x640_cbgs.py'),
}
CUSTOM_SHAPE = 'custom'
MODES = ('inference', 'train')
#: ``tiny``: a 19.2 m x 19.2 m range (a whole number of 16-voxel blocks at 0.1 m and 0.075 m), 64 x 160 images,
#: 60 queries, 5 boxes and 2 000 points per sample
TINY = dict(half_range=9.6, image_size=[64, 160], queries=60, boxes=5, points=2000)
#: ``boxes`` and ``points`` without ``tiny``
FULL = dict(boxes=30, points=30000)
TRAIN_ROWS = ('forward (train_step)', 'backward', 'optimizer step')
TOTAL_ROW = 'total'


@dataclass
class ModelBenchmarkOptions:
    """What to compare and how (``tools/benchmark_model.py``'s options).

    Attributes:
        shapes (list[str]): keys of :data:`SHAPES` to run (unless ``configs``).
        configs (list[str], optional): two configs (A, B) to compare instead.
        modes (list[str]): ``inference`` and/or ``train``.
        pairs (int): timed (A, B) pairs per shape and mode.
        warmup (int): untimed runs of each model first.
        threads (int, optional): ``torch.set_num_threads``.
        device (str): ``cpu`` or ``cuda``.
        seed (int): weights and inputs.
        batch_size (int): samples per batch.
        boxes (int, optional): ground-truth boxes per sample (default 30; tiny 5).
        points (int, optional): LiDAR points per sample, around the boxes (default 30 000; tiny 2 000).
        image_size (list[int], optional): camera image (H, W) (default: the config's; tiny 64 x 160).
        half_range (float, optional): half side of the point cloud range in metres, voxel size kept.
        queries (int, optional): the head's queries (default: the config's; tiny 60).
        freeze (list[str]): detector submodules whose parameters do not train, in A and B.
        cfg_options (dict): settings overridden in both configs.
        tiny (bool): :data:`TINY` for every option not given.
        memory (str): ``auto`` (CUDA allocator stats, or a separate CPU process) or ``none``.
        keep_freed_memory (bool): on the CPU, glibc keeps freed memory for reuse in the timing process
            (:func:`~..utils.cpu_allocator.keep_freed_memory`): no page faults of memory returned between steps,
            which move parts whose code is the same in both models by hundreds of milliseconds (peak memory is
            still measured with the allocator as it comes).
        attention_dtype (str, optional): every cross-attention's ``attention_dtype`` in A and B (``'auto'``,
            ``'float16'``, ``'bfloat16'``, ``'float32'``; default: the configs').
        mixed_precision (bool): A and B in their configs' mixed precision (CUDA only; see the module docstring).
    """

    shapes: List[str] = field(default_factory=lambda: sorted(SHAPES))
    configs: Optional[List[str]] = None
    modes: List[str] = field(default_factory=lambda: list(MODES))
    pairs: int = 5
    warmup: int = 1
    threads: Optional[int] = None
    device: str = 'cpu'
    seed: int = 0
    batch_size: int = 1
    boxes: Optional[int] = None
    points: Optional[int] = None
    image_size: Optional[List[int]] = None
    half_range: Optional[float] = None
    queries: Optional[int] = None
    freeze: List[str] = field(default_factory=list)
    cfg_options: dict = field(default_factory=dict)
    tiny: bool = False
    memory: str = 'auto'
    keep_freed_memory: bool = False
    attention_dtype: Optional[str] = None
    mixed_precision: bool = False

    def resolved(self) -> 'ModelBenchmarkOptions':
        """A copy with the options not given taken from :data:`TINY` (``tiny``) or :data:`FULL`.

        Raises:
            ValueError: ``mixed_precision`` off CUDA (mmcv's ``auto_fp16`` would cast the inputs to half).
        """
        if self.mixed_precision and not self.device.startswith('cuda'):
            raise ValueError(f'mixed precision (the configs\' fp16 optimizer hook) needs CUDA, got device '
                             f'{self.device!r}: on the CPU the hook trains in fp32')
        options = dataclasses.replace(self)
        for name, value in (TINY if self.tiny else FULL).items():
            if getattr(options, name) is None:
                setattr(options, name, value)
        return options


def shape_configs(options: ModelBenchmarkOptions) -> Dict[str, Tuple[str, str]]:
    """Shape name -> (config A, config B) paths to run."""
    if options.configs:
        return {CUSTOM_SHAPE: tuple(options.configs)}
    return {shape: SHAPES[shape] for shape in options.shapes}


def load_config(path: str, options: ModelBenchmarkOptions) -> Config:
    """The config at ``path`` (relative to the repository root or not), shrunk as the options say."""
    cfg = Config.fromfile(repo_path(path))
    cfg.merge_from_dict(options.cfg_options)
    return shrink_config(cfg, options.half_range, options.image_size, options.queries)


def shrink_config(cfg: Config, half_range: Optional[float] = None, image_size: Optional[Sequence[int]] = None,
                  num_query: Optional[int] = None) -> Config:
    """``cfg`` (changed in place and returned) with a smaller point cloud range, image size or query count.

    Args:
        cfg (Config): a CMT detector config (``point_cloud_range``,
            ``ida_aug_conf``, ``model``).
        half_range (float, optional): the new range is ``[-r, r]`` in x and
            y (z unchanged); voxel sizes stay, so the voxel grid and BEV map
            shrink (``sparse_shape`` or the pillar scatter's ``output_shape``,
            ``grid_size``).
        image_size (Sequence[int], optional): ``(H, W)`` of the camera images
            (``ida_aug_conf['final_dim']``), multiples of 32.
        num_query (int, optional): the head's learned queries.

    Raises:
        ValueError: a range whose side is not a multiple of
            ``2 * out_size_factor`` voxels (the BEV map's stride, then
            SECOND's stride 2 undone by its FPN), or an image side that is not
            a multiple of 32.
    """
    model = cfg.model
    if half_range is not None:
        voxel = model.pts_voxel_layer.voxel_size[0]
        grid = int(round(2 * half_range / voxel))
        multiple = 2 * model.train_cfg.pts.out_size_factor
        if abs(grid * voxel - 2 * half_range) > 1e-6 or grid % multiple:
            raise ValueError(f'half range {half_range} m is {2 * half_range / voxel:g} voxels of {voxel} m across; '
                             f'it must be a whole multiple of {multiple} voxels')
        old = list(cfg.point_cloud_range)
        _replace_ranges(cfg._cfg_dict, [-half_range, -half_range, old[2], half_range, half_range, old[5]])
        encoder = model.pts_middle_encoder
        if 'sparse_shape' in encoder:  # spconv SparseEncoder
            encoder.sparse_shape = [encoder.sparse_shape[0], grid, grid]
        if 'output_shape' in encoder:  # pillars: PointPillarsScatter
            encoder.output_shape = [grid, grid]
        for mode_cfg in (model.train_cfg.pts, model.test_cfg.pts):
            mode_cfg.grid_size = [grid, grid, mode_cfg.grid_size[2]]
    if image_size is not None:
        if any(side % 32 for side in image_size):
            raise ValueError(f'image size {tuple(image_size)}: both sides must be multiples of 32')
        cfg.ida_aug_conf['final_dim'] = tuple(image_size)
    if num_query is not None:
        model.pts_bbox_head.num_query = num_query
    return cfg


def _replace_ranges(node: Union[dict, list], new_range: List[float]) -> None:
    """Set every ``point_cloud_range`` / ``pc_range`` under ``node`` to ``new_range``."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in list(items):
        if key in ('point_cloud_range', 'pc_range'):
            node[key] = list(new_range)
        elif isinstance(value, (dict, list)):
            _replace_ranges(value, new_range)


def build_detector(cfg: Config, seed: int) -> nn.Module:
    """The config's detector, built and initialised (``init_weights``) after ``torch.manual_seed(seed)``."""
    from mmdet3d.models import build_model

    torch.manual_seed(seed)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


def share_weights(source: nn.Module, target: nn.Module) -> List[str]:
    """Copy into ``target`` every parameter and buffer of ``source`` with the same name and shape.

    Returns:
        list[str]: the copied state-dict keys; ``target``'s other entries
        (e.g. CMT-AQR's ``aqr_weight_generator.*``) keep their values.
    """
    target_state, source_state = target.state_dict(), source.state_dict()
    shared = OrderedDict((name, value) for name, value in source_state.items()
                         if name in target_state and target_state[name].shape == value.shape)
    # the per-module versions: without them spconv 2's loader takes the weights for spconv 1's layout
    shared._metadata = source_state._metadata
    target.load_state_dict(shared, strict=False)
    return list(shared)


def freeze_modules(model: nn.Module, names: Sequence[str]) -> None:
    """Stop the parameters of ``model``'s submodules ``names`` (e.g. ``img_backbone``) from requiring gradients."""
    for name in names:
        module = getattr(model, name, None)
        if not isinstance(module, nn.Module):
            children = ', '.join(child for child, _ in model.named_children())
            raise ValueError(f'--freeze {name}: {type(model).__name__} has no submodule {name!r} '
                             f'(it has: {children})')
        module.requires_grad_(False)


def build_pair(paths: Tuple[str, str],
               options: ModelBenchmarkOptions) -> Tuple[List[nn.Module], List[Config], int]:
    """Models A and B (B with A's shared weights, ``freeze`` applied) on ``options.device``, their configs, and
    the shared tensor count."""
    cfgs = [load_config(path, options) for path in paths]
    models = [build_detector(cfg, options.seed) for cfg in cfgs]
    shared = share_weights(models[0], models[1])
    for model, cfg in zip(models, cfgs):
        freeze_modules(model, options.freeze)
        if options.attention_dtype is not None:
            set_attention_dtype(model, options.attention_dtype)
        if options.mixed_precision:
            enable_config_fp16(model, cfg.get('optimizer_config') or {})
    return [model.to(options.device) for model in models], cfgs, len(shared)


def make_batch(cfg: Config, options: ModelBenchmarkOptions) -> dict:
    """The fixed input batch of a shape (the same for A and B, every run)."""
    generator = torch.Generator().manual_seed(options.seed)
    return random_demo_batch(cfg, [options.boxes] * options.batch_size, options.device, generator,
                             points_per_box=max(1, options.points // options.boxes))


def make_run(model: nn.Module, cfg: Config, mode: str, batch: dict, timer: PartTimer,
             mixed_precision: bool = False) -> Callable[[], None]:
    """One run of ``mode`` on ``batch``: ``simple_test`` without gradients, or a whole training step (with
    ``mixed_precision``, its loss scaled and its gradients unscaled before clipping by a dynamic ``GradScaler``, as
    mmcv's ``Fp16OptimizerHook`` does)."""
    if mode == 'inference':
        model.eval()

        def run_inference() -> None:
            with torch.no_grad():
                model.simple_test(batch['points'], batch['img_metas'], batch['img'])

        return run_inference
    model.train()
    step = OptimizerStep(model, cfg)
    scaler = torch.amp.GradScaler(next(model.parameters()).device.type, enabled=mixed_precision)

    def update() -> None:
        scaler.unscale_(step.optimizer)
        step.clip_grads()
        scaler.step(step.optimizer)
        scaler.update()
        step.optimizer.zero_grad(set_to_none=True)

    forward = timer.wrap(TRAIN_ROWS[0], model.train_step)
    backward = timer.wrap(TRAIN_ROWS[1], torch.Tensor.backward)
    update = timer.wrap(TRAIN_ROWS[2], update)

    def run_train_step() -> None:
        backward(scaler.scale(forward(batch, None)['loss']))
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
                options: ModelBenchmarkOptions) -> dict:
    """``warmup`` then ``pairs`` alternated runs of A and B: times, peak memory and mean ms per part."""
    for warmup in range(options.warmup):
        for side, run in enumerate(runs):
            start = time.perf_counter()
            run()
            print(f'  warm-up {warmup + 1}/{options.warmup} {"AB"[side]}: {time.perf_counter() - start:.1f} s',
                  flush=True)
    for timer in timers:
        timer.collect()
    times: List[List[float]] = [[], []]
    peaks: List[List[float]] = [[], []]
    parts = [dict(), dict()]
    kernels = [Counter(), Counter()]
    for pair in range(options.pairs):
        for side, run in enumerate(runs):
            with recorded_backends() as record:
                milliseconds, peak = timed_run(run, options.device)
            kernels[side].update(record)
            times[side].append(milliseconds)
            if peak is not None and options.memory == 'auto':
                peaks[side].append(peak)
            for name, value in timers[side].collect().items():
                parts[side][name] = parts[side].get(name, 0.0) + value
        print(f'  pair {pair + 1}/{options.pairs}: A {times[0][-1] / 1e3:.2f} s, B {times[1][-1] / 1e3:.2f} s, '
              f'B/A {times[1][-1] / times[0][-1]:.3f}', flush=True)
    ratios = [b / a for a, b in zip(*times)]
    return dict(
        times_ms=dict(A=times[0], B=times[1]),
        median_ms=dict(A=statistics.median(times[0]), B=statistics.median(times[1])),
        ratio=dict(median=statistics.median(ratios), min=min(ratios), max=max(ratios), pairs=ratios),
        peak_mib=dict(A=max(peaks[0]) if peaks[0] else None, B=max(peaks[1]) if peaks[1] else None),
        attention=[{f'{backend} {dtype}': count / options.pairs for (backend, dtype), count in sorted(side.items())}
                   for side in kernels],
        parts_ms=[{name: value / options.pairs for name, value in side.items()} for side in parts])


def merge_rows(first: Sequence[str], second: Sequence[str]) -> List[str]:
    """``first`` with every row only in ``second`` inserted after its predecessor there (data-flow order)."""
    merged = list(first)
    for index, row in enumerate(second):
        if row not in merged:
            merged.insert(merged.index(second[index - 1]) + 1 if index else 0, row)
    return merged


def benchmark_shape(shape: str, paths: Tuple[str, str], options: ModelBenchmarkOptions) -> List[dict]:
    """Every mode of one config pair: a result dict per mode (see :func:`paired_runs`, plus the part rows)."""
    models, cfgs, num_shared = build_pair(paths, options)
    batch = make_batch(cfgs[0], options)
    timers = [PartTimer(torch.device(options.device)) for _ in models]
    part_rows = [instrument(model, timer) for model, timer in zip(models, timers)]
    points = [len(p) for p in batch['points']]
    frozen = f'; frozen (no training): {", ".join(options.freeze)}' if options.freeze else ''
    frozen += ''.join(f'; {key}={value}' for key, value in options.cfg_options.items())
    print(f'\n{shape}: A = {paths[0]}, B = {paths[1]}; B got {num_shared} of A\'s tensors{frozen}; inputs: '
          f'{options.batch_size} x ({points[0]} points, {options.boxes} boxes, 6 cameras '
          f'{"x".join(map(str, batch["img"].shape[-2:]))}); {cfgs[0].model.pts_bbox_head.num_query} queries',
          flush=True)
    results = []
    for mode in options.modes:
        runs = [make_run(model, cfg, mode, batch, timer, options.mixed_precision)
                for model, cfg, timer in zip(models, cfgs, timers)]
        result = dict(shape=shape, mode=mode, configs=list(paths), shared_tensors=num_shared,
                      frozen=list(options.freeze), cfg_options=dict(options.cfg_options), points_per_sample=points,
                      **paired_runs(runs, timers, options))
        extra = list(TRAIN_ROWS) if mode == 'train' else []
        rows = merge_rows(part_rows[0] + extra, part_rows[1] + extra)
        result['part_rows'] = [row for row in rows if any(row in side for side in result['parts_ms'])] + [TOTAL_ROW]
        for side, name in enumerate('AB'):
            result['parts_ms'][side][TOTAL_ROW] = statistics.mean(result['times_ms'][name])
        results.append(result)
        print(f'{shape} {mode}: A {result["median_ms"]["A"]:.1f} ms, B {result["median_ms"]["B"]:.1f} ms, '
              f'B/A {result["ratio"]["median"]:.3f}', flush=True)
    return results


def _set_up(options: ModelBenchmarkOptions) -> None:
    if options.threads:
        torch.set_num_threads(options.threads)
    logging.getLogger('mmcv').setLevel(logging.WARNING)  # init_weights lists every parameter at INFO


def _host_allocator(options: ModelBenchmarkOptions) -> str:
    """How the timing process allocates host memory, set up as ``options`` ask."""
    if not options.keep_freed_memory or options.device.startswith('cuda'):
        return 'host malloc as it comes'
    return 'freed host memory kept (glibc mallopt)' if keep_freed_memory() else 'host malloc as it comes (not glibc)'


def measure_memory(job: dict) -> Dict[str, List[float]]:
    """Mode -> [peak MiB of A, of B] of one run beyond the models and inputs (CPU; see the module doc).

    Args:
        job (dict): ``options`` (the fields of :class:`ModelBenchmarkOptions`),
            ``paths`` (configs A and B); JSON, as :func:`~.process_memory.memory_in_subprocess` passes it.
    """
    options = ModelBenchmarkOptions(**job['options'])
    _set_up(options)
    models, cfgs, _ = build_pair(tuple(job['paths']), options)
    batch = make_batch(cfgs[0], options)
    peaks = {}
    for mode in options.modes:
        peaks[mode] = []
        for model, cfg in zip(models, cfgs):
            run = make_run(model, cfg, mode, batch, PartTimer(torch.device('cpu')))
            run()
            gc.collect()
            peaks[mode].append(peak_rss_mib(run))
    return peaks


def run_model_benchmark(options: ModelBenchmarkOptions) -> dict:
    """Every shape and mode of ``options`` (resolved), printing a header and progress lines.

    Returns:
        dict: ``torch``, ``device``, ``threads``, ``settings`` (the options)
        and ``results``: per shape and mode, :func:`benchmark_shape`'s dict
        with ``peak_mib`` ``{'A': MiB, 'B': MiB}`` (None without memory).
    """
    options = options.resolved()
    _set_up(options)
    allocator = _host_allocator(options)
    device_name = torch.cuda.get_device_name() if options.device.startswith('cuda') else 'cpu'
    print(f'# benchmark_model: torch {torch.__version__}, device {device_name}, {torch.get_num_threads()} threads, '
          f'{options.pairs} pairs after {options.warmup} warm-up runs each, modes {options.modes}, {allocator}',
          flush=True)
    results = []
    for shape, paths in shape_configs(options).items():
        shape_results = benchmark_shape(shape, paths, options)
        gc.collect()  # the shape's models (reference cycles through the timers' wrappers) before the next ones
        if options.memory == 'auto' and not options.device.startswith('cuda'):
            peaks = memory_in_subprocess(measure_memory, dict(options=dataclasses.asdict(options), paths=list(paths)))
            for result in shape_results:
                result['peak_mib'] = dict(zip('AB', peaks[result['mode']]))
        results += shape_results
    return dict(torch=torch.__version__, device=device_name, threads=torch.get_num_threads(), allocator=allocator,
                settings=dataclasses.asdict(options), results=results)
