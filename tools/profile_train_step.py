"""Where a training iteration's time goes: data loading, each module of CMT(-AQR), matching, backward, optimizer.

    python tools/profile_train_step.py CONFIG [--iters 10] [--warmup 2] [--workers N] [--cfg-options k=v ...]

Builds the config's training set and model as ``tools/train.py`` does (CPU),
runs ``--warmup`` + ``--iters`` iterations (AdamW step included) and prints a
Markdown table: mean seconds per iteration of each part and its share of the
iteration. Module rows are forward times measured with forward hooks (nested
rows — the AQR modules and the transformer inside the head — are part of
their parent's time); ``loss`` includes the Hungarian matching
(``assigner``); ``data`` is the time spent waiting for the next batch.
"""
import argparse
import logging
import os.path as osp
import sys
import time
from collections import defaultdict
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from mmcv import Config, DictAction
from torch import nn

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from projects.mmdet3d_plugin.apis.model_benchmark import MODULE_ROWS as MODULES  # noqa: E402


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Profile the training iteration of a config (CPU)')
    parser.add_argument('config')
    parser.add_argument('--iters', type=int, default=10, help='timed iterations')
    parser.add_argument('--warmup', type=int, default=2, help='untimed iterations first')
    parser.add_argument('--workers', type=int, help="data loader workers (default: the config's)")
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config settings')
    return parser.parse_args(argv)


def _submodule(model: nn.Module, path: str) -> Optional[nn.Module]:
    for name in path.split('.'):
        model = getattr(model, name, None)
        if model is None:
            return None
    return model if isinstance(model, nn.Module) else None


class StepTimer:
    """Accumulates wall time per named part: module forwards (hooks) and wrapped callables."""

    def __init__(self) -> None:
        self.totals: Dict[str, float] = defaultdict(float)
        self._starts: Dict[str, float] = {}

    def hook_module(self, name: str, module: nn.Module) -> None:
        def start(*_):
            self._starts[name] = time.perf_counter()

        def stop(*_):
            self.totals[name] += time.perf_counter() - self._starts.pop(name)

        module.register_forward_pre_hook(start)
        module.register_forward_hook(stop)

    def wrap(self, name: str, function: Callable) -> Callable:
        def timed(*args, **kwargs):
            begin = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.totals[name] += time.perf_counter() - begin

        return timed

    def measure(self, name: str, function: Callable, *args):
        return self.wrap(name, function)(*args)


def build(args: argparse.Namespace) -> Tuple[nn.Module, torch.utils.data.DataLoader, Config]:
    """The model and the training data loader of the config, built as tools/train.py does."""
    from mmdet3d.datasets import build_dataset
    from mmdet3d.models import build_model
    from mmdet.apis import set_random_seed
    from mmdet.datasets import build_dataloader

    import projects.mmdet3d_plugin  # noqa: F401
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    set_random_seed(args.seed)
    logging.getLogger('mmcv').setLevel(logging.WARNING)  # init_weights lists every parameter at INFO
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    workers = cfg.data.workers_per_gpu if args.workers is None else args.workers
    loader = build_dataloader(build_dataset(cfg.data.train), cfg.data.samples_per_gpu, workers, num_gpus=1,
                              dist=False, seed=args.seed, shuffle=True)
    return model, loader, cfg


def _endless(loader: Iterable) -> Iterator:
    """The loader's batches, epoch after epoch (small sets have fewer batches than the iterations asked for)."""
    while True:
        yield from loader


def profile(args: argparse.Namespace) -> Tuple[Dict[str, float], int]:
    """Mean seconds per iteration of every part, and the batch size."""
    from projects.mmdet3d_plugin.mmcv_custom.parallel import wrap_model
    model, loader, cfg = build(args)
    timer = StepTimer()
    for name, path in MODULES:
        module = _submodule(model, path)
        if module is not None:
            timer.hook_module(name, module)
    head = model.pts_bbox_head
    head.loss = timer.wrap('loss (matching included)', head.loss)
    if getattr(head, 'assigner', None) is not None:
        head.assigner.assign = timer.wrap('  assigner', head.assigner.assign)
    wrapped = wrap_model(model.train(), 'cpu', distributed=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.get('lr', 1e-4))
    batches = _endless(loader)
    for step in range(args.warmup + args.iters):
        if step == args.warmup:
            timer.totals.clear()
            start = time.perf_counter()
        data = timer.measure('data', next, batches)
        outputs = timer.measure('forward', wrapped.train_step, data, None)
        optimizer.zero_grad()
        timer.measure('backward', outputs['loss'].backward)
        timer.measure('optimizer step', optimizer.step)
        print(f'iteration {step + 1}/{args.warmup + args.iters}: loss {float(outputs["loss"]):.3f}', flush=True)
    total = time.perf_counter() - start
    means = {name: seconds / args.iters for name, seconds in timer.totals.items()}
    means['iteration'] = total / args.iters
    return means, cfg.data.samples_per_gpu


def format_table(means: Dict[str, float], batch_size: int) -> str:
    """Markdown table of the parts in data-flow order, with their share of the iteration."""
    order: List[str] = ['data'] + [name for name, _ in MODULES] + [
        'loss (matching included)', '  assigner', 'forward', 'backward', 'optimizer step', 'iteration']
    lines = [f'| part (batch {batch_size}) | s / iteration | share |', '|---|---:|---:|']
    for name in order:
        if name in means:
            share = means[name] / means['iteration']
            lines.append(f'| {name} | {means[name]:.3f} | {share:.0%} |')
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    args = parse_args(argv)
    if args.iters < 1:
        raise SystemExit('--iters must be >= 1')
    means, batch_size = profile(args)
    print(f'\n{args.config}: {args.iters} iterations after {args.warmup} warm-up, '
          f'{torch.get_num_threads()} torch threads\n')
    print(format_table(means, batch_size))
    return means


if __name__ == '__main__':
    main()
