"""CMT is deterministic on CPU: the same input gives bit-identical outputs, losses and gradients.

Run-to-run differences on CPU were once blamed on "spconv's accumulation
order"; they were spconv 2.3's CPU scatter-add race (issue 16,
``mmcv_custom/spconv_cpu_scatter.py``), which shows only with more than one
OpenMP thread in spconv's kernels on a loaded machine. So both models run
spconv's ``SparseEncoder`` (the demo CMT-AQR with the published configs' LiDAR
branch at half width, and the R50 fusion CMT at a reduced size), with two
OpenMP threads in spconv's kernels, while busy-loop processes load every core.
"""
import multiprocessing
import os

import numpy as np
import pytest
import torch
from mmcv import Config
from mmdet3d.models import build_model

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.mmcv_custom.sparse_conv_check import (spconv_openmp_threads,
                                                                   use_spconv_openmp_threads)

DEMO_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny.py'
PUBLISHED_CONFIG = 'cmt_voxel0100_r50_800x320_cbgs'
SPCONV_THREADS = 2


def _busy_loop() -> None:
    """Keep one core busy (a CPU load process)."""
    while True:
        pass


def _build(cfg):
    torch.manual_seed(0)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


def _demo_with_sparse_encoder(reduced_config) -> Config:
    """The demo CMT-AQR with the (reduced) published config's LiDAR branch instead of pillars, at half width.

    Voxels of 0.1 m, ``HardSimpleVFE`` and spconv's ``SparseEncoder`` (half its
    channels) on the tests' 24 m range, then the demo's SECOND / SECONDFPN
    without their extra stride: a 30 x 30 BEV map (stride 8) of 256 channels
    into the demo's AQR head.
    """
    cfg = Config.fromfile(DEMO_CONFIG)
    published = reduced_config(PUBLISHED_CONFIG).model
    model = cfg.model
    for key in ('pts_voxel_layer', 'pts_voxel_encoder', 'pts_middle_encoder', 'train_cfg', 'test_cfg'):
        model[key] = published[key]
    model.pts_middle_encoder.update(base_channels=8, output_channels=64,
                                    encoder_channels=((8, 8, 16), (16, 16, 32), (32, 32, 64), (64, 64)))
    model.pts_backbone.update(in_channels=128, layer_strides=[1, 2])
    model.pts_neck.upsample_strides = [1, 2]
    head = model.pts_bbox_head
    head.downsample_scale = published.pts_bbox_head.downsample_scale
    head.bbox_coder.update(pc_range=published.pts_bbox_head.bbox_coder.pc_range,
                           voxel_size=published.pts_bbox_head.bbox_coder.voxel_size)
    return cfg


@pytest.fixture(scope='module', params=['demo', 'r50'])
def model(request, cmt_test_data):
    """The demo CMT-AQR and the R50 fusion CMT, both with spconv's sparse encoder (see the module docstring)."""
    if request.param == 'demo':
        model = _build(_demo_with_sparse_encoder(cmt_test_data['reduced_config']))
    else:
        model = _build(cmt_test_data['reduced_config'](PUBLISHED_CONFIG))
    assert type(model.pts_middle_encoder).__name__ == 'SparseEncoder'
    return model


@pytest.fixture(autouse=True)
def spconv_threads_under_cpu_load():
    """Two OpenMP threads in spconv's kernels (one on its builds without OpenMP, the CUDA wheels) and a busy-loop
    process per usable core while each test runs."""
    loads = [multiprocessing.Process(target=_busy_loop, daemon=True) for _ in range(len(os.sched_getaffinity(0)))]
    for process in loads:
        process.start()
    try:
        if spconv_openmp_threads() is None:
            yield
        else:
            with use_spconv_openmp_threads(SPCONV_THREADS):
                assert spconv_openmp_threads() == SPCONV_THREADS
                yield
    finally:
        for process in loads:
            process.terminate()
            process.join()


def test_two_inference_passes_are_bit_identical(model, cmt_test_data):
    torch.manual_seed(1)
    data = cmt_test_data['random_batch'](num_boxes=(4, 3))
    model.eval()
    with torch.no_grad():
        runs = [model.simple_test(data['points'], data['img_metas'], img=data['img']) for _ in range(2)]
    for first, second in zip(*runs):
        boxes = first['pts_bbox']
        assert len(boxes['scores_3d']) > 0
        assert torch.equal(boxes['boxes_3d'].tensor, second['pts_bbox']['boxes_3d'].tensor)
        assert torch.equal(boxes['scores_3d'], second['pts_bbox']['scores_3d'])
        assert torch.equal(boxes['labels_3d'], second['pts_bbox']['labels_3d'])


def test_two_training_passes_give_bit_identical_losses_and_gradients(model, cmt_test_data):
    torch.manual_seed(2)
    data = cmt_test_data['random_batch'](num_boxes=(4, 3))
    runs = []
    for _ in range(2):
        torch.manual_seed(3)  # dropout and DN noise
        np.random.seed(3)  # GridMask (the R50 config)
        outputs = cmt_test_data['train_step'](model, data)
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        runs.append((outputs['log_vars'], grads))
    (logs, grads), (logs_again, grads_again) = runs
    assert logs == logs_again
    assert grads.keys() == grads_again.keys() and any(name.startswith('pts_middle_encoder') for name in grads)
    for name, grad in grads.items():
        assert torch.equal(grad, grads_again[name]), name
