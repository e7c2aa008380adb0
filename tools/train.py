"""Train a CMT / CMT-AQR detector (mmdet3d-style command line; GPU or CPU).

    python tools/train.py CONFIG [--work-dir DIR] [--resume-from CKPT | --auto-resume] [--autoscale-lr]
                          [--train-corruptions SPEC[=PROB] ...] [--cfg-options k=v ...]
    bash tools/dist_train.sh CONFIG NUM_PROCESSES [same options]
    bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [same options]

Logs (``<timestamp>.log`` / ``.log.json``), the dumped config and the
checkpoints go to the work dir (default ``work_dirs/<config name>``).
Checkpoints are written atomically (``AtomicCheckpointHook``), and a run
resumed from the checkpoint of epoch ``N`` trains the following epochs
exactly as the interrupted run did (same data order, augmentations and random
numbers; see ``projects/mmdet3d_plugin/mmcv_custom/seeding.py``).
``--train-corruptions`` adds sensor failures and lies to the training
samples (``tools/cli/train_corruptions.py``, docs/robustness.md).
"""
import argparse
import copy
import os.path as osp
import time
from typing import Optional, Sequence

from mmcv.runner import get_dist_info
from mmdet import __version__ as mmdet_version
from mmdet.apis import init_random_seed, set_random_seed
from mmdet.utils import get_root_logger
from mmdet3d import __version__ as mmdet3d_version
from mmdet3d.datasets import build_dataset
from mmdet3d.models import build_model
from mmdet3d.utils import collect_env

from projects.mmdet3d_plugin.apis.train import REFERENCE_GPUS, linear_scaled_lr, train_detector
from projects.mmdet3d_plugin.datasets.corruption_config import describe_corruptions
from projects.mmdet3d_plugin.mmcv_custom.launch import default_device, init_distributed, load_config, resolve_work_dir
from tools.cli.launch import add_common_arguments
from tools.cli.train_corruptions import add_train_corruption_arguments, apply_train_corruptions, train_corruption_mix


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line of ``argv`` (default: ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(description='Train a 3D detector')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument('--resume-from', help='the checkpoint file to resume from (an error if it does not load)')
    parser.add_argument('--auto-resume', action='store_true',
                        help='resume from the newest checkpoint of the work dir that loads (skipping corrupt ones)')
    parser.add_argument('--no-validate', action='store_true', help='do not evaluate during training')
    parser.add_argument('--autoscale-lr', action='store_true',
                        help=f'scale the learning rate linearly with the number of processes (GPUs), as mmdet3d: '
                        f'lr x processes / {REFERENCE_GPUS}, the configs\' lr being set for {REFERENCE_GPUS} GPUs')
    group_gpus = parser.add_mutually_exclusive_group()
    group_gpus.add_argument('--gpus', type=int, help='(single process) number of GPUs; only 1 is supported')
    group_gpus.add_argument('--gpu-ids', type=int, nargs='+', help='(single process) ids of the GPUs to use')
    group_gpus.add_argument('--gpu-id', type=int, default=0, help='(single process) id of the GPU to use')
    add_train_corruption_arguments(parser)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    try:
        train_corruption_mix(args.train_corruptions)
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Train as the command line ``argv`` says (default: ``sys.argv[1:]``)."""
    args = parse_args(argv)
    cfg = load_config(args)
    train_corruptions = apply_train_corruptions(cfg, args.train_corruptions)
    cfg.work_dir = resolve_work_dir(args, cfg)
    if args.resume_from is not None:
        cfg.resume_from = args.resume_from
    cfg.auto_resume = args.auto_resume
    cfg.device = default_device()
    if args.gpus is not None and args.gpus > 1:
        raise ValueError('one process drives one GPU: use tools/dist_train.sh for several')
    cfg.gpu_ids = args.gpu_ids[:1] if args.gpu_ids else [args.gpu_id]
    distributed = init_distributed(args.launcher, cfg.get('dist_params'))
    if distributed:
        cfg.gpu_ids = list(range(get_dist_info()[1]))

    timestamp = time.strftime('%Y%m%d_%H%M%S', time.localtime())
    logger = get_root_logger(log_file=osp.join(cfg.work_dir, f'{timestamp}.log'), log_level=cfg.log_level)
    env_info = '\n'.join(f'{k}: {v}' for k, v in collect_env().items())
    logger.info(f'Environment info:\n{env_info}')
    logger.info(f'Distributed training: {distributed}, device: {cfg.device}')
    if train_corruptions:
        logger.info(f'--train-corruptions: {describe_corruptions(train_corruptions)}')
    if args.autoscale_lr:
        base_lr, world_size = cfg.optimizer.lr, get_dist_info()[1]
        cfg.optimizer.lr = linear_scaled_lr(base_lr, world_size)
        logger.info(f'--autoscale-lr: lr {base_lr} x {world_size} processes / {REFERENCE_GPUS} = {cfg.optimizer.lr}')

    seed = init_random_seed(args.seed, device=cfg.device)
    set_random_seed(seed, deterministic=args.deterministic)
    cfg.seed = seed
    config_text = cfg.pretty_text  # formatted by yapf, which takes seconds: once for the dump, the log and the meta
    with open(osp.join(cfg.work_dir, osp.basename(args.config)), 'w', encoding='utf-8') as file:
        file.write(config_text)
    logger.info(f'Config:\n{config_text}')
    logger.info(f'Set random seed to {seed}, deterministic: {args.deterministic}')
    meta = dict(env_info=env_info, config=config_text, seed=seed, exp_name=osp.basename(args.config))

    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    logger.info(f'Model:\n{model}')
    datasets = [build_dataset(cfg.data.train)]
    if len(cfg.workflow) == 2:
        val_dataset = copy.deepcopy(cfg.data.val)
        val_dataset.pipeline = cfg.data.train.get('dataset', cfg.data.train).pipeline
        datasets.append(build_dataset(val_dataset))
    cfg.checkpoint_config.meta = dict(mmdet_version=mmdet_version, mmdet3d_version=mmdet3d_version,
                                      CLASSES=datasets[0].CLASSES)
    model.CLASSES = datasets[0].CLASSES
    train_detector(model, datasets, cfg, distributed=distributed, validate=not args.no_validate,
                   timestamp=timestamp, meta=meta)


if __name__ == '__main__':
    main()
