"""The robustness study's summary over seeds, its Markdown report and its chart.

Input: per arm, one ``{corruption: result}`` per seed (same seed order for
every arm), each result a ``tools/eval_robustness.py --object-metrics``
result dict (``status``, ``mAP``, ``NDS``, ``objects``). Output, per
corruption and metric: each arm's mean and min … max over the seeds, and
each arm's per-seed difference from the control (mean, range, and whether
the sign is the same on every seed); and each two-sensor arm under the loss
of a sensor against the single-sensor model of the other
(:func:`degradation_lines`).
"""
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from .study_arms import REFERENCE_ARM, StudyArm

Runs = Dict[str, List[Dict[str, dict]]]


@dataclass(frozen=True)
class StudyMetric:
    """A metric of the report: its key, its title and where a result holds it (top level or in ``objects``)."""

    key: str
    title: str
    in_objects: bool = False

    def of(self, result: dict) -> Optional[float]:
        """The metric's value in an eval_robustness result (None if the run failed or it is undefined)."""
        if result.get('status') != 'ok':
            return None
        return (result.get('objects') or {}).get(self.key) if self.in_objects else result.get(self.key)


METRICS = (StudyMetric('mAP', 'mAP'), StudyMetric('NDS', 'NDS'),
           StudyMetric('affected_recall', 'recall at 2 m of the affected objects', in_objects=True),
           StudyMetric('false_positives_per_sample', 'false positives per sample', in_objects=True),
           StudyMetric('ghost_false_positives_per_sample', 'false positives per sample within 2 m of a ghost',
                       in_objects=True),
           StudyMetric('router_accuracy', 'router accuracy against the per-query targets', in_objects=True),
           StudyMetric('dead_camera_attention', 'cross-attention on the camera keys where no live view sees the '
                       'object', in_objects=True),
           StudyMetric('dead_lidar_attention', 'cross-attention on the BEV keys where the object lost its points',
                       in_objects=True))


def spread(values: Sequence[float]) -> Optional[dict]:
    """``dict(mean, min, max, n)`` of ``values`` (None when empty)."""
    return dict(mean=statistics.fmean(values), min=min(values), max=max(values), n=len(values)) if values else None


def paired_difference(values: Sequence[Optional[float]], references: Sequence[Optional[float]]) -> Optional[dict]:
    """Per-seed ``value - reference`` over the seeds where both exist: :func:`spread` plus ``same_sign``.

    ``same_sign`` is True when every difference is > 0, or every one is < 0.
    """
    differences = [value - reference for value, reference in zip(values, references)
                   if value is not None and reference is not None]
    stats = spread(differences)
    if stats is not None:
        stats['same_sign'] = all(d > 0 for d in differences) or all(d < 0 for d in differences)
    return stats


def summarise(runs: Runs, corruptions: Sequence[str], reference: str = REFERENCE_ARM) -> Dict[str, dict]:
    """Per corruption: each arm's metrics over the seeds and its paired differences from ``reference``.

    Args:
        runs (dict): arm -> one ``{corruption: result}`` per seed (same seed order for every arm).
        corruptions (Sequence[str]): the rows.
        reference (str): the arm the differences are taken against.

    Returns:
        dict: ``summary[corruption]['arms'][arm][metric]`` (:func:`spread` or None) and
        ``summary[corruption]['minus_' + reference][arm][metric]`` (:func:`paired_difference` or None)
        for every arm but ``reference``.
    """
    if reference not in runs:
        raise ValueError(f'no runs of the reference arm {reference!r}: {sorted(runs)}')
    lengths = {arm: len(seeds) for arm, seeds in runs.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f'every arm needs one run per seed, got {lengths}')
    summary = {}
    for corruption in corruptions:
        values = {arm: {metric.key: [metric.of(seed.get(corruption, {})) for seed in seeds] for metric in METRICS}
                  for arm, seeds in runs.items()}
        summary[corruption] = {
            'arms': {arm: {key: spread([v for v in series if v is not None]) for key, series in metrics.items()}
                     for arm, metrics in values.items()},
            f'minus_{reference}': {arm: {key: paired_difference(series, values[reference][key])
                                         for key, series in metrics.items()}
                                   for arm, metrics in values.items() if arm != reference}}
    return summary


