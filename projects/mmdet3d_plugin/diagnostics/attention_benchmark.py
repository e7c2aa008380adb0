"""Benchmark of the bias-aware attention backends at CMT-AQR's real shapes (``tools/benchmark_attention.py``).

For every shape, bias (``global`` / ``local``, :mod:`.attention_cases`) and
pass (``fwd``, ``fwdbwd``), each backend runs ``repeats`` times, each run
right after a run of bias-free SDPA (``F.scaled_dot_product_attention``
without a mask). The ratio is the median of these paired ratios, so that a
shared, unevenly loaded machine affects both sides of each ratio alike. Each
record holds the median time, the ratio and the peak memory
(:func:`~.attention_cases.measure_peak_memory`: on the CPU in a subprocess per
case and backend, :mod:`.process_memory`; on CUDA the allocator's peak).

``crossover`` times ``segment``, ``sdpa`` (dense bias) and ``flashbias`` from
tiny decoders to R50, each layout at its model's heads, head dim and window
(:data:`LAYOUT_DIMS`), repeating each call within a timed sample
(``min_sample_ms``) so that sub-millisecond calls rise above the clock's
noise; each row also gives the backend ``auto`` picks: the measurement behind
``DENSE_BIAS_MAX_ELEMENTS`` in ``attention/dispatch.py``.

Bias construction is timed too: building the structured biases, densifying
them (``to_dense``), and a faithful re-implementation of the seed design's
per-query Python loop that builds the local bias densely (timed on a few
queries and extrapolated, as labelled).
"""
import dataclasses
import gc
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

from ..attention import UnsupportedAttentionError, select_backend
from ..attention.slots.window_slots import default_formulation
from .attention_cases import (BASELINE, KEY_LAYOUTS, SEGMENT_WITH_RECOMPUTE, build_bias_factors, build_inputs,
                              make_bias, measure_peak_memory, num_keys, run_case)
from .process_memory import memory_in_subprocess

#: ``crossover``: (heads, head dim, window size) of each layout's model, unless ``heads``, ``head_dim`` or
#: ``window_size`` say otherwise
LAYOUT_DIMS = {'r50': (8, 32, 15), 'vov': (8, 32, 15), 'demo': (4, 32, 5), 'quick': (2, 8, 5)}
#: the main table's (heads, head dim, window size)
DEFAULT_DIMS = (8, 32, 15)
CROSSOVER_BACKENDS = ['segment', 'sdpa', 'flashbias']


