"""Train-time sensor corruptions on the command line: ``--train-corruptions ITEM [ITEM ...]`` (tools/train.py).

An item is ``SPEC`` or ``SPEC=PROB``: a corruption spec of ``--corruption`` (``mode[:arg[:arg]]``,
``projects/mmdet3d_plugin/datasets/pipelines/corruption.py``) drawn with probability ``PROB`` per training sample
(:data:`DEFAULT_TRAIN_PROB` when not given), or ``sensor_failures`` (:data:`SENSOR_FAILURES`): the default mix
``SENSOR_FAILURE_CORRUPTIONS``. At most one corruption is applied per sample, so the probabilities sum to at
most 1. :func:`apply_train_corruptions` puts the mix into the config's training pipelines (``add_train_corruptions``).
"""
import argparse
from typing import Dict, List, Optional, Sequence

from mmcv import Config

from projects.mmdet3d_plugin.datasets.corruption_config import SENSOR_FAILURE_CORRUPTIONS, add_train_corruptions
from tools.cli.corruption import corruption_spec

#: The item that stands for the default mix of sensor failures.
SENSOR_FAILURES = 'sensor_failures'
#: Probability of an item given without one: that of each corruption of the default mix.
DEFAULT_TRAIN_PROB = 0.15


def train_corruption_items(text: str) -> List[Dict]:
    """``argparse`` type of a ``--train-corruptions`` item: its ``dict(spec=..., prob=...)`` item(s).

    Raises:
        argparse.ArgumentTypeError: a bad spec or a probability outside ``[0, 1]``.
    """
    text = text.strip()
    if text == SENSOR_FAILURES:
        return [dict(item) for item in SENSOR_FAILURE_CORRUPTIONS]
    spec, _, prob = text.partition('=')
    try:
        probability = float(prob) if prob else DEFAULT_TRAIN_PROB
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r}: the probability after "=" must be a number') from None
    if not 0 <= probability <= 1:
        raise argparse.ArgumentTypeError(f'{text!r}: the probability must be in [0, 1], got {probability}')
    return [dict(spec=corruption_spec(spec), prob=probability)]


def add_train_corruption_arguments(parser: argparse.ArgumentParser) -> None:
    """``--train-corruptions ITEM [ITEM ...]`` (see the module docstring)."""
    parser.add_argument('--train-corruptions', nargs='+', type=train_corruption_items, metavar='SPEC[=PROB]',
                        help=f'corrupt the training samples, at most one corruption per sample: corruption specs '
                        f'of --corruption, each drawn with probability PROB (default {DEFAULT_TRAIN_PROB}), or '
                        f'{SENSOR_FAILURES} (the default mix: '
                        f'{" ".join(item["spec"] for item in SENSOR_FAILURE_CORRUPTIONS)}, '
                        f'{DEFAULT_TRAIN_PROB} each); e.g. {SENSOR_FAILURES} lidar_ghost:3 mixed_lie:120=0.1 '
                        f'(docs/robustness.md)')


def train_corruption_mix(parsed: Optional[Sequence[List[Dict]]]) -> List[Dict]:
    """The ``dict(spec=..., prob=...)`` items of the parsed ``--train-corruptions`` (empty when not given).

    Raises:
        ValueError: a spec given twice, or probabilities summing to more than 1.
    """
    items = [item for group in parsed or () for item in group]
    specs = [item['spec'] for item in items]
    repeated = sorted({spec for spec in specs if specs.count(spec) > 1})
    if repeated:
        raise ValueError(f'--train-corruptions lists {repeated} more than once')
    total = sum(item['prob'] for item in items)
    if total > 1 + 1e-9:
        raise ValueError(f'--train-corruptions: the probabilities sum to {total:g} > 1 (one corruption per sample)')
    return items


def apply_train_corruptions(cfg: Config, parsed: Optional[Sequence[List[Dict]]]) -> List[Dict]:
    """Put the parsed ``--train-corruptions`` into ``cfg``'s training pipelines (in place); return the mix."""
    items = train_corruption_mix(parsed)
    if items:
        add_train_corruptions(cfg, items)
    return items
