"""``tools/train.py --auto-resume`` / ``--resume-from`` continue a killed run with exactly the losses of a run that
was never killed.

The model: configs/demo/cmt_synthetic_tiny.py (fusion CMT) with a 16-channel ResNet-18, on the 2 training samples
of the synthetic set, one sample per iteration, the config's full training pipeline (GT sampling, modality drop,
flips, rotations, image augmentation). Two epochs of 2 iterations; a checkpoint after every epoch. With one torch
thread the model is bitwise deterministic on the CPU, so the losses must be equal exactly, not approximately.
"""
import os.path as osp
import random

import numpy as np
import pytest
import torch

from projects.mmdet3d_plugin.mmcv_custom import AtomicCheckpointHook


@pytest.fixture(scope='module')
def config(synthetic_nuscenes, tools_cli, tmp_path_factory) -> str:
    cfg = tools_cli.tiny_config(synthetic_nuscenes, base='demo/cmt_synthetic_tiny.py', slim=True)
    cfg.runner.max_epochs = 2
    cfg.checkpoint_config.update(interval=1, max_keep_ckpts=-1)
    path = str(tmp_path_factory.mktemp('resume') / 'cmt_slim.py')
    cfg.dump(path)
    return path


def _epoch(losses: dict, epoch: int) -> dict:
    return {key: value for key, value in losses.items() if key[0] == epoch}


def _assert_same_weights(checkpoint_a: str, checkpoint_b: str) -> None:
    state_a = torch.load(checkpoint_a, map_location='cpu')['state_dict']
    state_b = torch.load(checkpoint_b, map_location='cpu')['state_dict']
    assert state_a.keys() == state_b.keys()
    different = [name for name in state_a if not torch.equal(state_a[name], state_b[name])]
    assert not different, f'weights differ after resuming: {different[:5]}'


def test_a_killed_run_resumes_with_the_losses_of_an_uninterrupted_run(config, train_in_process, tmp_path,
                                                                      monkeypatch):
    # The uninterrupted run draws random numbers after saving epoch 1 (as an evaluation hook would): a resumed
    # run never sees those draws, and must still repeat epoch 2 exactly.
    save = AtomicCheckpointHook.after_train_epoch

    def save_then_draw(hook, runner):
        save(hook, runner)
        random.random(), np.random.rand(), torch.rand(1)

    with monkeypatch.context() as patch:
        patch.setattr(AtomicCheckpointHook, 'after_train_epoch', save_then_draw)
        full = train_in_process([config, '--work-dir', str(tmp_path / 'full'), '--no-validate'])
    assert sorted(full) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len({log_vars['loss'] for log_vars in full.values()}) == 4

    killed_dir = tmp_path / 'killed'
    killed = train_in_process([config, '--work-dir', str(killed_dir), '--no-validate'], kill_at=(1, 1))
    assert killed == {key: full[key] for key in [(0, 0), (0, 1), (1, 0)]}
    assert sorted(path.name for path in killed_dir.glob('*.pth')) == ['epoch_1.pth', 'latest.pth']
    # what a non-atomic writer killed while saving epoch 2 would leave: auto-resume must skip it
    (killed_dir / 'epoch_2.pth').write_bytes((killed_dir / 'epoch_1.pth').read_bytes()[:100000])

    resumed = train_in_process([config, '--work-dir', str(killed_dir), '--no-validate', '--auto-resume'])
    assert resumed == _epoch(full, 1)
    _assert_same_weights(str(killed_dir / 'latest.pth'), str(tmp_path / 'full' / 'latest.pth'))
    assert osp.realpath(killed_dir / 'latest.pth') == str(killed_dir / 'epoch_2.pth')

    resumed_from = train_in_process([config, '--work-dir', str(tmp_path / 'other'), '--no-validate',
                                     '--resume-from', str(tmp_path / 'full' / 'epoch_1.pth')])
    assert resumed_from == _epoch(full, 1)


def test_resume_from_a_corrupt_checkpoint_is_a_clear_error(config, train_in_process, tmp_path):
    broken = tmp_path / 'epoch_1.pth'
    broken.write_bytes(b'PK\x03\x04 not a whole checkpoint')
    with pytest.raises(ValueError, match=f'cannot resume from {broken}: it cannot be loaded'):
        train_in_process([config, '--work-dir', str(tmp_path / 'work'), '--resume-from', str(broken)])
