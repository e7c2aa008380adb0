"""``tools/dist_train.sh`` on the CPU (gloo) trains the stage-2 config: only the AQR modules, under DDP.

``FreezeParametersHook`` freezes everything but the AQR modules. ``DistributedDataParallel`` (without
``find_unused_parameters``) waits for a gradient of every parameter it registered: were the parameters frozen
after the wrapper was built, the second iteration would stop with "Expected to have finished reduction in the
prior iteration". Two epochs of one iteration each (one training sample, padded to one per process) from a
checkpoint (``load_from``): the run must finish, and its final weights must differ from the checkpoint's
exactly in AQR parameters, with every BatchNorm statistic kept. Every process uses one thread.

The model: configs/demo/cmt_aqr_synthetic_tiny_stage2.py with a 16-channel ResNet-18 (tests/tools/conftest.py).
"""
import sys

import pytest
import torch
from mmcv import Config

AQR_PREFIXES = tuple(f'pts_bbox_head.{name}.' for name in ('aqr_weight_generator', 'attention_bias_generator'))


@pytest.mark.slow(seconds=30)
def test_two_gloo_processes_train_only_the_aqr_modules_of_the_stage2_config(demo_checkpoint, tools_cli, tmp_path):
    config, checkpoint = demo_checkpoint('cmt_aqr_synthetic_tiny_stage2')
    cfg = Config.fromfile(config)
    cfg.data.train.load_interval = 2
    cfg.runner.max_epochs = 2
    cfg.checkpoint_config.update(interval=2)
    cfg.load_from = checkpoint
    config = str(tmp_path / 'stage2_one_sample.py')
    cfg.dump(config)

    work_dir = tmp_path / 'ddp'
    out = tools_cli.run(['bash', 'tools/dist_train.sh', config, '2', '--work-dir', str(work_dir), '--no-validate'],
                        timeout=400, env=dict(CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1', PYTHON=sys.executable,
                                              PORT=str(tools_cli.free_port())))
    assert 'Distributed training: True, device: cpu' in out and 'FreezeParametersHook: training' in out

    start = torch.load(checkpoint, map_location='cpu')['state_dict']
    end = torch.load(work_dir / 'epoch_2.pth', map_location='cpu')['state_dict']
    assert set(start) == set(end)
    changed = {key for key, value in start.items() if not torch.equal(end[key], value)}
    assert changed and all(key.startswith(AQR_PREFIXES) for key in changed), sorted(changed)[:10]
