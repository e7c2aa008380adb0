"""Benchmark the bias-aware attention backends at CMT-AQR's real shapes.

Examples::

    # the table of docs/attention.md: CPU fp32, 900 queries x 56 400 keys x 8 heads, bs 1
    python tools/benchmark_attention.py --layouts vov --queries 900 --batch-sizes 1 --out bench.json
    # everything the issue lists (Q 900/1800, K 22 384/56 400, bs 1/2): long on CPU
    python tools/benchmark_attention.py
    # a small smoke run (seconds)
    python tools/benchmark_attention.py --quick
    # where backend='auto' switches from dense sdpa to segment (docs/attention.md, "auto by size")
    python tools/benchmark_attention.py --crossover

For every shape, bias (``global``: a :class:`SegmentBias` over the BEV and
camera keys; ``local``: a :class:`WindowBias` on the BEV and camera grids) and
pass (``fwd``, ``fwdbwd``), each backend runs ``--repeats`` times, each run
right after a run of bias-free SDPA (``F.scaled_dot_product_attention``
without a mask). The ratio is the median of these paired ratios, so that a
shared, unevenly loaded machine affects both sides of each ratio alike. The
table gives the median time, the ratio and the peak memory.

Peak memory: on CPU every (case, backend) runs in its own subprocess, with
glibc's mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_``) so that freed
buffers leave the resident set. After one warm-up call, the kernel's
resident-set high-water mark is reset (``/proc/self/clear_refs``) and the
reported number is ``VmHWM - VmRSS`` around one more call: the memory the call
needs beyond its inputs (outputs and gradients included). On CUDA it is
``torch.cuda.max_memory_allocated`` minus the memory allocated before the call.

``--crossover`` times ``segment``, ``sdpa`` (dense bias) and ``flashbias``
from the CPU self-check's 12 queries x 312 keys through the demo's decoder
(200 x 1 456 keys, 4 heads of 32) to R50's 900 x 22 384, each layout at its
model's heads, head dim and window (``LAYOUT_DIMS``), bs 2, repeating each
call within a timed sample (``--min-sample-ms``) so that sub-millisecond calls
rise above the clock's noise. Its table sorts the cases by the dense size
``bs * heads * Q * K``, bolds the fastest backend and gives the backend
``auto`` picks, with a line where that pick changes: the measurement behind
``DENSE_BIAS_MAX_ELEMENTS`` in ``attention/dispatch.py``.

Bias construction is timed too: building the structured biases, densifying
them (``to_dense``), and a faithful re-implementation of the seed design's
per-query Python loop that builds the local bias densely (timed on a few
queries and extrapolated, as labelled).
"""
import argparse
import gc
import json
import math
import os
import os.path as osp
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from projects.mmdet3d_plugin.attention import (AttentionBias, KeyGrid, SegmentBias,  # noqa: E402
                                               UnsupportedAttentionError, WindowBias, apply_attention,
                                               select_backend)
from projects.mmdet3d_plugin.attention import dispatch  # noqa: E402
from projects.mmdet3d_plugin.attention.backends.exact_rows import ExactRowBudget, recompute_rows  # noqa: E402

