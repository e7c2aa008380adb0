from torch import nn

from projects.mmdet3d_plugin.models.utils.zero_through_parameters import zero_through_parameters


def test_every_trainable_parameter_gets_a_zero_gradient_and_frozen_ones_none():
    trained, frozen = nn.Linear(3, 2), nn.Conv1d(2, 2, 1)
    frozen.requires_grad_(False)
    zero = zero_through_parameters(trained, frozen)
    assert zero.shape == () and zero.item() == 0
    zero.backward()
    assert all(p.grad is not None and not p.grad.any() for p in trained.parameters())
    assert all(p.grad is None for p in frozen.parameters())


def test_modules_without_trainable_parameters_give_a_plain_zero():
    zero = zero_through_parameters(nn.ReLU())
    assert zero.shape == () and zero.item() == 0 and not zero.requires_grad
