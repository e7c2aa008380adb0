"""AtomicCheckpointHook: a crash while saving never leaves a corrupt or missing latest.pth; auto-resume's search."""
import logging
import os
import os.path as osp

import pytest
import torch
from mmcv.fileio.file_client import HardDiskBackend
from mmcv.runner import CheckpointHook, EpochBasedRunner
from torch import nn

from projects.mmdet3d_plugin.mmcv_custom.checkpoint import (STAGING_PREFIX, AtomicCheckpointHook, check_resumable,
                                                            find_latest_valid_checkpoint)


class _Toy(nn.Module):

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def train_step(self, data, optimizer):
        return dict(loss=self.linear(data).sum())


def _runner(work_dir) -> EpochBasedRunner:
    model = _Toy()
    return EpochBasedRunner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), work_dir=str(work_dir),
                            logger=logging.getLogger('test_checkpoint'), meta=dict(), max_epochs=10)


def _save_epoch(hook, runner, epoch: int) -> torch.Tensor:
    """Fill the weights with ``epoch`` and let the hook save the end of epoch ``epoch`` (1-based); the weights."""
    runner._epoch = epoch - 1
    with torch.no_grad():
        runner.model.linear.weight.fill_(float(epoch))
    hook.after_train_epoch(runner)
    return runner.model.linear.weight.detach().clone()


def _weights(path: str) -> torch.Tensor:
    return torch.load(path, map_location='cpu')['state_dict']['linear.weight']


