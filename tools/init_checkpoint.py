"""Save the randomly initialised weights of a config's model as a checkpoint.

    python tools/init_checkpoint.py CONFIG OUT.pth [--seed 0] [--cfg-options k=v ...]

The checkpoint is what training starts from (``init_weights()`` after seeding),
so ``tools/test.py CONFIG OUT.pth --eval bbox`` measures an *untrained* model:
the baseline ``make demo`` compares the trained model against.
"""
import argparse
import logging
import os.path as osp

from mmcv.runner import save_checkpoint
from mmdet.apis import set_random_seed
from mmdet3d.models import build_model

from projects.mmdet3d_plugin.mmcv_custom.launch import load_config
from tools.cli.launch import add_common_arguments


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Save a randomly initialised model as a checkpoint')
    parser.add_argument('config', help='model config file path')
    parser.add_argument('out', help='checkpoint file to write')
    add_common_arguments(parser)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    out_dir = osp.dirname(osp.abspath(args.out))
    if not osp.isdir(out_dir):
        raise FileNotFoundError(f'the folder of {args.out} does not exist')
    cfg = load_config(args)
    set_random_seed(args.seed, deterministic=args.deterministic)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    logging.getLogger('mmcv').setLevel(logging.WARNING)  # not the per-parameter initialisation report
    model.init_weights()
    classes = cfg.get('class_names')
    meta = dict(config=cfg.text, seed=args.seed, epoch=0, iter=0)
    if classes is not None:
        meta['CLASSES'] = list(classes)
    save_checkpoint(model, args.out, meta=meta)
    num_params = sum(p.numel() for p in model.parameters())
    print(f'saved the untrained {cfg.model.type} ({num_params / 1e6:.2f} M parameters, seed {args.seed}) '
          f'to {args.out}')


if __name__ == '__main__':
    main()
