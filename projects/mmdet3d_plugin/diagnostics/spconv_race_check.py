"""Reproduce (or rule out) the spconv CPU sparse-convolution race: every conv vs a dense ``F.conv3d``
(``tools/check_spconv_race.py``).

For each config's ``pts_middle_encoder`` (mmdet3d's ``SparseEncoder``; its
BEV grid is cropped to ``grid`` cells so the dense reference volume fits in
memory, depth and layers unchanged) the encoder runs ``runs`` times on one
fixed random input of ``sites`` active voxels, and the output of every
``SubMConv3d`` / ``SparseConv3d`` is compared at its active sites with a dense
``F.conv3d`` of the layer's own captured input
(``mmcv_custom/sparse_conv_check.py``). ``load`` busy-loop processes run
meanwhile (the race only shows under CPU contention). Each thread count runs
in its own process with ``OMP_NUM_THREADS`` set (and ``torch.set_num_threads``:
spconv's kernels run on torch's OpenMP runtime); each result records the
thread count that runtime reports for spconv's kernels (``omp_threads``).
Scatter ``builtin`` runs spconv's own CPU sparse convolutions (its compiled,
racy scatter-add), ``patched`` the plugin's race-free replacement
(``mmcv_custom/spconv_cpu_scatter.py``).

:func:`format_table` prints a row per config, thread count and scatter: runs
with any wrong layer, wrong layer outputs per layer type, the worst error
relative to the layer's output scale, and whether every run's encoder output
is bit-identical to the first; :func:`patched_failures` lists the results of
the patched scatter that are wrong or not reproducible.
"""
import dataclasses
import json
import multiprocessing
import os
import os.path as osp
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

from ..utils.repo_paths import REPO_ROOT

#: The published fusion configs' encoder (R50 / voxel 0.1; the VoV and LiDAR-only configs use the same layers).
DEFAULT_CONFIGS = ('configs/cmt_voxel0100_r50_800x320_cbgs.py', )
SCATTERS = ('builtin', 'patched')
#: the command that runs :func:`run_worker` in a fresh interpreter (the repository root is its working directory)
_WORKER = f'from {__name__} import run_worker; run_worker()'


@dataclass
class RaceCheckOptions:
    """What :func:`check_spconv_race` runs (``tools/check_spconv_race.py``'s options).

    Attributes:
        configs (list[str]): configs whose ``pts_middle_encoder`` is checked.
        runs (int): encoder runs per config, thread count and scatter.
        threads (list[int]): ``OMP_NUM_THREADS`` values, one process each.
        load (int): busy-loop processes loading the cores meanwhile.
        scatter (list[str]): ``builtin`` and/or ``patched`` (:data:`SCATTERS`).
        sites (int): active voxels of the random input.
        grid (int): largest BEV side of the cropped sparse grid.
        seed (int): seed of the random input.
    """

    configs: List[str] = field(default_factory=lambda: list(DEFAULT_CONFIGS))
    runs: int = 50
    threads: List[int] = field(default_factory=lambda: [1, 2])
    load: int = 2
    scatter: List[str] = field(default_factory=lambda: list(SCATTERS))
    sites: int = 4000
    grid: int = 128
    seed: int = 0


def busy_loop() -> None:
    """Keep a core busy (the load processes)."""
    while True:
        pass


def build_cropped_encoder(config_path: str, grid: int):
    """The config's ``pts_middle_encoder`` with its BEV grid cropped to at most ``grid`` x ``grid`` cells.

    Raises:
        ValueError: the config has no spconv ``SparseEncoder``.
    """
    from mmcv import Config
    from mmdet3d.models import build_middle_encoder

    # importing this module imported the plugin, which patched spconv's CPU scatter-add
    cfg = Config.fromfile(config_path)
    encoder_cfg = cfg.model.get('pts_middle_encoder')
    if not encoder_cfg or 'sparse_shape' not in encoder_cfg:
        raise ValueError(f'{config_path}: pts_middle_encoder is not a spconv sparse encoder ({encoder_cfg})')
    depth, height, width = encoder_cfg.sparse_shape
    encoder_cfg.sparse_shape = [depth, min(height, grid), min(width, grid)]
    return build_middle_encoder(encoder_cfg).eval(), encoder_cfg


