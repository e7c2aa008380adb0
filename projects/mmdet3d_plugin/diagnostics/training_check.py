"""The training check of ``tools/check_gpu.py``: the demo model's real training iteration, on any device.

``steps`` iterations of the demo model (``configs/demo/cmt_aqr_synthetic_tiny.py``)
built as mmdet's ``train_detector`` builds it: the detector's own
``train_step`` (forward, losses, Hungarian matching), then the update of
mmcv's ``OptimizerHook`` (:class:`.optimizer_step.OptimizerStep`: zero_grad,
backward, the config's gradient clipping, the config's optimizer step), on
random batches whose number of ground-truth boxes, and so the number of DN
queries, changes every step. On CUDA the whole iteration runs under
``torch.cuda.set_sync_debug_mode('error')``: every host synchronisation
raises, except inside the regions that must wait (``permitted_host_sync``:
voxelization, whose sizes are data, and the loss's Hungarian matching on the
host), and on every device the forward and backward must run no op that would
wait on CUDA (:func:`run_train_step`: the CPU test of the same rule). The log
variables are read once per step, outside that region, in one transfer
(:func:`log_values`).

Each step that raises is reported with its traceback (for a synchronisation,
the traceback shows where it is; for one in a backward, anomaly detection's
trace of the forward line that made the node follows) and recorded as a
failure; the other steps still run. The check also fails on a non-finite loss, on anything compiled
(``auto`` never runs a compiled path), on flex_attention run eagerly and, with ``attention_dtype`` named,
on a cross-attention that ran in another dtype; it prints the kernels and dtypes the cross-attention ran
(the default ``'auto'``: float16 on CUDA, as upstream CMT).
"""
import contextlib
import logging
import traceback
import warnings
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from mmcv import Config
from torch import Tensor, nn

from ..attention.dispatch import recorded_backends
from ..attention.precision import ATTENTION_DTYPES
from ..mmcv_custom.device_log import read_scalars
from ..models.utils.petr_attention import set_attention_dtype
from ..utils.host_data import SyncingOpRecorder
from .optimizer_step import OptimizerStep
from ..utils.repo_paths import repo_path
from .synthetic_batch import random_demo_batch

DEMO_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny.py'
EAGER_FLEX_WARNING = 'flex_attention called without torch.compile'


@contextlib.contextmanager
def host_syncs_are_errors(device: str) -> Iterator[None]:
    """On CUDA, make every host synchronisation outside ``permitted_host_sync`` blocks raise (sync-debug mode)."""
    if device != 'cuda':
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode('error')
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def step_box_counts(step: int) -> Tuple[int, int]:
    """Ground-truth boxes of the two samples of step ``step`` (the DN queries follow the largest count)."""
    return 1 + step % 7, 1 + (3 * step) % 5


def build_demo_training(device: str,
                        attention_dtype: Optional[str] = None) -> Tuple[nn.Module, OptimizerStep, Config]:
    """The demo model (seed 0, ``init_weights``, training mode) on ``device``, its :class:`OptimizerStep` and config,
    as ``train_detector`` builds them; ``attention_dtype`` (optional) set on every cross-attention."""
    from mmdet3d.models import build_model

    cfg = Config.fromfile(repo_path(DEMO_CONFIG))
    logging.getLogger('mmcv').setLevel(logging.WARNING)  # init_weights lists every parameter at INFO
    torch.manual_seed(0)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    if attention_dtype is not None:
        set_attention_dtype(model, attention_dtype)
    if hasattr(model, 'keep_log_vars_on_device'):  # as train_detector: log variables stay device tensors
        model.keep_log_vars_on_device = True
    model.to(device).train()
    return model, OptimizerStep(model, cfg), cfg


def log_values(log_vars: Dict[str, object], grad_norm: Optional[Tensor]) -> Dict[str, float]:
    """The log variables (device tensors or numbers) and the gradient norm (``grad_norm``) as floats: the tensors
    come to the host in one transfer."""
    tensors = {name: value for name, value in log_vars.items() if isinstance(value, Tensor)}
    if grad_norm is not None:
        tensors['grad_norm'] = grad_norm
    values = {name: float(value) for name, value in log_vars.items() if name not in tensors}
    values.update(read_scalars(tensors))
    return values


class SyncingOpsError(RuntimeError):
    """The forward or backward of a training step ran ops that make the host wait on CUDA."""


