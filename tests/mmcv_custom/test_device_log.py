"""Training-log values read once per logging interval (``mmcv_custom/device_log.py``)."""
from types import SimpleNamespace

import pytest
import torch
from mmcv.runner import LogBuffer
from mmdet.models.detectors.base import BaseDetector

from projects.mmdet3d_plugin.mmcv_custom.device_log import (DeviceLogBuffer, DeviceLogOptimizerHook,
                                                            parse_losses_on_device, read_scalars)


def _losses(weight):
    return dict(loss_cls=weight * 2.0, loss_bbox=[weight * 0.5, (weight * torch.tensor([1.0, 3.0])).mean()],
                num_samples=torch.tensor(2.0))


def test_parse_losses_equals_mmdets_and_keeps_the_values_on_the_device():
    weight = torch.tensor(1.5, requires_grad=True)
    loss, log_vars = parse_losses_on_device(_losses(weight))
    expected_loss, expected = BaseDetector._parse_losses(None, _losses(weight))
    assert list(log_vars) == list(expected) == ['loss_cls', 'loss_bbox', 'num_samples', 'loss']
    assert all(isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad
               for value in log_vars.values())
    assert [float(value) for value in log_vars.values()] == pytest.approx(list(expected.values()))
    assert float(loss.detach()) == pytest.approx(float(expected_loss))
    loss.backward()
    assert weight.grad is not None and float(weight.grad) == pytest.approx(2.0 + 0.5 + 2.0)


def test_parse_losses_refuses_what_it_cannot_log():
    with pytest.raises(TypeError, match="loss 'loss_cls' is a float"):
        parse_losses_on_device(dict(loss_cls=1.0))


def test_buffer_reads_device_values_in_one_transfer_when_averaging(monkeypatch):
    buffer, plain = DeviceLogBuffer(), LogBuffer()
    for step in range(4):
        values = dict(loss=torch.tensor(float(step)), grad_norm=torch.tensor(10.0 + step))
        buffer.update(values, count=2)
        plain.update({key: float(value) for key, value in values.items()}, count=2)
    assert all(isinstance(value, torch.Tensor) for value in buffer.val_history['loss']), 'nothing read before'
    stacks = []
    stack = torch.stack
    monkeypatch.setattr(torch, 'stack', lambda tensors, *args, **kwargs: stacks.append(len(tensors)) or
                        stack(tensors, *args, **kwargs))
    buffer.average(3)
    plain.average(3)
    assert stacks == [8], 'one stacked copy of every value buffered since the last read'
    assert buffer.output == pytest.approx(plain.output)
    buffer.update(dict(loss=torch.tensor(4.0)))
    buffer.average(1)
    assert stacks == [8, 1] and buffer.output['loss'] == 4.0
    buffer.clear()
    buffer.average()
    assert stacks == [8, 1] and buffer.output == {}


@pytest.mark.parametrize('buffer_type', [DeviceLogBuffer, LogBuffer])
def test_optimizer_hook_steps_and_logs_the_gradient_norm_for_its_buffer(buffer_type):
    model = torch.nn.Linear(3, 1)
    before = model.weight.detach().clone()
    loss = model(torch.ones(2, 3)).sum() * 100
    runner = SimpleNamespace(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                             outputs=dict(loss=loss, num_samples=2), log_buffer=buffer_type())
    DeviceLogOptimizerHook(grad_clip=dict(max_norm=1.0, norm_type=2)).after_train_iter(runner)
    logged = runner.log_buffer.val_history['grad_norm'][0]
    assert isinstance(logged, torch.Tensor if buffer_type is DeviceLogBuffer else float)
    assert float(logged) == pytest.approx(400.0, rel=1e-5)  # 200 per weight and for the bias: sqrt(4) * 200
    step = (model.weight.detach() - before).norm()
    assert 0 < float(step) <= 0.1 + 1e-6, 'clipped to norm 1 before the step'


def test_read_scalars_keeps_keys_and_order_and_reads_exact_float32_values():
    values = {('b', 1): torch.tensor(0.1), 'a': torch.tensor([2.5]), 'c': torch.tensor(3, dtype=torch.int64)}
    read = read_scalars(values)
    assert list(read) == list(values) and all(isinstance(value, float) for value in read.values())
    assert read == {('b', 1): float(torch.tensor(0.1)), 'a': 2.5, 'c': 3.0}
    counts = read_scalars({'num_samples': torch.tensor(3)})
    assert counts == {'num_samples': 3.0} and isinstance(counts['num_samples'], float), 'integer counts log as floats'
    assert read_scalars({}) == {}
