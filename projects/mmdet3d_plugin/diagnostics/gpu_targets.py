"""The targets a GPU run is read against (``tools/gpu_run.py``): CMT-AQR against CMT, both in the default
half-precision cross-attention, and the AQR local bias against bias-free attention of the same dtype.

:func:`model_target_rows` reads ``tools/benchmark_model.py``'s JSON, :func:`attention_target_rows`
``tools/benchmark_attention.py``'s; each row is ``dict(target, measured, limit, met)``, ``measured`` the median
of the paired ratios (time) or the ratio of the peaks (memory), None where the run has no such number.
"""
from typing import List, Optional

#: CMT-AQR / CMT time per mode of ``tools/benchmark_model.py``
MODEL_TIME_LIMITS = {'inference': 1.05, 'train': 1.10}
#: CMT-AQR / CMT peak memory
PEAK_MEMORY_LIMIT = 1.15
#: the local bias's forward + backward in ``tiled_bias`` against bias-free SDPA, at the VoV shape
LOCAL_BIAS_LIMIT = 1.5
LOCAL_BIAS_CASE = dict(layout='vov', bias='local', backend='tiled_bias', **{'pass': 'fwdbwd'})


def _row(target: str, measured: Optional[float], limit: float) -> dict:
    return dict(target=target, measured=measured, limit=limit, met=measured is not None and measured <= limit)


def model_target_rows(report: dict) -> List[dict]:
    """Per shape and mode of a ``benchmark_model`` report: time and peak memory B/A against their limits."""
    batch_size = report['settings']['batch_size']
    rows = []
    for result in report['results']:
        name = f'{result["shape"]} {result["mode"]} bs {batch_size}'
        if result['mode'] in MODEL_TIME_LIMITS:
            rows.append(_row(f'{name}: time B/A', result['ratio']['median'], MODEL_TIME_LIMITS[result['mode']]))
        peaks = result['peak_mib']
        ratio = peaks['B'] / peaks['A'] if peaks.get('A') and peaks.get('B') is not None else None
        rows.append(_row(f'{name}: peak memory B/A', ratio, PEAK_MEMORY_LIMIT))
    return rows


def attention_target_rows(report: dict) -> List[dict]:
    """The :data:`LOCAL_BIAS_CASE` records of a ``benchmark_attention`` report against :data:`LOCAL_BIAS_LIMIT`."""
    rows = []
    for record in report['attention']:
        if all(record.get(key) == value for key, value in LOCAL_BIAS_CASE.items()):
            measured = record['ratio'] if record['status'] == 'ok' else None
            rows.append(_row(f'{record["layout"]} bs {record["batch"]} Q {record["queries"]} local bias fwd+bwd '
                             f'{record["dtype"]}: tiled_bias / bias-free SDPA', measured, LOCAL_BIAS_LIMIT))
    return rows


def targets_table(rows: List[dict]) -> str:
    """``rows`` as a Markdown table."""
    lines = ['| target | measured | limit | met |', '|---|---|---|---|']
    for row in rows:
        measured = 'n/a' if row['measured'] is None else f'{row["measured"]:.3f}'
        lines.append(f'| {row["target"]} | {measured} | {row["limit"]:g} | {"yes" if row["met"] else "NO"} |')
    return '\n'.join(lines)