def _crash_halfway_through_writes(monkeypatch):
    """Every checkpoint write stores half its bytes and then dies, as a kill during the write would."""
    def put(self, obj, filepath):
        with open(filepath, 'wb') as file:
            file.write(obj[:len(obj) // 2])
        raise KeyboardInterrupt('killed while writing')

    monkeypatch.setattr(HardDiskBackend, 'put', put)


def _entries(work_dir) -> set:
    return set(os.listdir(work_dir))


@pytest.fixture
def saved(tmp_path):
    """A runner and its AtomicCheckpointHook after saving epoch 1."""
    runner = _runner(tmp_path)
    hook = AtomicCheckpointHook(interval=1)
    hook.before_run(runner)
    weights = _save_epoch(hook, runner, 1)
    return runner, hook, weights


def test_checkpoints_latest_link_and_retention(tmp_path):
    runner = _runner(tmp_path)
    hook = AtomicCheckpointHook(interval=1, max_keep_ckpts=2)
    hook.before_run(runner)
    for epoch in (1, 2, 3):
        weights = _save_epoch(hook, runner, epoch)
    assert _entries(tmp_path) == {'epoch_2.pth', 'epoch_3.pth', 'latest.pth'}
    assert osp.islink(tmp_path / 'latest.pth') and os.readlink(tmp_path / 'latest.pth') == 'epoch_3.pth'
    checkpoint = torch.load(tmp_path / 'latest.pth', map_location='cpu')
    assert checkpoint['meta']['epoch'] == 3 and torch.equal(checkpoint['state_dict']['linear.weight'], weights)
    assert 'optimizer' in checkpoint
    assert runner.meta['hook_msgs']['last_ckpt'] == str(tmp_path / 'epoch_3.pth')


def test_a_crash_while_writing_keeps_the_previous_latest(saved, monkeypatch):
    runner, hook, weights = saved
    work_dir = runner.work_dir
    _crash_halfway_through_writes(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        _save_epoch(hook, runner, 2)
    # a resumed run saves the epoch latest.pth points to again: the file must not be truncated in place
    with pytest.raises(KeyboardInterrupt):
        _save_epoch(hook, runner, 1)
    assert _entries(work_dir) == {'epoch_1.pth', 'latest.pth'}  # no partial epoch_2.pth, no staging left
    assert os.readlink(osp.join(work_dir, 'latest.pth')) == 'epoch_1.pth'
    assert torch.equal(_weights(osp.join(work_dir, 'latest.pth')), weights)
    assert find_latest_valid_checkpoint(work_dir) == osp.join(work_dir, 'epoch_1.pth')


def test_mmcv_checkpoint_hook_truncates_latest_in_the_same_crash(tmp_path, monkeypatch):
    """What the test above guards against: mmcv's own hook rewrites the latest checkpoint in place."""
    runner = _runner(tmp_path)
    hook = CheckpointHook(interval=1)
    hook.before_run(runner)
    _save_epoch(hook, runner, 1)
    _crash_halfway_through_writes(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        _save_epoch(hook, runner, 1)
    with pytest.raises(Exception):
        torch.load(tmp_path / 'latest.pth', map_location='cpu')


def test_a_crash_while_linking_keeps_the_previous_latest(saved, monkeypatch):
    runner, hook, weights = saved
    work_dir = runner.work_dir
    replace = os.replace

    def replace_but_die_on_latest(src, dst):
        if osp.basename(dst) == 'latest.pth':
            raise KeyboardInterrupt('killed while linking')
        replace(src, dst)

    monkeypatch.setattr(os, 'replace', replace_but_die_on_latest)
    with pytest.raises(KeyboardInterrupt):
        _save_epoch(hook, runner, 2)
    monkeypatch.undo()
    assert torch.equal(_weights(osp.join(work_dir, 'latest.pth')), weights)
    # epoch_2.pth was complete before the link was touched, so auto-resume takes it
    assert find_latest_valid_checkpoint(work_dir) == osp.join(work_dir, 'epoch_2.pth')
    assert torch.equal(_weights(osp.join(work_dir, 'epoch_2.pth')), torch.full_like(weights, 2.0))
    stale = [name for name in _entries(work_dir) if name.startswith(STAGING_PREFIX)]
    assert stale == [f'{STAGING_PREFIX}latest.pth']  # the new link, never moved into place
    hook.before_run(runner)  # the next run removes it
    assert _entries(work_dir) == {'epoch_1.pth', 'epoch_2.pth', 'latest.pth'}


def test_the_next_run_removes_what_a_killed_save_left(saved):
    runner, hook, _ = saved
    staging = osp.join(runner.work_dir, f'{STAGING_PREFIX}abc')
    os.makedirs(staging)
    with open(osp.join(staging, 'epoch_2.pth'), 'wb') as file:
        file.write(b'PK\x03\x04 half a checkpoint')
    assert find_latest_valid_checkpoint(runner.work_dir) == osp.join(runner.work_dir, 'epoch_1.pth')
    AtomicCheckpointHook(interval=1).before_run(runner)
    assert _entries(runner.work_dir) == {'epoch_1.pth', 'latest.pth'}


def test_auto_resume_skips_checkpoints_that_do_not_load(saved, caplog):
    runner, _, _ = saved
    work_dir = runner.work_dir
    with open(osp.join(work_dir, 'epoch_1.pth'), 'rb') as file:
        data = file.read()
    with open(osp.join(work_dir, 'epoch_3.pth'), 'wb') as file:
        file.write(data[:len(data) // 2])
    torch.save(dict(state_dict=runner.model.state_dict()), osp.join(work_dir, 'epoch_2.pth'))  # no meta
    logger = logging.getLogger('auto-resume-test')
    with caplog.at_level(logging.WARNING, logger='auto-resume-test'):
        assert find_latest_valid_checkpoint(work_dir, logger) == osp.join(work_dir, 'epoch_1.pth')
    skipped = [record.getMessage() for record in caplog.records]
    assert len(skipped) == 2 and 'epoch_3.pth' in skipped[0] and 'cannot be loaded' in skipped[0]
    assert 'epoch_2.pth' in skipped[1] and "no 'epoch'" in skipped[1]
    with pytest.raises(ValueError, match='cannot resume from .*epoch_3.pth: it cannot be loaded'):
        check_resumable(osp.join(work_dir, 'epoch_3.pth'))
    with pytest.raises(FileNotFoundError, match='epoch_7.pth'):
        check_resumable(osp.join(work_dir, 'epoch_7.pth'))
    assert find_latest_valid_checkpoint(osp.join(work_dir, 'missing')) is None


def test_remote_storage_is_refused(tmp_path):
    with pytest.raises(ValueError, match='local directory.*http'):
        AtomicCheckpointHook(interval=1, out_dir='http://example.com/checkpoints').before_run(_runner(tmp_path))
