"""Heading and velocity errors of a checkpoint on its test set, per class (what the devkit's mAOE / mAVE hide).

    python tools/analyze_box_errors.py CONFIG CHECKPOINT [--score-thr 0.2] [--samples N] [--cfg-options k=v ...]

Runs the model over ``data.test`` and matches each ground-truth object to a
detection of its class within 2 m; prints, per class, the share of headings
right (< 45 degrees), sideways and flipped (> 135), the median heading and
axis errors and the velocity error beside that of predicting zero
(``projects/mmdet3d_plugin/apis/box_errors.py``).
"""
import argparse
from typing import List, Optional

from mmcv import DictAction
from mmcv.parallel import MMDataParallel
from mmdet3d.apis import single_gpu_test
from mmdet3d.datasets import build_dataset

from projects.mmdet3d_plugin.apis.box_errors import dataset_matches, error_table
from projects.mmdet3d_plugin.apis.sample_subset import keep_first_samples
from projects.mmdet3d_plugin.apis.test import (build_test_loader, build_test_model, load_test_config,
                                               prepare_test_config)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='per-class heading and velocity errors of a detector')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--score-thr', type=float, default=0.2, help='lowest score a detection counts with')
    parser.add_argument('--max-distance', type=float, default=2.0, help='largest centre distance of a match (m)')
    parser.add_argument('--samples', type=int, help='the first N test samples only')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config settings')
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> str:
    args = parse_args(argv)
    cfg = load_test_config(args.config, args.cfg_options)
    samples_per_gpu = prepare_test_config(cfg)
    dataset = build_dataset(cfg.data.test)
    keep_first_samples(dataset, args.samples)
    model = MMDataParallel(build_test_model(cfg, args.checkpoint, dataset.CLASSES))
    outputs = single_gpu_test(model, build_test_loader(dataset, cfg, samples_per_gpu))
    table = error_table(dataset_matches(dataset, outputs, args.score_thr, args.max_distance), dataset.CLASSES)
    print(f'\n{args.checkpoint}: detections scoring >= {args.score_thr} matched within {args.max_distance} m\n')
    print(table)
    return table


if __name__ == '__main__':
    main()
