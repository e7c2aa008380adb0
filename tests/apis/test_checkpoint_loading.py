"""apis/checkpoint_loading.py on small modules: what a report says, and what a checkpoint file may look like.

The detector-sized checks (a CMT checkpoint in CMT-AQR, a VoV checkpoint refused by R50) are in
tests/models/aqr/test_aqr_from_cmt_checkpoint.py.
"""
import logging
from collections import OrderedDict

import pytest
import torch
from torch import nn

from projects.mmdet3d_plugin.apis.checkpoint_loading import checkpoint_state_dict, load_detector_checkpoint


class _Versioned(nn.Linear):
    """A module whose loading sees the version its state dict was saved with (as mmdet3d's spconv modules)."""

    _version = 2
    seen_versions = []

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        type(self).seen_versions.append(local_metadata.get('version'))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)


def _model() -> nn.Module:
    return nn.ModuleDict(dict(backbone=nn.ModuleDict(dict(conv=_Versioned(2, 3))), head=nn.Linear(3, 1)))


def _messages(caplog, name='test_loading'):
    return [(record.levelname, record.getMessage()) for record in caplog.records if record.name == name]


def test_a_ddp_checkpoint_loads_with_its_module_versions(tmp_path, caplog):
    source = _model()
    state = source.state_dict()
    wrapped = OrderedDict((f'module.{key}', value) for key, value in state.items())
    wrapped._metadata = OrderedDict((f'module.{key}' if key else 'module', value)
                                    for key, value in state._metadata.items())
    path = str(tmp_path / 'ddp.pth')
    torch.save(dict(meta=dict(epoch=3), state_dict=wrapped, optimizer={}), path)
    target = _model()
    _Versioned.seen_versions.clear()
    with caplog.at_level(logging.INFO):
        checkpoint = load_detector_checkpoint(target, path, logging.getLogger('test_loading'))
    assert checkpoint['meta'] == dict(epoch=3) and _Versioned.seen_versions == [2]
    assert all(torch.equal(value, state[key]) for key, value in target.state_dict().items())
    assert _messages(caplog) == [('INFO', f'checkpoint {path}: every parameter and buffer loaded')]


def test_missing_and_unexpected_tensors_are_named_by_module(tmp_path, caplog):
    path = str(tmp_path / 'partial.pth')
    torch.save(OrderedDict([('backbone.conv.weight', torch.zeros(3, 2)), ('neck.extra', torch.zeros(1))]), path)
    with caplog.at_level(logging.INFO):
        load_detector_checkpoint(_model(), path, logging.getLogger('test_loading'), purpose='load_from')
    assert _messages(caplog) == [
        ('WARNING', f"load_from {path}: 3 parameters and buffers of the model are not in the checkpoint and keep their "
                    f"initialisation: backbone.conv (1), head.bias (1), head.weight (1); first: "
                    f"['backbone.conv.bias', 'head.weight', 'head.bias']"),
        ('WARNING', f"load_from {path}: 1 tensors of the checkpoint are not in the model and were ignored: "
                    f"neck.extra (1); first: ['neck.extra']")]


def test_a_file_that_is_no_checkpoint_is_named(tmp_path):
    with pytest.raises(ValueError, match='x.pth: not a checkpoint'):
        checkpoint_state_dict([1, 2], 'x.pth')