def random_sparse_input(encoder_cfg, sites: int, seed: int):
    """``(features [sites, C], coords [sites, 4] (batch 0, z, y, x))`` at distinct random sites of the grid."""
    import torch
    depth, height, width = encoder_cfg.sparse_shape
    generator = torch.Generator().manual_seed(seed)
    flat = torch.randperm(depth * height * width, generator=generator)[:sites]
    coords = torch.stack([torch.zeros_like(flat), flat // (height * width), flat // width % height, flat % width], 1)
    return torch.randn(len(flat), encoder_cfg.in_channels, generator=generator), coords.int()


def check_encoder(encoder, features, coords, runs: int) -> Dict:
    """Run ``encoder`` ``runs`` times, each with every sparse conv checked against its dense reference."""
    import torch

    from ..mmcv_custom.sparse_conv_check import check_sparse_convs
    first = None
    per_type: Dict[str, Dict[str, int]] = {}
    bad_runs, identical, worst = 0, True, 0.0
    for _ in range(runs):
        outputs = []
        report = check_sparse_convs(encoder, lambda: outputs.append(encoder(features, coords, 1)))
        for layer in report.values():
            counts = per_type.setdefault(layer['type'], dict(checked=0, wrong=0))
            counts['checked'] += 1
            counts['wrong'] += int(not layer['ok'])
            worst = max(worst, layer['max_abs_err'] / max(layer['scale'], 1e-12))
        bad_runs += int(not all(layer['ok'] for layer in report.values()))
        first = outputs[0] if first is None else first
        identical = identical and torch.equal(first, outputs[0])
    return dict(runs=runs, bad_runs=bad_runs, per_type=per_type, worst_rel_err=worst, bit_identical=identical)


def worker(options: RaceCheckOptions) -> None:
    """One thread count (``OMP_NUM_THREADS`` set by the parent): every config x scatter, JSON lines to stdout."""
    import torch

    from ..mmcv_custom.sparse_conv_check import spconv_openmp_threads
    from ..mmcv_custom.spconv_cpu_scatter import builtin_spconv_scatter_add
    threads = int(os.environ['OMP_NUM_THREADS'])
    torch.set_num_threads(threads)
    for config in options.configs:
        encoder, encoder_cfg = build_cropped_encoder(config, options.grid)
        features, coords = random_sparse_input(encoder_cfg, options.sites, options.seed)
        for scatter in options.scatter:
            start = time.perf_counter()
            if scatter == 'builtin':
                with builtin_spconv_scatter_add():
                    result = check_encoder(encoder, features, coords, options.runs)
            else:
                result = check_encoder(encoder, features, coords, options.runs)
            result.update(config=config, threads=threads, omp_threads=spconv_openmp_threads(), scatter=scatter,
                          seconds=time.perf_counter() - start, sparse_shape=list(encoder_cfg.sparse_shape))
            print(json.dumps(result), flush=True)


def run_worker() -> None:
    """The worker process: ``argv = [JSON options]``."""
    worker(RaceCheckOptions(**json.loads(sys.argv[1])))


def run_thread_count(options: RaceCheckOptions, threads: int) -> List[Dict]:
    """Run :func:`worker` in a fresh process with ``OMP_NUM_THREADS=threads``; its results, printed as they come."""
    command = [sys.executable, '-c', _WORKER, json.dumps(dataclasses.asdict(options))]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    results = []
    with subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True) as worker_process:
        for line in worker_process.stdout:
            if line.startswith('{'):
                result = json.loads(line)
                print(f"  {osp.basename(result['config'])}, {threads} thread(s), {result['scatter']}: "
                      f"{result['bad_runs']}/{result['runs']} runs wrong ({result['seconds']:.0f} s)", flush=True)
                results.append(dict(result, load=options.load))
    if worker_process.returncode != 0:
        raise SystemExit(f'the check with {threads} thread(s) failed (exit code {worker_process.returncode}); '
                         f'see its stderr')
    return results


def format_table(results: Sequence[Dict]) -> str:
    """A Markdown table of the results (one row per config, thread count and scatter)."""
    types = sorted({name for result in results for name in result['per_type']})
    lines = ['| config | threads | scatter | runs | runs with a wrong layer | '
             + ' | '.join(f'wrong {name} outputs' for name in types) + ' | worst rel. error | bit-identical |',
             '|---|---|---|---|---|' + '---|' * len(types) + '---|---|']
    for r in results:
        cells = [f"{r['per_type'][name]['wrong']}/{r['per_type'][name]['checked']}" if name in r['per_type'] else '-'
                 for name in types]
        lines.append(f"| {osp.basename(r['config'])} | {r['threads']} | {r['scatter']} | {r['runs']} | "
                     f"{r['bad_runs']} | " + ' | '.join(cells) + f" | {r['worst_rel_err']:.1e} | "
                     f"{'yes' if r['bit_identical'] else 'no'} |")
    return '\n'.join(lines)


def check_spconv_race(options: RaceCheckOptions) -> List[Dict]:
    """Every thread count of ``options`` under ``load`` busy-loop processes; the results of every config, thread
    count and scatter (see :func:`check_encoder`, plus ``config``, ``threads``, ``omp_threads``, ``scatter``,
    ``seconds``, ``sparse_shape``, ``load``)."""
    for config in options.configs:
        if not osp.isfile(osp.join(REPO_ROOT, config)) and not osp.isfile(config):
            raise SystemExit(f'config not found: {config}')
    loads = [multiprocessing.Process(target=busy_loop, daemon=True) for _ in range(options.load)]
    for process in loads:
        process.start()
    print(f'{options.load} load process(es) running; {options.runs} runs per config, thread count and scatter',
          flush=True)
    results = []
    try:
        for threads in options.threads:
            results += run_thread_count(options, threads)
    finally:
        for process in loads:
            process.terminate()
    return results


def patched_failures(results: Sequence[Dict]) -> List[str]:
    """A line per result of the patched scatter with a wrong run or a run not bit-identical to the first."""
    return [f"FAILED: patched scatter, {r['config']}, {r['threads']} thread(s): {r['bad_runs']} wrong runs, "
            f"bit-identical={r['bit_identical']}" for r in results
            if r['scatter'] == 'patched' and (r['bad_runs'] or not r['bit_identical'])]
