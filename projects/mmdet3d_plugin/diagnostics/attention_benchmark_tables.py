"""The Markdown tables of :func:`~.attention_benchmark.run_attention_benchmark`'s results
(``tools/benchmark_attention.py``, ``tools/check_gpu.py``)."""
from typing import List

from ..attention import dispatch
from .attention_cases import num_keys


def _format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f'{seconds:.2f} s'
    if seconds >= 1e-3:
        return f'{seconds * 1e3:.1f} ms'
    return f'{seconds * 1e6:.0f} us'


def markdown_tables(attention: List[dict], construction: List[dict]) -> str:
    """Per case and backend: median time, ratio to bias-free SDPA and peak memory; then the construction times."""
    lines = ['| keys (layout) | Q | bs | bias | pass | backend | median | x bias-free SDPA | peak memory |',
             '|---|---|---|---|---|---|---|---|---|']
    for r in attention:
        shape = f'{num_keys(r["layout"])} ({r["layout"]}) | {r["queries"]} | {r["batch"]} | {r["bias"]} | {r["pass"]}'
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


def benchmark_report(result: dict) -> str:
    """The crossover table (with ``crossover``) or the main tables, then a line per bias with ``auto``'s pick."""
    table = (crossover_table(result['crossover']) if 'crossover' in result
             else markdown_tables(result['attention'], result['construction']))
    picks = [f'auto picks {name!r} for the {bias_kind} bias: {reason}'
             for bias_kind, (name, reason) in result['auto'].items()]
    return '\n'.join([table, ''] + picks)
