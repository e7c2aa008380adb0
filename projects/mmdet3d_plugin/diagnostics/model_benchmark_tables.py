"""The Markdown tables of :func:`~.model_benchmark.run_model_benchmark`'s results (``tools/benchmark_model.py``)."""
import os.path as osp
from typing import Dict, List, Optional


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


def attention_label(calls: Dict[str, float]) -> str:
    """Attention calls per run by kernel and dtype, ``{'tiled_bias float16': 6.0}``, as ``'tiled_bias float16 ×6'``."""
    return ', '.join(f'{kernel} ×{count:g}' for kernel, count in calls.items()) or '—'


def markdown_tables(results: List[dict]) -> str:
    """The summary table (each model's attention kernels and precision, median times, paired ratio, peak memory)
    and a per-part table of each shape and mode; indented rows are part of the row above them."""
    lines = ['| shape | mode | A attention | B attention | A median ms | B median ms | B/A median [min, max] | '
             'peak A | peak B |', '|---|---|---|---|---:|---:|---|---:|---:|']
    for r in results:
        ratio = r['ratio']
        kernels = ' | '.join(attention_label(side) for side in r['attention'])
        lines.append(f'| {r["shape"]} | {_mode_label(r)} | {kernels} | {_ms(r["median_ms"]["A"])} | '
                     f'{_ms(r["median_ms"]["B"])} | '
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
