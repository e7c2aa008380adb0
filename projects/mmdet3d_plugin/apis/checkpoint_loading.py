"""Loading a detector checkpoint (``load_from``, ``tools/test.py``) with a report a user can act on.

A CMT checkpoint loads into CMT-AQR with only AQR's parameters missing (:func:`routing_parameter_prefixes`);
the report says so in one line and names every other missing or unexpected key by module. A checkpoint of
another config (a VoV checkpoint into an R50 config) is refused before anything is copied, with the tensors
whose shapes differ; a missing file is refused with its path. Files in mmcv's layout (``meta`` /
``state_dict`` / ``optimizer``, as upstream CMT's training writes them) and bare state dicts both load; the
module versions saved with the state dict (``_metadata``) reach the modules, so spconv weights keep the
layout their version says.
"""
import os.path as osp
from collections import Counter, OrderedDict
from logging import Logger
from typing import Dict, List, Mapping, Optional, Sequence

from mmcv.parallel import is_module_wrapper
from mmcv.runner import _load_checkpoint
from mmcv.utils import print_log
from torch import nn

from ..models.dense_heads.query_router import QueryRouter

#: Keys listed by name in a report before the rest are counted.
SHOWN_KEYS = 10


def routing_parameter_prefixes(model: nn.Module) -> List[str]:
    """The module names under which ``model`` keeps AQR's parameters (empty for plain CMT)."""
    prefixes = []
    for name, module in model.named_modules():
        router = getattr(module, 'router', None)
        if isinstance(router, QueryRouter):
            prefixes += [f'{name}.{part}' if name else part for part, sub in router.modules.items() if sub is not None]
    return prefixes


def _by_module(keys: Sequence[str]) -> str:
    """``'pts_bbox_head.aqr_weight_generator (20), ...'``: keys counted by their first two name parts."""
    counts = Counter('.'.join(key.split('.')[:2]) for key in keys)
    return ', '.join(f'{module} ({count})' for module, count in sorted(counts.items()))


def _under(key: str, prefixes: Sequence[str]) -> bool:
    return any(key.startswith(prefix + '.') for prefix in prefixes)


def checkpoint_state_dict(checkpoint: Mapping, filename: str) -> 'OrderedDict':
    """The state dict of a loaded checkpoint file (mmcv's ``state_dict`` entry, or the file itself), without a
    ``module.`` prefix, its ``_metadata`` (module versions) kept."""
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f'{filename}: not a checkpoint (a {type(checkpoint).__name__}, expected a dict)')
    def unwrapped(entries: Mapping) -> 'OrderedDict':
        return OrderedDict((key[len('module.'):] if key.startswith('module.') else key, value)
                           for key, value in entries.items())

    state = checkpoint.get('state_dict', checkpoint)
    metadata = getattr(state, '_metadata', None)
    state = unwrapped(state)
    if metadata is not None:
        state._metadata = unwrapped(metadata)
    return state


def load_detector_checkpoint(model: nn.Module, filename: str, logger: Optional[Logger] = None,
                             purpose: str = 'checkpoint') -> Dict:
    """Copy the weights of ``filename`` into ``model`` and report what did not match.

    Args:
        model (nn.Module): the detector, possibly wrapped (``MMDataParallel``, DDP).
        filename (str): a local file, or any address mmcv's ``CheckpointLoader`` reads (``http://``, ...).
        logger (Logger, optional): where the report goes (printed without one).
        purpose (str): how the report names the file (``'load_from'``, ``'checkpoint'``).

    Returns:
        dict: the loaded checkpoint (``meta`` and all).

    Raises:
        FileNotFoundError: a local ``filename`` that does not exist.
        ValueError: the checkpoint has tensors whose shapes differ from the model's (another config).
    """
    if '://' not in filename and not osp.isfile(filename):
        raise FileNotFoundError(f'{purpose}: no checkpoint file at {filename!r} (give an existing file, e.g. '
                                f'--cfg-options load_from=work_dirs/<config>/latest.pth)')
    module = model.module if is_module_wrapper(model) else model
    checkpoint = _load_checkpoint(filename, map_location='cpu')
    state = checkpoint_state_dict(checkpoint, filename)
    own = module.state_dict()
    mismatched = [f'{key}: checkpoint {tuple(value.shape)}, model {tuple(own[key].shape)}'
                  for key, value in state.items() if key in own and tuple(value.shape) != tuple(own[key].shape)]
    if mismatched:
        raise ValueError(f'{purpose} {filename}: {len(mismatched)} tensors differ in shape from the model\'s (a '
                         f'checkpoint of another config?): ' + '; '.join(mismatched[:SHOWN_KEYS])
                         + (f'; ... and {len(mismatched) - SHOWN_KEYS} more' if len(mismatched) > SHOWN_KEYS else ''))
    result = module.load_state_dict(state, strict=False)
    routing = routing_parameter_prefixes(module)
    missing_routing = [key for key in result.missing_keys if _under(key, routing)]
    missing_other = [key for key in result.missing_keys if not _under(key, routing)]
    if missing_routing:
        print_log(f'{purpose} {filename}: {len(missing_routing)} AQR parameters are not in the checkpoint (a CMT '
                  f'checkpoint) and keep their initialisation: {_by_module(missing_routing)}',
                  logger=logger)
    if missing_other:
        print_log(f'{purpose} {filename}: {len(missing_other)} parameters and buffers of the model are not in the '
                  f'checkpoint and keep their initialisation: {_by_module(missing_other)}; first: '
                  f'{missing_other[:SHOWN_KEYS]}', logger=logger, level=30)
    if result.unexpected_keys:
        print_log(f'{purpose} {filename}: {len(result.unexpected_keys)} tensors of the checkpoint are not in the model '
                  f'and were ignored: {_by_module(result.unexpected_keys)}; first: '
                  f'{result.unexpected_keys[:SHOWN_KEYS]}', logger=logger, level=30)
    if not result.missing_keys and not result.unexpected_keys:
        print_log(f'{purpose} {filename}: every parameter and buffer loaded', logger=logger)
    return checkpoint