@dataclass
class BenchmarkOptions:
    """What to time (``tools/benchmark_attention.py``'s options); None: the default of the mode, see
    :meth:`resolved`.

    Attributes:
        layouts (list[str], optional): keys of ``KEY_LAYOUTS`` (default r50 vov; crossover: quick demo r50).
        queries (list[int], optional): default 900 1800 (crossover: 12 50 200 900).
        batch_sizes (list[int], optional): default 1 2 (crossover: 2).
        heads, head_dim, window_size (int, optional): default :data:`DEFAULT_DIMS` (crossover: per layout).
        biases (list[str]): ``global`` and/or ``local``.
        passes (list[str]): ``fwd`` and/or ``fwdbwd``.
        backends (list[str], optional): default segment, segment+recompute,
            flashbias, sdpa (CUDA adds tiled_bias, flex, flash_attn).
        repeats (int): timed runs per backend (the median is reported).
        device (str): ``cpu`` or ``cuda``.
        dtype (str, optional): default float32 on the CPU, float16 on CUDA.
        memory (str): ``rss`` (CPU, a subprocess per case), ``cuda``, ``none``; ``auto`` picks by device.
        seed_loop_queries (int): queries the seed per-query loop is timed on before extrapolating.
        no_construction (bool): skip the bias construction timings.
        quick (bool): tiny shapes, every backend, 3 repeats, no memory: a smoke test in seconds.
        crossover (bool): where ``auto`` switches from a dense exact path to segment (no memory, no construction).
        min_sample_ms (float, optional): repeat each call in a timed sample until it lasts about this long
            (default 0: one call; crossover: 20).
        seed (int): the random inputs.
    """

    layouts: Optional[List[str]] = None
    queries: Optional[List[int]] = None
    batch_sizes: Optional[List[int]] = None
    heads: Optional[int] = None
    head_dim: Optional[int] = None
    window_size: Optional[int] = None
    biases: List[str] = field(default_factory=lambda: ['global', 'local'])
    passes: List[str] = field(default_factory=lambda: ['fwd', 'fwdbwd'])
    backends: Optional[List[str]] = None
    repeats: int = 5
    device: str = 'cpu'
    dtype: Optional[str] = None
    memory: str = 'auto'
    seed_loop_queries: int = 4
    no_construction: bool = False
    quick: bool = False
    crossover: bool = False
    min_sample_ms: Optional[float] = None
    seed: int = 0

    def resolved(self) -> 'BenchmarkOptions':
        """A copy with every None filled in by the mode's (``quick``, ``crossover``) and the device's defaults."""
        o = dataclasses.replace(self)
        if o.quick:
            o.layouts, o.queries, o.batch_sizes, o.repeats = ['quick'], [32], [1], 3
            o.backends = o.backends or ['segment', 'flashbias', 'flex', 'sdpa', 'math', 'flash_attn', 'tiled_bias']
            o.memory = 'none' if o.memory == 'auto' else o.memory
        if o.crossover:
            o.layouts = o.layouts or ['quick', 'demo', 'r50']
            o.queries = o.queries or [12, 50, 200, 900]
            o.batch_sizes = o.batch_sizes or [2]
            o.backends = o.backends or list(CROSSOVER_BACKENDS)
            o.memory, o.no_construction = 'none', True
            o.min_sample_ms = 20.0 if o.min_sample_ms is None else o.min_sample_ms
        o.layouts = o.layouts or ['r50', 'vov']
        o.queries = o.queries or [900, 1800]
        o.batch_sizes = o.batch_sizes or [1, 2]
        o.min_sample_ms = o.min_sample_ms or 0.0
        if o.backends is None:
            o.backends = (['segment', SEGMENT_WITH_RECOMPUTE, 'flashbias', 'sdpa']
                          + (['tiled_bias', 'flex', 'flash_attn'] if o.device == 'cuda' else []))
        if o.dtype is None:
            o.dtype = 'float16' if o.device == 'cuda' else 'float32'
        if o.memory == 'auto':
            o.memory = 'cuda' if o.device == 'cuda' else 'rss'
        return o


def layout_dims(options: BenchmarkOptions, layout: str) -> dict:
    """Heads, head dim and window size of a layout's cases: the options where given, else (``crossover``) the
    layout's model (:data:`LAYOUT_DIMS`) or :data:`DEFAULT_DIMS`."""
    defaults = LAYOUT_DIMS[layout] if options.crossover else DEFAULT_DIMS
    given = (options.heads, options.head_dim, options.window_size)
    heads, head_dim, window_size = (d if g is None else g for g, d in zip(given, defaults))
    return dict(heads=heads, head_dim=head_dim, window_size=window_size)


