"""What the tools tests share: a tiny synthetic nuScenes set (made once per session), small configs for it, and
helpers to run the command-line tools.

The data: tools/make_synthetic_nuscenes.py (2 scenes x 2 samples: 2 train and 2 val key frames, small images),
converted by tools/create_data.py. ``tools_cli.tiny_config`` shrinks a repository config for it: 25.6 m range,
40 queries, 64 x 160 images, the set's nuScenes version, no CBGS, one epoch, one sample per process, a log line per iteration;
``slim=True`` also narrows the image backbone to a 16-channel ResNet, for small and fast checkpoints.
"""
import os
import os.path as osp
import subprocess
from types import SimpleNamespace
from typing import Dict, Optional, Sequence, Tuple

import pytest
import torch
from mmcv import Config

from projects.mmdet3d_plugin.utils.local_resources import free_port

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# 25.6 m: a BEV grid divisible by 16 at voxel 0.1 m and 0.2 m (SECOND + FPN stride 2 then upsample 2)
SMALL_RANGE = [-12.8, -12.8, -5.0, 12.8, 12.8, 3.0]
IMAGE_AUG = dict(resize_lim=(0.5, 0.5), final_dim=(64, 160), bot_pct_lim=(0.0, 0.0), rot_lim=(0.0, 0.0), H=180,
                 W=320, rand_flip=True)
SLIM_IMAGE_CHANNELS = 16
SYNTHETIC_VERSION = 'v1.0-mini'


def run(args, timeout=300, env=None) -> str:
    """Run a command in the repository root; assert it succeeds; its stdout + stderr."""
    result = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                            env=dict(os.environ, **(env or {})))
    assert result.returncode == 0, f'{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}'
    return result.stdout + result.stderr