def run_train_step(model: nn.Module, update: OptimizerStep, batch: dict, device: str) -> Dict[str, float]:
    """One training iteration as mmcv's runner and ``OptimizerHook`` run it; its log values (:func:`log_values`,
    read after the iteration).

    On CUDA every host synchronisation outside ``permitted_host_sync`` raises
    (sync-debug mode); on any device, the forward and the backward run under
    :class:`SyncingOpRecorder`, and :class:`SyncingOpsError` lists the ops it
    saw: on the CPU (CI) this is what catches a syncing op before a GPU
    does. (The optimizer step is left to the sync-debug mode: AdamW reads its
    step counts, host tensors on CUDA, with ``.item()``.) Anomaly detection
    (without its NaN checks, which would wait) gives each op of the backward
    the forward line that made it.
    """
    with host_syncs_are_errors(device), torch.autograd.set_detect_anomaly(True, check_nan=False):
        with SyncingOpRecorder(device) as recorder:
            outputs = model.train_step(batch, None)
            update.backward(outputs['loss'])
        if recorder.ops:
            raise SyncingOpsError(f'{len(recorder.ops)} ops that wait for the device on CUDA ran outside '
                                  'permitted_host_sync:\n  ' + '\n  '.join(sorted(set(recorder.ops))))
        grad_norm = update.step()
    return log_values(outputs['log_vars'], grad_norm)


def _describe(step: int, error: BaseException) -> str:
    if 'synchroniz' in str(error):
        return f'training: a host synchronisation outside the permitted regions (step {step}): {error}'
    if isinstance(error, SyncingOpsError):
        return f'training: step {step}: {str(error).splitlines()[0]}'
    return f'training: step {step} failed: {type(error).__name__}: {error}'


def _forward_traces(caught: List[warnings.WarningMessage]) -> str:
    """The forward traces anomaly detection reported (a backward that raised: the line that made its node)."""
    return ''.join(f'\n{warning.message}' for warning in caught if 'Traceback of forward call' in str(warning.message))


def check_training(device: str, steps: int, attention_dtype: Optional[str] = None) -> List[str]:
    """``steps`` training iterations of the demo model, its cross-attention in ``attention_dtype`` (default: the
    config's, ``'auto'``); prints a summary line; the failures (see the module doc)."""
    from torch._dynamo.utils import counters

    model, update, cfg = build_demo_training(device, attention_dtype)
    generator = torch.Generator().manual_seed(0)
    counters.clear()
    failures, box_counts, losses = [], [], []
    inexact_rows = 0.0
    with warnings.catch_warnings(record=True) as caught, recorded_backends() as kernels:
        warnings.simplefilter('always')
        for step in range(steps):
            num_boxes = step_box_counts(step)
            box_counts.append(max(num_boxes))
            batch = random_demo_batch(cfg, num_boxes, device, generator)
            recorded = len(caught)
            try:
                values = run_train_step(model, update, batch, device)
            except Exception as error:  # this step fails; the others still run
                print(f'training step {step} raised:\n{traceback.format_exc()}{_forward_traces(caught[recorded:])}',
                      flush=True)
                failures.append(_describe(step, error))
                continue
            losses.append(values['loss'])
            inexact_rows += values.get('segment_inexact_rows', 0.0)
    graphs = counters['stats']['unique_graphs']
    eager_flex = [str(w.message) for w in caught if EAGER_FLEX_WARNING in str(w.message)
                  or 'materializes' in str(w.message)]
    failed = f' ({len(failures)} failed)' if failures else ''
    loss = f'{losses[0]:.3f} -> {losses[-1]:.3f}' if losses else 'n/a (no step finished)'
    print(f'demo model training: {steps} iterations{failed}, ground-truth boxes per batch {sorted(set(box_counts))} '
          f'(DN query count changes), loss {loss}, {graphs} compiled graphs, '
          f'{len(eager_flex)} eager-flex warnings, {inexact_rows:.0f} attention rows left inexact by segment\'s '
          f'recomputation budget, cross-attention {", ".join(sorted(" ".join(key) for key in kernels)) or "none"}, '
          f'ops that would wait on CUDA errors{" (and every host synchronisation)" if device == "cuda" else ""}')
    if not all(torch.isfinite(torch.tensor(losses))):
        failures.append(f'training: non-finite loss {losses}')
    if not losses and not failures:
        failures.append('training: no training step ran')
    if graphs:
        failures.append(f'training: {graphs} graphs compiled (auto must not run a compiled path)')
    if eager_flex:
        failures.append(f'training: eager flex_attention ran: {eager_flex[0]}')
    dtypes = sorted({dtype for _, dtype in kernels})
    if ATTENTION_DTYPES.get(attention_dtype) is not None and dtypes != [attention_dtype]:
        failures.append(f'training: the cross-attention ran in {dtypes}, not {attention_dtype}')
    return failures
