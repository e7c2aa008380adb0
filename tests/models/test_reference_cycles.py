"""Training iterations leave no tensor that only a reference cycle keeps alive (issue 23).

A reference cycle through a tensor (e.g. an autograd ``ctx`` that keeps its
own output as an attribute: output -> grad_fn -> ctx -> output) is freed
only by Python's full garbage collection, which runs rarely: training memory
of the demo model grew by ~16 MB per iteration (on a GPU: CUDA memory) until
one ran. Some of those cycles were not even freed by ``gc.collect()``: the
collector sees the link from a tensor to its autograd node only while
neither has another (C++) owner, so the test also looks for survivors.

With automatic collection off, a few iterations (forward, loss, backward)
must leave (a) no tensor in the garbage that a collection finds
(``DEBUG_SAVEALL`` keeps it in ``gc.garbage``) and (b) no new tensor alive
after the collection.
"""
import gc
from typing import Callable, List

import pytest
import torch
from mmcv import Config
from mmdet3d.models import build_model

import projects.mmdet3d_plugin  # noqa: F401

DEMO_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny.py'
R50_CONFIG = 'cmt_aqr_voxel0100_r50_800x320_cbgs'
ITERATIONS = 2


def _build(cfg: Config) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


@pytest.fixture(scope='module', params=['demo', 'r50'])
def model(request, cmt_test_data):
    """The demo model (pillars, segment attention on its AQR bias) and the R50 fusion model at a reduced size."""
    if request.param == 'demo':
        return _build(Config.fromfile(DEMO_CONFIG))
    return _build(cmt_test_data['reduced_config'](R50_CONFIG))


def _train(model: torch.nn.Module, data: dict, train_step: Callable, iterations: int) -> None:
    for _ in range(iterations):
        train_step(model, data)
        model.zero_grad(set_to_none=True)


def _live_tensors() -> List[torch.Tensor]:
    return [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]


def _describe(tensor: torch.Tensor, holders: List[object] = ()) -> str:
    """Shape, dtype, autograd node and the types of ``holders`` that refer to the tensor."""
    grad_fn = type(tensor.grad_fn).__name__ if tensor.grad_fn is not None else None
    held_by = sorted({type(obj).__name__ for obj in gc.get_referrers(tensor) if any(obj is h for h in holders)})
    return f'{tuple(tensor.shape)} {tensor.dtype} grad_fn={grad_fn} held by {held_by}'


def test_training_iterations_leave_no_tensor_to_reference_cycles(model, cmt_test_data):
    torch.manual_seed(1)
    data = cmt_test_data['random_batch'](num_boxes=(4, 3))
    _train(model, data, cmt_test_data['train_step'], 1)  # warm-up: whatever is built once and then kept
    gc.collect()
    before = _live_tensors()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        _train(model, data, cmt_test_data['train_step'], ITERATIONS)
        gc.collect()
        garbage = list(gc.garbage)
        in_cycles = [_describe(obj, garbage) for obj in garbage if isinstance(obj, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    del garbage
    gc.collect()
    known = {id(tensor) for tensor in before}
    survivors = [_describe(tensor) for tensor in _live_tensors() if id(tensor) not in known]
    assert in_cycles == [], f'{len(in_cycles)} tensors freed only by a full garbage collection'
    assert survivors == [], f'{len(survivors)} tensors outlive the iterations and a full garbage collection'
