"""SeparateTaskHead: one group per decoder layer, upstream shapes, classification bias init."""
import pytest
import torch
from mmdet.models.builder import build_head

import projects.mmdet3d_plugin  # noqa: F401

HEADS = dict(center=(2, 2), vel=(2, 3), cls_logits=(4, 2))


def _head(final_kernel=1, groups=3):
    head = build_head(dict(type='SeparateTaskHead', in_channels=8, heads=HEADS, groups=groups, head_conv=6,
                           final_kernel=final_kernel, init_bias=-2.19))
    head.init_weights()
    return head


def test_shapes_and_parameter_layout():
    head = _head(final_kernel=3)
    shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert shapes['center.0.weight'] == (18, 8, 3)  # grouped conv: groups * head_conv, in_channels, k
    assert shapes['center.1.weight'] == (18, )  # GroupLayerNorm1d
    assert shapes['center.3.weight'] == (6, 6, 3) and shapes['center.3.bias'] == (6, )
    assert shapes['vel.3.weight'] == (18, 6, 3) and shapes['vel.6.weight'] == (6, 6, 3)
    out = head(torch.randn(3, 2, 7, 8))
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        'center': (3, 2, 7, 2), 'vel': (3, 2, 7, 2), 'cls_logits': (3, 2, 7, 4)}
    assert torch.all(head.cls_logits[-1].bias == -2.19)


def test_each_decoder_layer_only_sees_its_own_features():
    head = _head().eval()
    x = torch.randn(3, 2, 5, 8)
    changed = x.clone()
    changed[1] += 5.0
    out, out_changed = head(x), head(changed)
    for name in HEADS:
        torch.testing.assert_close(out[name][0], out_changed[name][0])
        torch.testing.assert_close(out[name][2], out_changed[name][2])
        assert not torch.allclose(out[name][1], out_changed[name][1])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match='decoder layers'):
        _head(groups=3)(torch.randn(2, 1, 5, 8))
    with pytest.raises(ValueError, match='odd'):
        _head(final_kernel=2)


def test_init_cfg_initialises_the_convs_and_the_prior_still_wins():
    head = build_head(dict(type='SeparateTaskHead', in_channels=8, heads=HEADS, head_conv=6, init_bias=-4.0,
                           init_cfg=dict(type='Constant', layer='Conv1d', val=0.5, bias=0.25)))
    head.init_weights()
    assert torch.all(head.center[0].weight == 0.5) and torch.all(head.center[-1].bias == 0.25)
    assert torch.all(head.cls_logits[-1].bias == -4.0)


def test_default_init_keeps_the_regression_outputs_small():
    """Offsets of centres / log-sizes start near 0, so the centre sigmoid is not saturated at the start."""
    torch.manual_seed(0)
    head = build_head(dict(type='SeparateTaskHead', in_channels=128, heads=HEADS, groups=1))
    head.init_weights()
    out = head(torch.randn(1, 1, 200, 128))
    assert out['center'].std() < 1.0 and out['vel'].std() < 1.0
