"""CPFPN: FPN top-down path with a 3x3 output conv on the finest level only."""
import torch
import torch.nn.functional as F
from mmdet.models.builder import build_neck

import projects.mmdet3d_plugin  # noqa: F401


def test_outputs_follow_the_fpn_top_down_path():
    neck = build_neck(dict(type='CPFPN', in_channels=[8, 16], out_channels=4, num_outs=3))
    neck.init_weights()
    assert len(neck.fpn_convs) == 1
    fine, coarse = torch.randn(2, 8, 6, 10), torch.randn(2, 16, 3, 5)
    outs = neck([fine, coarse])
    assert [tuple(o.shape) for o in outs] == [(2, 4, 6, 10), (2, 4, 3, 5), (2, 4, 2, 3)]
    lateral_coarse = neck.lateral_convs[1](coarse)
    torch.testing.assert_close(outs[1], lateral_coarse)
    top_down = neck.lateral_convs[0](fine) + F.interpolate(lateral_coarse, size=(6, 10), mode='nearest')
    torch.testing.assert_close(outs[0], neck.fpn_convs[0](top_down))
    torch.testing.assert_close(outs[2], F.max_pool2d(outs[1], 1, stride=2))
