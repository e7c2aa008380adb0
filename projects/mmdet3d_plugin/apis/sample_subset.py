"""Evaluating on the first N samples of a nuScenes test set with the official devkit.

The devkit's ``DetectionEval`` loads the ground truth of the whole split
(e.g. ``mini_val``) and refuses predictions that cover only part of it
("Samples in split doesn't match samples in predictions"). For quick runs
(``tools/eval_robustness.py --samples N``) :func:`keep_first_samples` cuts the
dataset and :func:`nuscenes_ground_truth_of` narrows the devkit's ground
truth to the same samples while ``dataset.evaluate`` runs; everything else
(matching, mAP, TP errors, NDS) is the devkit's own code.
"""
import contextlib
from typing import Collection, Iterator, List, Optional

from torch.utils.data import Dataset


def keep_first_samples(dataset: Dataset, num_samples: Optional[int]) -> Optional[List[str]]:
    """Keep only the first ``num_samples`` samples of a nuScenes dataset (in place).

    Args:
        dataset (Dataset): an mmdet3d ``NuScenesDataset`` (``data_infos``).
        num_samples (int, optional): samples to keep; None keeps all.

    Returns:
        list[str] | None: the kept sample tokens, or None when the dataset
        was not cut (``num_samples`` None or not below its length).

    Raises:
        ValueError: ``num_samples`` < 1.
    """
    if num_samples is None or num_samples >= len(dataset.data_infos):
        return None
    if num_samples < 1:
        raise ValueError(f'the number of samples to evaluate must be >= 1, got {num_samples}')
    dataset.data_infos = dataset.data_infos[:num_samples]
    return [info['token'] for info in dataset.data_infos]


@contextlib.contextmanager
def nuscenes_ground_truth_of(sample_tokens: Collection[str]) -> Iterator[None]:
    """Within the block, the devkit's detection evaluation loads the ground truth of these samples only.

    Args:
        sample_tokens (Collection[str]): samples of the evaluated split.

    Raises:
        ValueError: (when the devkit loads the ground truth) a token is not
            in the evaluated split.
    """
    from nuscenes.eval.common.data_classes import EvalBoxes
    from nuscenes.eval.detection import evaluate as detection_evaluate

    load_split = detection_evaluate.load_gt
    tokens = list(sample_tokens)

    def load_samples(nusc, eval_split: str, box_cls, verbose: bool = False) -> EvalBoxes:
        split_boxes = load_split(nusc, eval_split, box_cls, verbose=verbose)
        missing = sorted(set(tokens) - set(split_boxes.sample_tokens))
        if missing:
            raise ValueError(f'{len(missing)} evaluated samples are not in the {eval_split} split, e.g. {missing[0]}')
        boxes = EvalBoxes()
        for token in tokens:
            boxes.add_boxes(token, split_boxes[token])
        return boxes

    detection_evaluate.load_gt = load_samples
    try:
        yield
    finally:
        detection_evaluate.load_gt = load_split
