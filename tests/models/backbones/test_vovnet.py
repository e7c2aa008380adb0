"""VoVNet: output strides and channels, frozen stages and BatchNorm eval mode."""
import pytest
import torch
from mmdet.models.builder import build_backbone
from torch.nn.modules.batchnorm import _BatchNorm

import projects.mmdet3d_plugin  # noqa: F401


def _vovnet(**kwargs):
    cfg = dict(type='VoVNet', spec_name='V-19-eSE', out_features=('stem', 'stage4', 'stage5'))
    cfg.update(kwargs)
    return build_backbone(cfg)


def test_output_strides_and_channels():
    outs = _vovnet().eval()(torch.randn(1, 3, 64, 96))
    assert [tuple(o.shape) for o in outs] == [(1, 128, 16, 24), (1, 768, 4, 6), (1, 1024, 2, 3)]


def test_frozen_stages_and_norm_eval():
    model = _vovnet(frozen_stages=1, norm_eval=True).train()
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith(('stem.', 'stage2.')) for n in frozen)
    assert all(p.requires_grad for n, p in model.named_parameters() if n.startswith('stage3.'))
    assert all(not m.training for m in model.modules() if isinstance(m, _BatchNorm))
    trainable_bn = _vovnet(frozen_stages=-1, norm_eval=False).train()
    assert all(m.training for m in trainable_bn.modules() if isinstance(m, _BatchNorm))


def test_bad_arguments_raise():
    with pytest.raises(KeyError, match='V-98'):
        _vovnet(spec_name='V-98')
    with pytest.raises(ValueError, match='out_features'):
        _vovnet(out_features=('stage6', ))