#: Graceful degradation: each fused model under a sensor's loss against the model of the surviving sensor alone,
#: at its own level (the LiDAR-only model under camera_drop: the black views it trained on; the camera-only model,
#: which reads no points, clean): corruption -> (single-sensor arm, that arm's corruption).
SINGLE_SENSOR_LEVELS = {'camera_drop': ('lidar_only', 'camera_drop'), 'lidar_drop': ('camera_only', 'clean')}


def degradation_lines(runs: Runs, arms: Sequence[StudyArm]) -> List[str]:
    """Markdown lines: per arm with both sensors, its mAP under each sensor loss minus the surviving sensor's
    single-sensor model (:data:`SINGLE_SENSOR_LEVELS`), paired per seed; none without both single-sensor arms or
    a corruption of the table."""
    first = next(iter(runs.values()), [{}])[0] if runs else {}
    losses = [name for name, (arm, level) in SINGLE_SENSOR_LEVELS.items()
              if arm in runs and name in first and level in first]
    if not losses:
        return []
    mAP = METRICS[0]
    single = {name for name, _ in SINGLE_SENSOR_LEVELS.values()}
    labels = {arm.name: arm.label for arm in arms}
    lines = ['## Graceful degradation', '',
             'mAP under the loss of a sensor minus the model of the surviving sensor alone (same data, schedule and '
             'seed), per seed: ' + '; '.join(f'`{name}` against {labels.get(arm, arm)} '
                                              f'({"its " + level if level != "clean" else "clean"})'
                                              for name, (arm, level) in SINGLE_SENSOR_LEVELS.items()
                                              if name in losses) + '.', '',
             '| arm | ' + ' | '.join(f'{name} − {labels.get(SINGLE_SENSOR_LEVELS[name][0])}' for name in losses) + ' |',
             '|---|' + '---:|' * len(losses)]
    for arm in arms:
        if arm.name in single or arm.name not in runs:
            continue
        cells = []
        for name in losses:
            reference, level = SINGLE_SENSOR_LEVELS[name]
            cells.append(cell(paired_difference([mAP.of(seed.get(name, {})) for seed in runs[arm.name]],
                                                [mAP.of(seed.get(level, {})) for seed in runs[reference]]),
                              signed=True))
        lines.append(f'| {arm.label} | ' + ' | '.join(cells) + ' |')
    return lines + ['']


def _number(value: float, sign: str) -> str:
    return f'{round(value, 3) + 0.0:{sign}.3f}'  # no '-0.000' for a tiny negative value


def cell(stats: Optional[dict], signed: bool = False) -> str:
    """``mean (min … max)`` (the range only over several seeds); a difference with the same sign on every
    seed in bold; ``n/a`` without values."""
    if stats is None:
        return 'n/a'
    sign = '+' if signed else ''
    mean = _number(stats['mean'], sign)
    if signed and stats['same_sign'] and stats['n'] > 1:
        mean = f'**{mean}**'
    if stats['n'] == 1:
        return mean
    return f'{mean} ({_number(stats["min"], sign)} … {_number(stats["max"], sign)})'


def metric_tables(summary: Dict[str, dict], arms: Sequence[StudyArm], reference: str = REFERENCE_ARM) -> List[str]:
    """Markdown lines: per metric that has a value somewhere, a table of the arms and one of their differences
    from ``reference``, each over the corruptions where an arm has a value."""
    others = [arm for arm in arms if arm.name != reference]
    reference_label = next(arm.label for arm in arms if arm.name == reference)
    lines = []
    for metric in METRICS:
        rows = {corruption: row for corruption, row in summary.items()
                if any(row['arms'][arm.name][metric.key] is not None for arm in arms)}
        if not rows:
            continue
        lines += [f'## {metric.title}', '', '| corruption | ' + ' | '.join(arm.label for arm in arms) + ' |',
                  '|---|' + '---:|' * len(arms)]
        lines += [f'| {corruption} | ' + ' | '.join(cell(row['arms'][arm.name][metric.key]) for arm in arms) + ' |'
                  for corruption, row in rows.items()]
        lines += ['', f'{metric.title}, each arm minus the {reference_label} of the same seed:', '',
                  '| corruption | ' + ' | '.join(f'{arm.label} − {reference_label}' for arm in others) + ' |',
                  '|---|' + '---:|' * len(others)]
        lines += [f'| {corruption} | ' + ' | '.join(cell(row[f'minus_{reference}'][arm.name][metric.key], signed=True)
                                                    for arm in others) + ' |'
                  for corruption, row in rows.items()]
        lines.append('')
    return lines