def _timed(fn: Callable[[], None], number: int = 1) -> float:
    """Seconds per call of ``fn``, called ``number`` times in a row."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _subprocess_peak(case: dict) -> Optional[float]:
    """:func:`measure_peak_memory` in a fresh interpreter; None (and a line on stderr) if it failed."""
    try:
        return memory_in_subprocess(measure_peak_memory, case)
    except RuntimeError as error:
        print(f'memory measurement failed for {case}: {error}', file=sys.stderr)
        return None


def benchmark_group(options: BenchmarkOptions, group: dict) -> List[dict]:
    """Time every backend on one (shape, bias, pass), each run paired with a bias-free SDPA run.

    Returns:
        list[dict]: per backend (the baseline first) the case with ``status``
        (``ok`` or ``n/a`` and the ``reason``), ``times``, ``median_s``,
        ``ratio`` (median of the paired ratios), ``calls_per_sample`` and
        ``peak_mib`` (with memory).
    """
    names = [BASELINE] + [b for b in options.backends if b != BASELINE]
    records, runnable = {}, {}
    for name in names:
        case = dict(group, backend=name)
        inputs = build_inputs(case)
        try:
            run_case(case, inputs)
        except UnsupportedAttentionError as error:
            records[name] = dict(case, status='n/a', reason='; '.join(error.reasons))
            continue
        runnable[name] = (case, inputs)
        records[name] = dict(case, status='ok', times=[])
    base_case, base_inputs = runnable.pop(BASELINE)
    number = 1
    if options.min_sample_ms > 0:  # calls per timed sample: a sample of the baseline lasts about min_sample_ms
        once = statistics.median(_timed(lambda: run_case(base_case, base_inputs)) for _ in range(3))
        number = max(1, math.ceil(options.min_sample_ms * 1e-3 / once))
    for _ in range(options.repeats):
        for name, (case, inputs) in runnable.items() or [(BASELINE, (base_case, base_inputs))]:
            base_time = _timed(lambda: run_case(base_case, base_inputs), number)
            records[BASELINE]['times'].append(base_time)
            if name != BASELINE:
                records[name]['times'].append(_timed(lambda: run_case(case, inputs), number))
                records[name].setdefault('ratios', []).append(records[name]['times'][-1] / base_time)
    runnable.clear()
    gc.collect()
    for name, record in records.items():
        if record['status'] != 'ok':
            continue
        record['median_s'] = statistics.median(record['times'])
        record['calls_per_sample'] = number
        record['ratio'] = statistics.median(record['ratios']) if name != BASELINE else 1.0
        if options.memory == 'rss':
            record['peak_mib'] = _subprocess_peak(dict(group, backend=name))
        elif options.memory == 'cuda':
            record['peak_mib'] = measure_peak_memory(dict(group, backend=name))
    return [records[name] for name in names]


def _seed_window_loop(attention_bias, b, q, weight, y, x, height, width, key_offset, window_size, bias_strength):
    """The seed's inner loops: one query's window on one grid, cell by cell."""
    y_min = max(0, y - window_size // 2)
    y_max = min(height, y + window_size // 2 + 1)
    x_min = max(0, x - window_size // 2)
    x_max = min(width, x + window_size // 2 + 1)
    for yi in range(y_min, y_max):
        for xi in range(x_min, x_max):
            feat_idx = key_offset + yi * width + xi
            dist = ((yi - y)**2 + (xi - x)**2)**0.5
            decay = max(0, 1 - dist / (window_size / 2))
            attention_bias[b, q, feat_idx] = (weight - 0.5) * 2 * bias_strength * decay


def seed_local_bias_loop(lidar_weights, camera_weights, pts_idx, pts_pers_idx, bev_shape, pers_shape, window_size,
                         bias_strength, num_queries):
    """The seed design's local bias, re-implemented faithfully: a Python loop over queries and window cells.

    Fills a dense ``[bs, Q, K]`` tensor element by element (tensor indexing
    and arithmetic per cell, as the seed does), for the first ``num_queries``
    queries. The seed wrote the BEV loop and said the camera part is
    "similar"; it is written the same way here, in the query's view.
    """
    bs = lidar_weights.shape[0]
    num_bev = bev_shape[0] * bev_shape[1]
    attention_bias = torch.zeros(bs, lidar_weights.shape[1], num_bev + pers_shape[0] * pers_shape[1] * pers_shape[2])
    for b in range(bs):
        for q in range(num_queries):
            center_idx = pts_idx[b, q]
            _seed_window_loop(attention_bias, b, q, lidar_weights[b, q], center_idx // bev_shape[1],
                              center_idx % bev_shape[1], bev_shape[0], bev_shape[1], 0, window_size, bias_strength)
            view, y, x = pts_pers_idx[b, q]
            _seed_window_loop(attention_bias, b, q, camera_weights[b, q], y, x, pers_shape[1], pers_shape[2],
                              num_bev + view * pers_shape[1] * pers_shape[2], window_size, bias_strength)
    return attention_bias


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()
    return statistics.median(_timed(fn) for _ in range(repeats))


def benchmark_construction(options: BenchmarkOptions, layout: str, num_queries: int) -> List[dict]:
    """Time building the biases: structured, densified, and the seed's per-query loop (extrapolated)."""
    window_size = layout_dims(options, layout)['window_size']
    base = dict(layout=layout, keys=num_keys(layout), queries=num_queries, batch=options.batch_sizes[0],
                window_size=window_size, seed=options.seed, device='cpu')
    records = []
    for bias_kind in options.biases:
        case = dict(base, bias=bias_kind)
        factors = build_bias_factors(case, torch.Generator().manual_seed(options.seed))
        bias = make_bias(case, factors, 'cpu', False)
        build = _median_time(lambda: make_bias(case, factors, 'cpu', False), 200)
        records.append(dict(case, method='structured AttentionBias', seconds=build, note='median of 200'))
        records.append(dict(case, method='dense to_dense() (vectorised)', seconds=_median_time(bias.to_dense, 3),
                            note='median of 3'))
    if 'local' in options.biases:
        case = dict(base, bias='local')
        factors = build_bias_factors(case, torch.Generator().manual_seed(options.seed))
        (bev_h, bev_w), pers_shape = KEY_LAYOUTS[layout]
        pts_idx = factors['bev_centres'][..., 1] * bev_w + factors['bev_centres'][..., 2]
        lidar_w, camera_w = factors['lidar_bias'] / 2 + 0.5, factors['camera_bias'] / 2 + 0.5
        subset = min(options.seed_loop_queries, num_queries)
        seconds = _timed(lambda: seed_local_bias_loop(lidar_w, camera_w, pts_idx, factors['camera_centres'],
                                                       (bev_h, bev_w), pers_shape, window_size, 1.0, subset))
        records.append(dict(case, method='seed per-query Python loop (dense)', seconds=seconds * num_queries / subset,
                            note=f'extrapolated from {subset} of {num_queries} queries x bs {case["batch"]}'))
    return records


