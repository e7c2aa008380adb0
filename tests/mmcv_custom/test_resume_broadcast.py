"""--auto-resume in a distributed run: rank 0 searches the work dir, and every process resumes from its choice.

Two gloo processes; each is handed a different work dir (as a node with a stale view of the shared one would see
it): rank 0's holds epoch 2, rank 1's epoch 1. Both must resume from rank 0's epoch 2.
"""
import os.path as osp

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from projects.mmdet3d_plugin.mmcv_custom.checkpoint import find_resume_checkpoint_once


def _save(path: str, epoch: int) -> None:
    torch.save(dict(state_dict={}, meta=dict(epoch=epoch, iter=2 * epoch)), path)


def _resume_choice(rank: int, store: str, work_dirs: list, results: str) -> None:
    dist.init_process_group('gloo', init_method=f'file://{store}', rank=rank, world_size=2)
    try:
        choice = find_resume_checkpoint_once(work_dirs[rank])
        torch.save(choice, osp.join(results, f'rank{rank}.pt'))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow(seconds=20)  # two processes that import the plugin
def test_every_rank_resumes_from_the_checkpoint_rank_0_found(tmp_path):
    work_dirs = [tmp_path / 'rank0_view', tmp_path / 'rank1_view']
    for epoch, work_dir in zip((2, 1), work_dirs):
        work_dir.mkdir()
        _save(str(work_dir / f'epoch_{epoch}.pth'), epoch)
    mp.spawn(_resume_choice, args=(str(tmp_path / 'store'), [str(d) for d in work_dirs], str(tmp_path)), nprocs=2)
    chosen = [torch.load(tmp_path / f'rank{rank}.pt') for rank in range(2)]
    assert chosen == [str(work_dirs[0] / 'epoch_2.pth')] * 2


def test_without_a_process_group_the_search_itself(tmp_path):
    _save(str(tmp_path / 'epoch_3.pth'), 3)
    assert find_resume_checkpoint_once(str(tmp_path)) == str(tmp_path / 'epoch_3.pth')
    assert find_resume_checkpoint_once(str(tmp_path / 'missing')) is None