def bar_chart(summary: Dict[str, dict], arms: Sequence[StudyArm], path: str) -> None:
    """Grouped bars of the mean mAP and NDS per corruption and arm, the seeds' min … max as error bars."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    corruptions = list(summary)
    scores = [metric for metric in METRICS if not metric.in_objects]
    width = 0.8 / len(arms)
    fig, axes = plt.subplots(len(scores), 1, figsize=(max(6.0, 1.1 * len(corruptions)), 3.2 * len(scores)),
                             sharex=True, squeeze=False)
    for ax, metric in zip(axes[:, 0], scores):
        for index, arm in enumerate(arms):
            stats = [summary[corruption]['arms'][arm.name][metric.key] for corruption in corruptions]
            means = [s['mean'] if s else 0.0 for s in stats]
            # clamped at 0: the mean of equal values (a shared stage 1) can round past them
            errors = [[max(0.0, s['mean'] - s['min']) if s else 0.0 for s in stats],
                      [max(0.0, s['max'] - s['mean']) if s else 0.0 for s in stats]]
            offset = (index - (len(arms) - 1) / 2) * width
            ax.bar([i + offset for i in range(len(corruptions))], means, width, yerr=errors, capsize=2,
                   label=arm.label)
        ax.set_ylabel(f'{metric.title} (synthetic val)')
    axes[0, 0].legend(fontsize=7, ncol=min(len(arms), 3))
    axes[-1, 0].set_xticks(range(len(corruptions)))
    axes[-1, 0].set_xticklabels(corruptions, rotation=30, ha='right', fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def per_seed_lines(runs: Runs, arms: Sequence[StudyArm], seeds: Sequence[int]) -> List[str]:
    """Markdown lines: every arm's mAP under every corruption of the runs, seed by seed (none for one seed)."""
    if len(seeds) < 2:
        return []
    mAP = METRICS[0]
    corruptions = list(runs[arms[0].name][0]) if runs.get(arms[0].name) else []
    lines = ['## mAP per seed', '', f'Seeds {" / ".join(map(str, seeds))} (`n/a`: the run failed).', '',
             '| corruption | ' + ' | '.join(arm.label for arm in arms) + ' |', '|---|' + '---:|' * len(arms)]
    for corruption in corruptions:
        cells = [' / '.join('n/a' if value is None else f'{value:.3f}'
                            for value in (mAP.of(seed.get(corruption, {})) for seed in runs[arm.name]))
                 for arm in arms]
        lines.append(f'| {corruption} | ' + ' | '.join(cells) + ' |')
    return lines + ['']


def markdown_report(title: str, intro: Sequence[str], summary: Dict[str, dict], arms: Sequence[StudyArm],
                    chart: str, pictures: Dict[str, List[str]], picture_caption: str,
                    degradation: Sequence[str] = (), per_seed: Sequence[str] = ()) -> str:
    """The text of ``study.md``: title, setup (``intro`` lines), the ``degradation`` lines
    (:func:`degradation_lines`), one pair of tables per metric, the ``per_seed`` lines (:func:`per_seed_lines`),
    the chart and the routing pictures (``{corruption: [file names]}``, relative to the report)."""
    lines = [f'# {title}', '', *intro, '', *degradation, *metric_tables(summary, arms), *per_seed,
             f'![mAP and NDS per corruption and arm, the seeds\' range as error bars]({chart})', '']
    if pictures:
        lines += [picture_caption, '']
        for corruption, files in pictures.items():
            lines += [f'### {corruption}', ''] + [f'![{corruption}: {name}]({name})' for name in files] + ['']
    return '\n'.join(lines)