def auto_pick(group: dict) -> List[str]:
    """``[backend, reason]``: what ``backend='auto'`` runs for a case (with gradients for ``fwdbwd``)."""
    inputs = build_inputs(dict(group, backend='auto'))
    return list(select_backend(inputs['q'], inputs['bias'], k=inputs['k'], v=inputs['v']))


def auto_choices(options: BenchmarkOptions) -> Dict[str, List[str]]:
    """What ``backend='auto'`` picks for each bias of the first layout, first query count, bs 1, fwd+bwd."""
    return {bias_kind: auto_pick(dict(layout=options.layouts[0], queries=options.queries[0], batch=1,
                                      **layout_dims(options, options.layouts[0]), bias=bias_kind, seed=options.seed,
                                      device=options.device, dtype=options.dtype, **{'pass': 'fwdbwd'}))
            for bias_kind in options.biases}


def crossover_row(group: dict, records: List[dict]) -> dict:
    """One row of the crossover table: the case, its dense size ``bs * heads * Q * K``, each backend's ratio
    against bias-free SDPA (None where it cannot run) and the pick of ``auto``."""
    ratios = {r['backend']: (r['ratio'] if r['status'] == 'ok' else None) for r in records
              if r['backend'] != BASELINE}
    auto, reason = auto_pick(group)
    return dict(group, keys=num_keys(group['layout']), ratios=ratios, auto=auto, reason=reason,
                elements=group['batch'] * group['heads'] * group['queries'] * num_keys(group['layout']))


def run_attention_benchmark(options: BenchmarkOptions, command: str = '') -> dict:
    """Every case of ``options`` (resolved), printing a header and a line per case as it goes.

    Returns:
        dict: ``meta`` (torch, device, dtype, threads, memory, repeats,
        command, the window slot formulation, gpu), ``auto`` (:func:`auto_choices`), ``attention``
        (:func:`benchmark_group` records), ``construction``
        (:func:`benchmark_construction` records) and, with ``crossover``,
        ``crossover`` (:func:`crossover_row` rows).
    """
    options = options.resolved()
    meta = dict(torch=torch.__version__, device=options.device, dtype=options.dtype, threads=torch.get_num_threads(),
                memory=options.memory, repeats=options.repeats, command=command,
                slot_formulation=default_formulation(options.device))
    if options.device == 'cuda':
        meta['gpu'] = torch.cuda.get_device_name()
    print(f'# attention benchmark: {meta}', flush=True)
    attention, crossover = [], []
    for layout in options.layouts:
        for num_queries in options.queries:
            for batch in options.batch_sizes:
                for bias_kind in options.biases:
                    for pass_name in options.passes:
                        group = dict(layout=layout, queries=num_queries, batch=batch, **layout_dims(options, layout),
                                     bias=bias_kind, seed=options.seed, device=options.device, dtype=options.dtype,
                                     **{'pass': pass_name})
                        records = benchmark_group(options, group)
                        attention += records
                        if options.crossover:
                            crossover.append(crossover_row(group, records))
                        ratios = ', '.join(f'{r["backend"]} {r["ratio"]:.2f}x' for r in records if r['status'] == 'ok')
                        print(f'{layout} Q={num_queries} bs={batch} {bias_kind} {pass_name}: {ratios}', flush=True)
    construction = []
    if not options.no_construction:
        for layout in options.layouts:
            for num_queries in options.queries:
                construction += benchmark_construction(options, layout, num_queries)
    result = dict(meta=meta, auto=auto_choices(options), attention=attention, construction=construction)
    if options.crossover:
        result['crossover'] = crossover
    return result
