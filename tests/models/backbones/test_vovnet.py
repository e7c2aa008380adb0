"""VoVNet: output strides and channels, frozen stages and BatchNorm eval mode, activation checkpointing."""
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


def _saved_bytes_and_grads(model, images):
    """Bytes autograd keeps for the backward of one forward, and the parameters' gradients."""
    saved = []

    def keep(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        outs = model(images)
    sum(out.square().sum() for out in outs).backward()
    return sum(saved), outs, {name: param.grad.clone() for name, param in model.named_parameters()}


def test_checkpointing_keeps_outputs_and_gradients_and_saves_memory():
    torch.manual_seed(0)
    plain = _vovnet().train()
    checkpointed = _vovnet(with_cp=True).train()
    checkpointed.load_state_dict(plain.state_dict())
    images = torch.randn(1, 3, 64, 96)
    plain_bytes, plain_outs, plain_grads = _saved_bytes_and_grads(plain, images)
    cp_bytes, cp_outs, cp_grads = _saved_bytes_and_grads(checkpointed, images)
    for plain_out, cp_out in zip(plain_outs, cp_outs):
        torch.testing.assert_close(cp_out, plain_out)
    assert cp_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(cp_grads[name], grad, msg=name)
    assert cp_bytes < plain_bytes / 2


def test_bad_arguments_raise():
    with pytest.raises(KeyError, match='V-98'):
        _vovnet(spec_name='V-98')
    with pytest.raises(ValueError, match='out_features'):
        _vovnet(out_features=('stage6', ))
