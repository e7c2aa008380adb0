"""Where a training iteration's time goes: data loading, each module of CMT(-AQR), matching, backward, optimizer
(``tools/profile_train_step.py``).

The config's training set and model are built as ``tools/train.py`` builds
them (CPU); ``warmup`` + ``iters`` iterations run (AdamW step included).
Module rows are forward times measured with forward hooks
(:class:`.part_timer.PartTimer`; nested rows, the AQR modules and the
transformer inside the head, are part of their parent's time); ``loss``
includes the Hungarian matching (``assigner``); ``data`` is the time spent
waiting for the next batch.
"""
import logging
import time
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torch
from mmcv import Config
from torch import nn

from .part_timer import LOSS_ROW, MODULE_ROWS, PartTimer, find_assigner

ASSIGNER_ROW = '  assigner'
#: the rows of the table, in data-flow order
ROWS: List[str] = (['data'] + [name for name, _ in MODULE_ROWS]
                   + [LOSS_ROW, ASSIGNER_ROW, 'forward', 'backward', 'optimizer step', 'iteration'])


def _submodule(model: nn.Module, path: str) -> Optional[nn.Module]:
    for name in path.split('.'):
        model = getattr(model, name, None)
        if model is None:
            return None
    return model if isinstance(model, nn.Module) else None


def build_training(config: str, seed: int, workers: Optional[int] = None,
                   cfg_options: Optional[dict] = None) -> Tuple[nn.Module, torch.utils.data.DataLoader, Config]:
    """The model and the training data loader of ``config``, built as tools/train.py does (``workers``: data
    loader workers, default the config's)."""
    from mmdet3d.datasets import build_dataset
    from mmdet3d.models import build_model
    from mmdet.apis import set_random_seed
    from mmdet.datasets import build_dataloader

    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    set_random_seed(seed)
    logging.getLogger('mmcv').setLevel(logging.WARNING)  # init_weights lists every parameter at INFO
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    workers = cfg.data.workers_per_gpu if workers is None else workers
    loader = build_dataloader(build_dataset(cfg.data.train), cfg.data.samples_per_gpu, workers, num_gpus=1,
                              dist=False, seed=seed, shuffle=True)
    return model, loader, cfg


def _endless(loader: Iterable) -> Iterator:
    """The loader's batches, epoch after epoch (small sets have fewer batches than the iterations asked for)."""
    while True:
        yield from loader


def profile_train_step(config: str, iters: int, warmup: int, seed: int = 0, workers: Optional[int] = None,
                       cfg_options: Optional[dict] = None) -> Tuple[Dict[str, float], int]:
    """Mean seconds per iteration of every part (keys of :data:`ROWS`), and the batch size.

    Prints a line per iteration with its loss.
    """
    from ..mmcv_custom.parallel import wrap_model
    model, loader, cfg = build_training(config, seed, workers, cfg_options)
    timer = PartTimer(torch.device('cpu'))
    for name, path in MODULE_ROWS:
        module = _submodule(model, path)
        if module is not None:
            timer.hook(name, module)
    head = model.pts_bbox_head
    head.loss = timer.wrap(LOSS_ROW, head.loss)
    assigner = find_assigner(head)
    if assigner is not None:
        assigner.assign = timer.wrap(ASSIGNER_ROW, assigner.assign)
    wrapped = wrap_model(model.train(), 'cpu', distributed=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.get('lr', 1e-4))
    batches = _endless(loader)
    forward = timer.wrap('forward', wrapped.train_step)
    backward = timer.wrap('backward', torch.Tensor.backward)
    step = timer.wrap('optimizer step', optimizer.step)
    for iteration in range(warmup + iters):
        if iteration == warmup:
            timer.collect()
            start = time.perf_counter()
        data = timer.wrap('data', next)(batches)
        outputs = forward(data, None)
        optimizer.zero_grad()
        backward(outputs['loss'])
        step()
        print(f'iteration {iteration + 1}/{warmup + iters}: loss {float(outputs["loss"]):.3f}', flush=True)
    total = time.perf_counter() - start
    means = {name: milliseconds / 1e3 / iters for name, milliseconds in timer.collect().items()}
    means['iteration'] = total / iters
    return means, cfg.data.samples_per_gpu


def format_table(means: Dict[str, float], batch_size: int) -> str:
    """Markdown table of the parts in data-flow order, with their share of the iteration."""
    lines = [f'| part (batch {batch_size}) | s / iteration | share |', '|---|---:|---:|']
    for name in ROWS:
        if name in means:
            share = means[name] / means['iteration']
            lines.append(f'| {name} | {means[name]:.3f} | {share:.0%} |')
    return '\n'.join(lines)