#: (BEV rows, BEV cols), (camera views, rows, cols) of each key layout
KEY_LAYOUTS = {
    'r50': ((128, 128), (6, 20, 50)),  # voxel 0.1, 800x320 images: K = 22 384
    'vov': ((180, 180), (6, 40, 100)),  # voxel 0.075, 1600x640 images: K = 56 400
    'demo': ((32, 32), (6, 6, 12)),  # configs/demo: pillars 0.4 m / 4, 192x96 images / 16: K = 1 456
    'quick': ((12, 16), (2, 6, 10)),  # tools/check_gpu.py --device cpu: K = 312
}
#: ``--crossover``: (heads, head dim, window size) of each layout's model, unless --heads, --head-dim or
#: --window-size say otherwise
LAYOUT_DIMS = {'r50': (8, 32, 15), 'vov': (8, 32, 15), 'demo': (4, 32, 5), 'quick': (2, 8, 5)}
#: the main table's defaults (--heads, --head-dim, --window-size)
DEFAULT_DIMS = (8, 32, 15)
CROSSOVER_BACKENDS = ['segment', 'sdpa', 'flashbias']
BASELINE = 'bias-free SDPA'
#: ``segment`` plus the work of its accelerator branch's exact recomputation at the initial budget
#: (``ExactRowBudget.initial_share`` of the queries per sample, every one replaced): what a GPU pays per call
#: until the budget has adapted (to 0 where no row needs it), timed and measured here on any device
SEGMENT_WITH_RECOMPUTE = 'segment+recompute'
DTYPES = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Benchmark the attention backends with AQR biases.')
    parser.add_argument('--layouts', nargs='+', choices=sorted(KEY_LAYOUTS), default=None,
                        help='key layouts: r50 = BEV 128x128 + 6x20x50 camera (K=22384), '
                        'vov = 180x180 + 6x40x100 (K=56400), demo = 32x32 + 6x6x12 (K=1456), '
                        'quick = 12x16 + 2x6x10 (K=312); default r50 vov (--crossover: quick demo r50)')
    parser.add_argument('--queries', nargs='+', type=int, default=None,
                        help='default 900 1800 (--crossover: 12 50 200 900)')
    parser.add_argument('--batch-sizes', nargs='+', type=int, default=None, help='default 1 2 (--crossover: 2)')
    parser.add_argument('--heads', type=int, default=None, help='default 8 (--crossover: per layout, LAYOUT_DIMS)')
    parser.add_argument('--head-dim', type=int, default=None, help='default 32 (--crossover: per layout)')
    parser.add_argument('--biases', nargs='+', choices=['global', 'local'], default=['global', 'local'])
    parser.add_argument('--passes', nargs='+', choices=['fwd', 'fwdbwd'], default=['fwd', 'fwdbwd'])
    parser.add_argument('--backends', nargs='+', default=None,
                        help='backends to time (default: segment, segment+recompute, flashbias, sdpa; cuda adds flex, '
                        'flash_attn); '
                        f'{SEGMENT_WITH_RECOMPUTE!r} adds the cost of segment\'s accelerator recomputation')
    parser.add_argument('--repeats', type=int, default=5, help='timed runs per backend (median reported)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', choices=sorted(DTYPES), default=None,
                        help='default float32 on CPU, float16 on CUDA')
    parser.add_argument('--window-size', type=int, default=None, help='default 15 (--crossover: per layout)')
    parser.add_argument('--memory', choices=['auto', 'rss', 'cuda', 'none'], default='auto',
                        help='peak memory: rss (CPU, a subprocess per case), cuda, none; auto picks by device')
    parser.add_argument('--seed-loop-queries', type=int, default=4,
                        help='queries on which the seed per-query loop is timed before extrapolating')
    parser.add_argument('--no-construction', action='store_true', help='skip the bias construction timings')
    parser.add_argument('--quick', action='store_true',
                        help='tiny shapes, every backend, 3 repeats, no memory: a smoke test in seconds')
    parser.add_argument('--crossover', action='store_true',
                        help="where backend='auto' switches from a dense exact path to segment: segment, sdpa "
                        '(dense bias) and flashbias against bias-free SDPA from tiny decoders to R50, by '
                        'dense size bs*heads*Q*K, with the pick of auto (no memory, no construction)')
    parser.add_argument('--min-sample-ms', type=float, default=None,
                        help='repeat each call in a timed sample until it lasts about this long (default 0: one '
                        'call; --crossover: 20), so that sub-millisecond calls are timed above the clock noise')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--out', default=None, help='write the results as JSON here')
    parser.add_argument('--memory-worker', default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.layouts, args.queries, args.batch_sizes, args.repeats = ['quick'], [32], [1], 3
        args.backends = args.backends or ['segment', 'flashbias', 'flex', 'sdpa', 'math', 'flash_attn']
        args.memory = 'none' if args.memory == 'auto' else args.memory
    if args.crossover:
        args.layouts = args.layouts or ['quick', 'demo', 'r50']
        args.queries = args.queries or [12, 50, 200, 900]
        args.batch_sizes = args.batch_sizes or [2]
        args.backends = args.backends or list(CROSSOVER_BACKENDS)
        args.memory, args.no_construction = 'none', True
        args.min_sample_ms = 20.0 if args.min_sample_ms is None else args.min_sample_ms
    args.layouts = args.layouts or ['r50', 'vov']
    args.queries = args.queries or [900, 1800]
    args.batch_sizes = args.batch_sizes or [1, 2]
    args.min_sample_ms = args.min_sample_ms or 0.0
    if args.backends is None:
        args.backends = (['segment', SEGMENT_WITH_RECOMPUTE, 'flashbias', 'sdpa']
                         + (['flex', 'flash_attn'] if args.device == 'cuda' else []))
    if args.dtype is None:
        args.dtype = 'float16' if args.device == 'cuda' else 'float32'
    if args.memory == 'auto':
        args.memory = 'cuda' if args.device == 'cuda' else 'rss'
    return args


def _num_keys(layout: str) -> int:
    (bev_h, bev_w), (views, cam_h, cam_w) = KEY_LAYOUTS[layout]
    return bev_h * bev_w + views * cam_h * cam_w


def build_bias_factors(case: dict, generator: torch.Generator) -> dict:
    """Random AQR-like bias factors: weights in [0, 1] mapped to ``(w - 0.5) * 2``, projections, visibility."""
    (bev_h, bev_w), (views, cam_h, cam_w) = KEY_LAYOUTS[case['layout']]
    bs, num_queries = case['batch'], case['queries']
    lidar_bias, camera_bias = ((torch.rand(2, bs, num_queries, generator=generator) - 0.5) * 2).unbind(0)

    def cells(*sizes):
        return torch.stack([torch.randint(0, s, (bs, num_queries), generator=generator) for s in sizes], -1)

    return dict(
        lidar_bias=lidar_bias, camera_bias=camera_bias,
        bev_centres=torch.cat([torch.zeros(bs, num_queries, 1, dtype=torch.long), cells(bev_h, bev_w)], -1),
        camera_centres=cells(views, cam_h, cam_w),
        visible=torch.rand(bs, num_queries, generator=generator) > 0.1)


def make_bias(case: dict, factors: dict, device, requires_grad: bool) -> AttentionBias:
    """The structured global or local AQR bias of a case."""
    (bev_h, bev_w), (views, cam_h, cam_w) = KEY_LAYOUTS[case['layout']]
    num_bev = bev_h * bev_w
    if case['bias'] == 'global':
        values = torch.stack([factors['lidar_bias'], factors['camera_bias']], -1)[:, None].to(device)
        return AttentionBias(SegmentBias(values.requires_grad_(requires_grad), (num_bev, views * cam_h * cam_w)),
                             _num_keys(case['layout']))
    bs, num_queries = factors['visible'].shape
    grids = [KeyGrid(0, 1, bev_h, bev_w), KeyGrid(num_bev, views, cam_h, cam_w)]
    amplitudes = [factors[name][:, None].to(device).requires_grad_(requires_grad)
                  for name in ('lidar_bias', 'camera_bias')]
    valid = [torch.ones(bs, num_queries, dtype=torch.bool, device=device), factors['visible'].to(device)]
    return AttentionBias(WindowBias(grids, [factors['bev_centres'].to(device), factors['camera_centres'].to(device)],
                                    valid, amplitudes, case['window_size']), _num_keys(case['layout']))


def build_inputs(case: dict) -> dict:
    """q, k, v, the bias and the tensors gradients are taken for."""
    generator = torch.Generator().manual_seed(case['seed'])
    device, dtype = torch.device(case['device']), DTYPES[case['dtype']]
    needs_grad = case['pass'] == 'fwdbwd'
    bs, heads, dim = case['batch'], case['heads'], case['head_dim']
    q, k, v = (torch.randn(bs, heads, n, dim, generator=generator).to(device, dtype).requires_grad_(needs_grad)
               for n in (case['queries'], _num_keys(case['layout']), _num_keys(case['layout'])))
    bias = make_bias(case, build_bias_factors(case, generator), device, needs_grad)
    leaves = [q, k, v]
    if case['backend'] != BASELINE:
        leaves += [t for part in bias.parts for t in part.tensors() if t.requires_grad]
    grad_out = torch.randn(q.shape, generator=generator).to(device, dtype)
    return dict(q=q, k=k, v=v, bias=bias, leaves=leaves, grad_out=grad_out)


def run_case(case: dict, inputs: dict) -> None:
    """One forward (and backward) call."""
    if case['backend'] == BASELINE:
        out = F.scaled_dot_product_attention(inputs['q'], inputs['k'], inputs['v'])
    elif case['backend'] == SEGMENT_WITH_RECOMPUTE:
        out = apply_attention(inputs['q'], inputs['k'], inputs['v'], inputs['bias'], backend='segment')
        bs, num_queries = out.size(0), out.size(2)
        budget = math.ceil(num_queries * ExactRowBudget().initial_share)
        call = dispatch._make_call(inputs['q'], inputs['k'], inputs['v'], inputs['bias'], None, 0.0, None)
        out, _ = recompute_rows(call, out, torch.zeros(bs, num_queries, device=out.device), 1.0, budget)
    else:
        out = apply_attention(inputs['q'], inputs['k'], inputs['v'], inputs['bias'], backend=case['backend'])
    if case['pass'] == 'fwdbwd':
        torch.autograd.grad(out, inputs['leaves'], inputs['grad_out'])
    if case['device'].startswith('cuda'):
        torch.cuda.synchronize()


def _read_status_kb(field: str) -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    raise RuntimeError(f'{field} not in /proc/self/status')


def measure_peak_memory(case: dict) -> Optional[float]:
    """Peak memory (MiB) one call needs beyond its inputs, measured in this process (see the module doc)."""
    inputs = build_inputs(case)
    run_case(case, inputs)
    gc.collect()
    if case['device'].startswith('cuda'):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run_case(case, inputs)
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')
    before = _read_status_kb('VmRSS')
    run_case(case, inputs)
    return (_read_status_kb('VmHWM') - before) / 1024


def memory_in_subprocess(case: dict) -> Optional[float]:
    """Run :func:`measure_peak_memory` in a fresh interpreter (None if it failed)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_='131072')
    proc = subprocess.run([sys.executable, osp.abspath(__file__), '--memory-worker', json.dumps(case)],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    if proc.returncode != 0:
        print(f'memory measurement failed for {case}: {proc.stderr[-2000:]}', file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])['peak_mib']


def _timed(fn: Callable[[], None], number: int = 1) -> float:
    """Seconds per call of ``fn``, called ``number`` times in a row."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def benchmark_group(args: argparse.Namespace, group: dict) -> List[dict]:
    """Time every backend on one (shape, bias, pass), each run paired with a bias-free SDPA run."""
    names = [BASELINE] + [b for b in args.backends if b != BASELINE]
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
    if args.min_sample_ms > 0:  # calls per timed sample: a sample of the baseline lasts about min_sample_ms
        once = statistics.median(_timed(lambda: run_case(base_case, base_inputs)) for _ in range(3))
        number = max(1, math.ceil(args.min_sample_ms * 1e-3 / once))
    for _ in range(args.repeats):
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
        if args.memory == 'rss':
            record['peak_mib'] = memory_in_subprocess(dict(group, backend=name))
        elif args.memory == 'cuda':
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


def benchmark_construction(args: argparse.Namespace, layout: str, num_queries: int) -> List[dict]:
    """Time building the biases: structured, densified, and the seed's per-query loop (extrapolated)."""
    window_size = layout_dims(args, layout)['window_size']
    base = dict(layout=layout, keys=_num_keys(layout), queries=num_queries, batch=args.batch_sizes[0],
                window_size=window_size, seed=args.seed, device='cpu')
    records = []
    for bias_kind in args.biases:
        case = dict(base, bias=bias_kind)
        factors = build_bias_factors(case, torch.Generator().manual_seed(args.seed))
        bias = make_bias(case, factors, 'cpu', False)
        build = _median_time(lambda: make_bias(case, factors, 'cpu', False), 200)
        records.append(dict(case, method='structured AttentionBias', seconds=build, note='median of 200'))
        records.append(dict(case, method='dense to_dense() (vectorised)', seconds=_median_time(bias.to_dense, 3),
                            note='median of 3'))
    if 'local' in args.biases:
        case = dict(base, bias='local')
        factors = build_bias_factors(case, torch.Generator().manual_seed(args.seed))
        (bev_h, bev_w), pers_shape = KEY_LAYOUTS[layout]
        pts_idx = factors['bev_centres'][..., 1] * bev_w + factors['bev_centres'][..., 2]
        lidar_w, camera_w = factors['lidar_bias'] / 2 + 0.5, factors['camera_bias'] / 2 + 0.5
        subset = min(args.seed_loop_queries, num_queries)
        seconds = _timed(lambda: seed_local_bias_loop(lidar_w, camera_w, pts_idx, factors['camera_centres'],
                                                       (bev_h, bev_w), pers_shape, window_size, 1.0, subset))
        records.append(dict(case, method='seed per-query Python loop (dense)', seconds=seconds * num_queries / subset,
                            note=f'extrapolated from {subset} of {num_queries} queries x bs {case["batch"]}'))
    return records


def _format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f'{seconds:.2f} s'
    if seconds >= 1e-3:
        return f'{seconds * 1e3:.1f} ms'
    return f'{seconds * 1e6:.0f} us'


def markdown_tables(attention: List[dict], construction: List[dict]) -> str:
    lines = ['| keys (layout) | Q | bs | bias | pass | backend | median | x bias-free SDPA | peak memory |',
             '|---|---|---|---|---|---|---|---|---|']
    for r in attention:
        shape = f'{_num_keys(r["layout"])} ({r["layout"]}) | {r["queries"]} | {r["batch"]} | {r["bias"]} | {r["pass"]}'
        if r['status'] != 'ok':
            lines.append(f'| {shape} | {r["backend"]} | n/a: {r["reason"]} | | |')
            continue
        memory = f'{r["peak_mib"]:.0f} MiB' if r.get('peak_mib') is not None else '-'
        lines.append(f'| {shape} | {r["backend"]} | {_format_seconds(r["median_s"])} | {r["ratio"]:.2f} | {memory} |')
    if construction:
        lines += ['', '| keys (layout) | Q | bs | bias | method | time | note |', '|---|---|---|---|---|---|---|']
        for r in construction:
            lines.append(f'| {r["keys"]} ({r["layout"]}) | {r["queries"]} | {r["batch"]} | {r["bias"]} | '
                         f'{r["method"]} | {_format_seconds(r["seconds"])} | {r["note"]} |')
    return '\n'.join(lines)


def layout_dims(args: argparse.Namespace, layout: str) -> dict:
    """Heads, head dim and window size of a layout's cases: the options where given, else (``--crossover``)
    the layout's model (``LAYOUT_DIMS``) or ``DEFAULT_DIMS``."""
    defaults = LAYOUT_DIMS[layout] if args.crossover else DEFAULT_DIMS
    given = (args.heads, args.head_dim, args.window_size)
    heads, head_dim, window_size = (d if g is None else g for g, d in zip(given, defaults))
    return dict(heads=heads, head_dim=head_dim, window_size=window_size)


def auto_pick(group: dict) -> List[str]:
    """``[backend, reason]``: what ``backend='auto'`` runs for a case (with gradients for ``fwdbwd``)."""
    inputs = build_inputs(dict(group, backend='auto'))
    return list(select_backend(inputs['q'], inputs['bias'], k=inputs['k'], v=inputs['v']))


def auto_choices(args: argparse.Namespace) -> Dict[str, List[str]]:
    """What ``backend='auto'`` picks for each bias of the first layout, first query count, bs 1, fwd+bwd."""
    return {bias_kind: auto_pick(dict(layout=args.layouts[0], queries=args.queries[0], batch=1,
                                      **layout_dims(args, args.layouts[0]), bias=bias_kind, seed=args.seed,
                                      device=args.device, dtype=args.dtype, **{'pass': 'fwdbwd'}))
            for bias_kind in args.biases}


def crossover_row(group: dict, records: List[dict]) -> dict:
    """One row of the ``--crossover`` table: the case, its dense size ``bs * heads * Q * K``, each backend's
    ratio against bias-free SDPA (None where it cannot run) and the pick of ``auto``."""
    ratios = {r['backend']: (r['ratio'] if r['status'] == 'ok' else None) for r in records
              if r['backend'] != BASELINE}
    auto, reason = auto_pick(group)
    return dict(group, keys=_num_keys(group['layout']), ratios=ratios, auto=auto, reason=reason,
                elements=group['batch'] * group['heads'] * group['queries'] * _num_keys(group['layout']))


def crossover_table(rows: List[dict]) -> str:
    """Markdown: per bias and pass, the cases by dense size, the backends' ratios (fastest in bold) and the pick
    of ``auto``; a line marks where ``auto``'s pick changes."""
    backends = list(dict.fromkeys(name for r in rows for name in r['ratios']))
    device = rows[0]['device'] if rows else 'cpu'
    name, thresholds = dispatch.size_rule(device.split(':')[0])
    if thresholds:
        limits = ', '.join(f'{kind} {pass_name} ≤ {limit:,}' for (kind, pass_name), limit in thresholds.items())
        rule = f'`auto` on {device}: dense sdpa while bs·heads·Q·K is at most {name} ({limits})'
    else:
        rule = f'`auto` on {device}: no size rule (segment first at every size)'
    lines = [rule, '', '| bias | pass | keys (layout) | Q | bs×heads×d | bs·heads·Q·K | '
             + ' | '.join(f'{name} ×' for name in backends) + ' | auto |',
             '|---|---|---|---|---|---:|' + '---:|' * len(backends) + '---|']
    order = {name: i for i, name in enumerate(('global', 'local', 'fwd', 'fwdbwd'))}
    rows = sorted(rows, key=lambda r: (order.get(r['bias'], 9), order.get(r['pass'], 9), r['elements']))
    for i, r in enumerate(rows):
        previous = rows[i - 1] if i else None
        if previous is not None and (previous['bias'], previous['pass']) == (r['bias'], r['pass']) \
                and previous['auto'] != r['auto']:
            lines.append(f'| | | **auto switches {previous["auto"]} → {r["auto"]}** |' + ' |' * (4 + len(backends)))
        known = [v for v in r['ratios'].values() if v is not None]
        cells = ['n/a' if v is None else (f'**{v:.2f}**' if v == min(known) else f'{v:.2f}')
                 for v in (r['ratios'].get(name) for name in backends)]
        lines.append(f'| {r["bias"]} | {r["pass"]} | {r["keys"]} ({r["layout"]}) | {r["queries"]} | '
                     f'{r["batch"]}×{r["heads"]}×{r["head_dim"]} | {r["elements"]:,} | ' + ' | '.join(cells)
                     + f' | {r["auto"]} |')
    return '\n'.join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.memory_worker is not None:
        print(json.dumps(dict(peak_mib=measure_peak_memory(json.loads(args.memory_worker)))))
        return {}
    command = ['tools/benchmark_attention.py'] + list(sys.argv[1:] if argv is None else argv)
    meta = dict(torch=torch.__version__, device=args.device, dtype=args.dtype, threads=torch.get_num_threads(),
                memory=args.memory, repeats=args.repeats, command=' '.join(command))
    if args.device == 'cuda':
        meta['gpu'] = torch.cuda.get_device_name()
    print(f'# attention benchmark: {meta}', flush=True)
    attention, crossover = [], []
    for layout in args.layouts:
        for num_queries in args.queries:
            for batch in args.batch_sizes:
                for bias_kind in args.biases:
                    for pass_name in args.passes:
                        group = dict(layout=layout, queries=num_queries, batch=batch, **layout_dims(args, layout),
                                     bias=bias_kind, seed=args.seed, device=args.device, dtype=args.dtype,
                                     **{'pass': pass_name})
                        records = benchmark_group(args, group)
                        attention += records
                        if args.crossover:
                            crossover.append(crossover_row(group, records))
                        ratios = ', '.join(f'{r["backend"]} {r["ratio"]:.2f}x' for r in records if r['status'] == 'ok')
                        print(f'{layout} Q={num_queries} bs={batch} {bias_kind} {pass_name}: {ratios}', flush=True)
    construction = []
    if not args.no_construction:
        for layout in args.layouts:
            for num_queries in args.queries:
                construction += benchmark_construction(args, layout, num_queries)
    result = dict(meta=meta, auto=auto_choices(args), attention=attention, construction=construction)
    print()
    if args.crossover:
        result['crossover'] = crossover
        print(crossover_table(crossover))
    else:
        print(markdown_tables(attention, construction))
    print()
    for bias_kind, (name, reason) in result['auto'].items():
        print(f'auto picks {name!r} for the {bias_kind} bias: {reason}')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == '__main__':
    main()
