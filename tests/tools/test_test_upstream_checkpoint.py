"""``tools/test.py`` evaluates a checkpoint in upstream CMT's exact layout.

Upstream's training (mmcv 1.x's runner) writes ``{'meta', 'state_dict', 'optimizer'}``: ``meta`` with the epoch,
the iteration, the versions and the classes; the state dict with its module versions (``_metadata``), version 2
for mmdet3d's spconv 2 modules, whose weights are kept as ``[out, kD, kH, kW, in]``. Such a file of the (shrunk)
fusion R50 config, every spconv weight distinct, is evaluated by ``tools/test.py --eval bbox`` with every tensor
loaded, and the model it builds holds the file's spconv weights unpermuted.
"""
import sys
import time

import pytest
import torch

SPCONV_WEIGHT = 'pts_middle_encoder.conv_input.0.weight'


@pytest.fixture(scope='module')
def upstream_checkpoint(synthetic_nuscenes, tools_cli, tmp_path_factory):
    """``(config path, checkpoint path, state_dict)``: the tiny R50 fusion config and a file as upstream writes it."""
    import mmcv
    import mmdet3d
    from mmcv.runner import build_optimizer, save_checkpoint
    from mmdet3d.models import build_model

    import projects.mmdet3d_plugin  # noqa: F401
    folder = tmp_path_factory.mktemp('upstream_checkpoint')
    cfg = tools_cli.tiny_config(synthetic_nuscenes)
    config = str(folder / 'cmt_voxel0100_r50_800x320_cbgs.py')
    cfg.dump(config)
    torch.manual_seed(0)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    with torch.no_grad():  # distinct values: a permuted layout cannot pass for the saved one
        weight = dict(model.named_parameters())[SPCONV_WEIGHT]
        weight.copy_(torch.arange(weight.numel(), dtype=weight.dtype).reshape(weight.shape) / weight.numel())
    meta = dict(epoch=20, iter=20 * 3517, mmdet_version='2.24.0', mmdet3d_version=mmdet3d.__version__,
                mmcv_version=mmcv.__version__, time=time.asctime(), config=cfg.pretty_text, CLASSES=cfg.class_names)
    path = str(folder / 'epoch_20.pth')
    save_checkpoint(model, path, optimizer=build_optimizer(model, cfg.optimizer), meta=meta)
    return config, path


@pytest.mark.slow(seconds=45)
def test_the_file_has_upstream_layout_and_tools_test_evaluates_it(upstream_checkpoint, tools_cli, tmp_path):
    config, path = upstream_checkpoint
    checkpoint = torch.load(path, map_location='cpu', weights_only=False)
    assert sorted(checkpoint) == ['meta', 'optimizer', 'state_dict']
    versions = checkpoint['state_dict']._metadata
    assert versions['pts_middle_encoder.conv_input.0']['version'] == 2
    weight = checkpoint['state_dict'][SPCONV_WEIGHT]
    assert weight.shape[0] == 16 and weight.shape[-1] == 5  # [out, kD, kH, kW, in]
    out = tools_cli.run([sys.executable, 'tools/test.py', config, path, '--eval', 'bbox', '--work-dir',
                         str(tmp_path)], timeout=600)
    assert f'checkpoint {path}: every parameter and buffer loaded' in out
    assert "'pts_bbox_NuScenes/NDS'" in out


def test_the_model_holds_the_spconv_weights_unpermuted(upstream_checkpoint):
    from mmcv import Config

    from projects.mmdet3d_plugin.apis.test import build_test_model
    config, path = upstream_checkpoint
    model = build_test_model(Config.fromfile(config), path, classes=())
    saved = torch.load(path, map_location='cpu', weights_only=False)['state_dict'][SPCONV_WEIGHT]
    assert torch.equal(dict(model.named_parameters())[SPCONV_WEIGHT].detach(), saved)
    assert model.CLASSES == Config.fromfile(config).class_names  # from the file's meta
