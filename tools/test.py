"""Test a CMT / CMT-AQR checkpoint (mmdet3d-style command line; GPU or CPU).

    python tools/test.py CONFIG CHECKPOINT --eval bbox [--out results.pkl] [--cfg-options k=v ...]
    bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCESSES --eval bbox

``--eval bbox`` runs the official nuScenes evaluation (mAP / NDS). The log and
the metrics (``eval_<timestamp>.json``) go to the work dir (default
``work_dirs/<config name>``).
"""
import argparse
import os.path as osp
import sys
import time

import mmcv
from mmcv import DictAction
from mmcv.cnn import fuse_conv_bn
from mmcv.runner import get_dist_info, load_checkpoint, wrap_fp16_model
from mmdet.apis import multi_gpu_test, set_random_seed
from mmdet.datasets import build_dataloader, replace_ImageToTensor
from mmdet.utils import get_root_logger
from mmdet3d.apis import single_gpu_test
from mmdet3d.datasets import build_dataset
from mmdet3d.models import build_model

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from projects.mmdet3d_plugin.mmcv_custom.launch import (add_common_arguments, default_device,  # noqa: E402
                                                        init_distributed, load_config,
                                                        resolve_work_dir)
from projects.mmdet3d_plugin.mmcv_custom.parallel import wrap_model  # noqa: E402


def parse_args():
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
    add_common_arguments(parser)
    args = parser.parse_args()
    if not (args.out or args.eval or args.format_only):
        parser.error('say what to do with the results: --out, --eval and/or --format-only')
    if args.eval and args.format_only:
        parser.error('--eval and --format-only cannot be both given')
    return args


def main():
    args = parse_args()
    cfg = load_config(args)
    cfg.model.pretrained = None
    cfg.data.test.test_mode = True
    samples_per_gpu = cfg.data.test.pop('samples_per_gpu', 1)
    if samples_per_gpu > 1:
        cfg.data.test.pipeline = replace_ImageToTensor(cfg.data.test.pipeline)
    device = default_device()
    distributed = init_distributed(args.launcher, cfg.get('dist_params'))
    rank, _ = get_dist_info()
    work_dir = resolve_work_dir(args, cfg)
    timestamp = time.strftime('%Y%m%d_%H%M%S', time.localtime())
    logger = get_root_logger(log_file=osp.join(work_dir, f'test_{timestamp}.log'), log_level=cfg.log_level)
    logger.info(f'Testing {args.checkpoint} with {args.config} on {device} (distributed: {distributed})')
    set_random_seed(args.seed, deterministic=args.deterministic)

    dataset = build_dataset(cfg.data.test)
    data_loader = build_dataloader(dataset, samples_per_gpu=samples_per_gpu,
                                   workers_per_gpu=cfg.data.workers_per_gpu, dist=distributed, shuffle=False)
    model = build_model(cfg.model, train_cfg=None, test_cfg=cfg.get('test_cfg'))
    if cfg.get('fp16', None) is not None:
        wrap_fp16_model(model)
    checkpoint = load_checkpoint(model, args.checkpoint, map_location='cpu', logger=logger)
    if args.fuse_conv_bn:
        model = fuse_conv_bn(model)
    model.CLASSES = checkpoint.get('meta', {}).get('CLASSES', dataset.CLASSES)

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
        eval_kwargs = {k: v for k, v in cfg.get('evaluation', {}).items()
                       if k not in ('interval', 'tmpdir', 'start', 'gpu_collect', 'save_best', 'rule')}
        eval_kwargs.update(dict(metric=args.eval, **kwargs))
        metrics = dataset.evaluate(outputs, logger=logger, **eval_kwargs)
        logger.info(f'metrics: {metrics}')
        mmcv.dump(dict(config=args.config, checkpoint=args.checkpoint, metrics=metrics),
                  osp.join(work_dir, f'eval_{timestamp}.json'))


if __name__ == '__main__':
    main()