def _shrink(node):
    """Point every range at SMALL_RANGE and every image augmentation at 64 x 160 outputs."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ('point_cloud_range', 'pc_range'):
                node[key] = list(SMALL_RANGE)
            elif key == 'data_aug_conf':
                node[key] = dict(IMAGE_AUG)
            else:
                _shrink(value)
    elif isinstance(node, list):
        for value in node:
            _shrink(value)


def set_data_root(cfg: Config, data_root: str) -> Config:
    """A copy of ``cfg`` reading the info files, the GT database and the 320 x 180 images of ``data_root``."""
    from projects.mmdet3d_plugin.datasets.data_root_config import retarget_data_root
    cfg = retarget_data_root(cfg, data_root)

    def visit(node):
        if isinstance(node, dict):
            if 'data_aug_conf' in node:
                node['data_aug_conf'] = dict(node['data_aug_conf'], H=180, W=320)
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(cfg._cfg_dict)
    return cfg


def tiny_config(data_root: str, base: str = 'cmt_voxel0100_r50_800x320_cbgs.py', slim: bool = False) -> Config:
    """``configs/<base>`` shrunk for the synthetic set of ``data_root`` (see the module docstring)."""
    cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', base))
    cfg.data.train = cfg.data.train.get('dataset', cfg.data.train)  # no CBGS resampling
    cfg = set_data_root(cfg, data_root)
    _shrink(cfg._cfg_dict)
    cfg.data.samples_per_gpu, cfg.data.workers_per_gpu = 1, 0
    for split in ('train', 'val', 'test'):
        if 'version' in cfg.data[split]:
            cfg.data[split].version = SYNTHETIC_VERSION
    model = cfg.model
    model.pts_bbox_head.num_query = 40
    if model.get('pts_voxel_layer') is not None:  # camera-only configs have no LiDAR branch
        model.pts_voxel_layer.max_voxels = (4000, 4000)
        grid = int(round((SMALL_RANGE[3] - SMALL_RANGE[0]) / model.pts_voxel_layer.voxel_size[0]))
        encoder = model.pts_middle_encoder
        if 'sparse_shape' in encoder:  # spconv SparseEncoder
            encoder.sparse_shape = [encoder.sparse_shape[0], grid, grid]
        if 'output_shape' in encoder:  # pillars: PointPillarsScatter
            encoder.output_shape = [grid, grid]
        depth = model.train_cfg.pts.grid_size[2]
        model.train_cfg.pts.grid_size = model.test_cfg.pts.grid_size = [grid, grid, depth]
    if slim:
        backbone = model.img_backbone
        if backbone.type != 'ResNet' or backbone.depth not in (18, 34):
            raise ValueError(f'slim=True expects a ResNet-18/34 image backbone in {base}, got {backbone}')
        backbone.base_channels = SLIM_IMAGE_CHANNELS
        model.img_neck.in_channels = [SLIM_IMAGE_CHANNELS * 2**index for index in backbone.out_indices]
    cfg.runner = dict(type='EpochBasedRunner', max_epochs=1)
    cfg.log_config = dict(interval=1, hooks=[dict(type='TextLoggerHook')])
    return cfg


@pytest.fixture(scope='session')
def synthetic_nuscenes(tmp_path_factory) -> str:
    """2 scenes x 2 samples of synthetic nuScenes with info files and GT database (the tools' main functions)."""
    from tools import create_data, make_synthetic_nuscenes
    root = str(tmp_path_factory.mktemp('synthetic_nuscenes'))
    make_synthetic_nuscenes.main(['--root', root, '--version', SYNTHETIC_VERSION, '--scenes', '2', '--val-scenes', '1',
                                  '--samples', '2', '--sweeps', '1', '--image-size', '320', '180', '--lidar-beams', '16',
                                  '--lidar-azimuths', '360', '--quiet'])
    create_data.main(['nuscenes', '--root-path', root, '--out-dir', root, '--extra-tag', 'nuscenes', '--version',
                      SYNTHETIC_VERSION])
    return root


class Killed(Exception):
    """Stops an in-process training run where a kill would."""


@pytest.fixture(scope='session')
def tools_cli():
    """The helpers of this module, for the test files (which cannot import a conftest by name)."""
    return SimpleNamespace(repo_root=REPO_ROOT, run=run, free_port=free_port, set_data_root=set_data_root,
                           tiny_config=tiny_config)


@pytest.fixture
def train_in_process(monkeypatch):
    """``train(argv, kill_at=None)``: ``tools/train.py``'s ``main(argv)`` in this process.

    Returns the ``log_vars`` (every loss term, exact floats) of each training
    iteration by ``(epoch, inner_iter)``. ``kill_at=(epoch, inner_iter)``
    stops the run just before that iteration, as a kill would, and returns
    what it logged until then. Runs use one torch thread: spconv's CPU kernels
    accumulate in an order that depends on the threads, and only with one are
    two runs bitwise equal. mmcv's 2 s pauses between epochs are skipped, and
    the config text is not formatted by yapf (seconds per run).
    """
    from mmcv.runner import EpochBasedRunner, epoch_based_runner
    from mmcv.utils import config as mmcv_config

    from tools.train import main
    monkeypatch.setattr(epoch_based_runner, 'time', SimpleNamespace(sleep=lambda seconds: None))
    monkeypatch.setattr(mmcv_config, 'FormatCode', lambda text, **kwargs: (text, None))
    run_iter = EpochBasedRunner.run_iter
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def train(argv: Sequence[str], kill_at: Optional[Tuple[int, int]] = None) -> Dict[Tuple[int, int], dict]:
        losses = {}

        def recording_run_iter(runner, data_batch, train_mode, **kwargs):
            if train_mode and (runner.epoch, runner.inner_iter) == kill_at:
                raise Killed(f'killed before iteration {kill_at}')
            run_iter(runner, data_batch, train_mode, **kwargs)
            if train_mode:
                # the detector may keep its log variables on the device (train_detector asks it to): read them
                losses[runner.epoch, runner.inner_iter] = {name: float(value)
                                                           for name, value in runner.outputs['log_vars'].items()}

        with monkeypatch.context() as patch:
            patch.setattr(EpochBasedRunner, 'run_iter', recording_run_iter)
            try:
                main(list(argv))
            except Killed:
                return losses
        assert kill_at is None, f'the run ended before iteration {kill_at}, where it was to be killed'
        return losses

    yield train
    torch.set_num_threads(num_threads)


@pytest.fixture(scope='session')
def demo_checkpoint(synthetic_nuscenes, tmp_path_factory):
    """``make(name) -> (config path, checkpoint path)``: ``configs/demo/<name>.py`` through ``tiny_config`` (slim)
    for the synthetic set, and its randomly initialised checkpoint (tools/init_checkpoint.py, seed 0); made once per
    name and session."""
    from tools import init_checkpoint
    made = {}

    def make(name: str):
        if name not in made:
            folder = tmp_path_factory.mktemp(name)
            config = str(folder / f'{name}.py')
            tiny_config(synthetic_nuscenes, base=f'demo/{name}.py', slim=True).dump(config)
            checkpoint = str(folder / 'random_init.pth')
            init_checkpoint.main([config, checkpoint])
            made[name] = (config, checkpoint)
        return made[name]

    return make
