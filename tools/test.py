"""Test a CMT / CMT-AQR checkpoint (mmdet3d-style command line; GPU or CPU).

    python tools/test.py CONFIG CHECKPOINT --eval bbox [--out results.pkl] [--cfg-options k=v ...]
    python tools/test.py CONFIG CHECKPOINT --eval bbox --corruption camera_drop
    bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCESSES --eval bbox
    bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT --eval bbox

``--eval bbox`` runs the official nuScenes evaluation (mAP / NDS). The log and
the metrics (``eval_<timestamp>.json``) go to the work dir (default
``work_dirs/<config name>``).

``--corruption SPEC`` degrades the sensors at test time
(``lidar_drop|camera_drop|view_drop:N|fov:DEG|beams:K|points:R``, see
``projects/mmdet3d_plugin/datasets/pipelines/corruption.py``): a
``SensorCorruption`` step is inserted right after the loading steps of the
test pipeline. ``tools/eval_robustness.py`` runs every corruption in one go.
"""
import argparse
import os.path as osp
import time
from typing import List, Optional

import mmcv
from mmcv import DictAction
from mmcv.runner import get_dist_info
from mmdet.apis import multi_gpu_test, set_random_seed
from mmdet.utils import get_root_logger
from mmdet3d.apis import single_gpu_test
from mmdet3d.datasets import build_dataset

from projects.mmdet3d_plugin.apis.test import (apply_corruption, build_test_loader, build_test_model,
                                               evaluate_results, prepare_test_config)
from projects.mmdet3d_plugin.mmcv_custom.launch import default_device, init_distributed, load_config, resolve_work_dir
from projects.mmdet3d_plugin.mmcv_custom.parallel import wrap_model
from tools.cli.corruption import add_corruption_arguments
from tools.cli.launch import add_common_arguments


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test (and evaluate) a 3D detector')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save the log and the metrics')
    parser.add_argument('--out', help='output result file in pickle format')
    parser.add_argument('--fuse-conv-bn', action='store_true', help='fuse conv and bn (slightly faster)')
    parser.add_argument('--format-only', action='store_true',
                        help='format the results for the benchmark server without evaluating them')
    parser.add_argument('--eval', type=str, nargs='+', help='metrics to evaluate, e.g. "bbox" for nuScenes')
    parser.add_argument('--eval-options', nargs='+', action=DictAction,
                        help='arguments of dataset.evaluate / format_results, e.g. jsonfile_prefix=...')
    parser.add_argument('--gpu-collect', action='store_true', help='collect distributed results on GPU')
    parser.add_argument('--tmpdir', help='folder for collecting distributed results (default: in the work dir)')
    parser.add_argument('--gpu-id', type=int, default=0, help='(single process) id of the GPU to use')
    add_corruption_arguments(parser)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if not (args.out or args.eval or args.format_only):
        parser.error('say what to do with the results: --out, --eval and/or --format-only')
    if args.eval and args.format_only:
        parser.error('--eval and --format-only cannot be both given')
    return args


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    cfg = load_config(args)
    samples_per_gpu = prepare_test_config(cfg)
    device = default_device()
    distributed = init_distributed(args.launcher, cfg.get('dist_params'))
    rank, _ = get_dist_info()
    work_dir = resolve_work_dir(args, cfg)
    timestamp = time.strftime('%Y%m%d_%H%M%S', time.localtime())
    logger = get_root_logger(log_file=osp.join(work_dir, f'test_{timestamp}.log'), log_level=cfg.log_level)
    logger.info(f'Testing {args.checkpoint} with {args.config} on {device} (distributed: {distributed})')
    set_random_seed(args.seed, deterministic=args.deterministic)
    cfg = apply_corruption(cfg, args.corruption, seed=args.corruption_seed, logger=logger)

    dataset = build_dataset(cfg.data.test)
    data_loader = build_test_loader(dataset, cfg, samples_per_gpu, distributed)
    model = build_test_model(cfg, args.checkpoint, dataset.CLASSES, logger=logger, fuse_bn=args.fuse_conv_bn)
    model = wrap_model(model, device, distributed, gpu_ids=[args.gpu_id], broadcast_buffers=False)
    if distributed:
        if args.gpu_collect and device != 'cuda':
            raise ValueError('--gpu-collect needs GPUs')
        tmpdir = args.tmpdir or osp.join(work_dir, '.dist_test')
        outputs = multi_gpu_test(model, data_loader, tmpdir, args.gpu_collect)
    else:
        outputs = single_gpu_test(model, data_loader)
    if rank != 0:
        return

    if args.out:
        logger.info(f'writing results to {args.out}')
        mmcv.dump(outputs, args.out)
    kwargs = args.eval_options or {}
    if args.format_only:
        dataset.format_results(outputs, **kwargs)
    if args.eval:
        metrics = evaluate_results(dataset, outputs, cfg, args.eval, logger=logger, **kwargs)
        logger.info(f'metrics: {metrics}')
        mmcv.dump(dict(config=args.config, checkpoint=args.checkpoint, corruption=args.corruption,
                       corruption_seed=args.corruption_seed if args.corruption else None, metrics=metrics),
                  osp.join(work_dir, f'eval_{timestamp}.json'))


if __name__ == '__main__':
    main()
