"""DeviceOpCounter: the ops that would launch device work, counted on fake CUDA tensors."""
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from projects.mmdet3d_plugin.utils.device_ops import TOTAL, DeviceOpCounter
from projects.mmdet3d_plugin.utils.host_data import host_to_device


def test_kernels_count_views_and_allocations_do_not_and_host_copies_count_apart():
    counter = DeviceOpCounter('cuda')
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.ones(4, 6, device='cuda')  # made before the counter
        with counter:
            y = x.view(6, 4).t().unsqueeze(0).expand(2, 4, 6)  # views: no kernel
            torch.ops.aten._unsafe_view(x, (24,))  # a view its schema does not mark (reshape's)
            torch.empty(3, device='cuda')  # an allocation: no kernel
            z = (y + 1).sum()  # two kernels
            z.mul_(2)  # one in place
            host_to_device([1.0, 2.0], x.device)  # a copy of host data
            torch.ones(3).mul(2)  # CPU work: not the device's
    assert counter.ops[TOTAL] == 3
    assert counter.op_names == {'aten::add': 1, 'aten::sum': 1, 'aten::mul_': 1}
    assert counter.host_copies[TOTAL] == 1


def test_parts_nest_and_module_hooks_name_their_forwards():
    counter = DeviceOpCounter('cuda')
    inner, outer = nn.Linear(4, 4), nn.Sequential()
    outer.add_module('inner', inner)
    counter.hook('outer', outer)
    counter.hook('inner', inner)
    with FakeTensorMode(allow_non_fake_inputs=True):
        outer.to('cuda')
        x = torch.ones(2, 4, device='cuda')
        with counter:
            outer(x)  # addmm
            with counter.part('extra'):
                x.exp()
            x.neg()
    assert counter.ops == {TOTAL: 3, 'outer': 1, 'inner': 1, 'extra': 1}
