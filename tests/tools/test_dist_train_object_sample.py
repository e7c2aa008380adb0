"""15e + 5e in one run, scaled down: ``tools/dist_train.sh`` with two gloo processes trains a tiny fusion config for
3 + 1 epochs (``DisableObjectSampleHook(disable_after_epoch=3)``), and the GT-sampled objects counted in every rank
and data loader worker are above 0 in epochs 1–3 and 0 in epoch 4: with persistent workers, without them, and in a
run resumed into epoch 4.

The count: the config's ``UnifiedObjectSample`` is replaced by a subclass (``CountingObjectSample``, a module
written next to the config and imported through ``custom_imports``) that appends, per call, its rank, process
and epoch and the objects it added, and a ``LoadMarker`` after it records every sample loaded; the epoch comes
from a file each rank's ``EpochMarkerHook`` writes before its epoch starts (a data loader's workers load an epoch
only after its ``before_train_epoch`` hooks ran).
"""
import sys
from collections import defaultdict

import pytest

COUNTING_MODULE = '''
import os

from mmcv.runner import HOOKS, Hook
from mmdet.datasets.builder import PIPELINES

from projects.mmdet3d_plugin.datasets.pipelines.object_sample import UnifiedObjectSample

OUT = os.environ['GT_SAMPLE_COUNT_DIR']


def _rank():
    return os.environ.get('RANK', '0')


@HOOKS.register_module()
class EpochMarkerHook(Hook):
    def before_train_epoch(self, runner):
        with open(os.path.join(OUT, f'epoch_rank{_rank()}'), 'w') as f:
            f.write(str(runner.epoch + 1))


def _record(what):
    with open(os.path.join(OUT, f'epoch_rank{_rank()}')) as f:
        epoch = f.read()
    with open(os.path.join(OUT, f'counts_{os.getpid()}.txt'), 'a') as f:
        f.write(f'{_rank()} {os.getpid()} {epoch} {what}\\n')


@PIPELINES.register_module()
class CountingObjectSample(UnifiedObjectSample):
    def __call__(self, results):
        before = len(results['gt_bboxes_3d'])
        results = super().__call__(results)
        _record(len(results['gt_bboxes_3d']) - before)
        return results


@PIPELINES.register_module()
class LoadMarker:
    def __call__(self, results):
        _record('loaded')
        return results
'''


@pytest.fixture(scope='module')
def counting_config(synthetic_nuscenes, tools_cli, tmp_path_factory):
    """``make(persistent, epochs) -> config path``: the slim demo CMT, 2 training samples, one worker per process."""
    folder = tmp_path_factory.mktemp('object_sample_hook')
    (folder / 'gt_sample_counting.py').write_text(COUNTING_MODULE)

    def make(persistent: bool, epochs: int) -> str:
        cfg = tools_cli.tiny_config(synthetic_nuscenes, base='demo/cmt_synthetic_tiny.py', slim=True)
        pipeline = cfg.data.train.pipeline
        index = [t['type'] for t in pipeline].index('UnifiedObjectSample')
        sampler = dict(pipeline[index].db_sampler, sample_groups={name: 10 for name in cfg.class_names})  # > 0 each
        pipeline[index:index + 1] = [dict(pipeline[index], type='CountingObjectSample', db_sampler=sampler),
                                     dict(type='LoadMarker')]
        cfg.custom_imports = dict(imports=['projects.mmdet3d_plugin', 'gt_sample_counting'],
                                  allow_failed_imports=False)
        cfg.custom_hooks = [dict(type='EpochMarkerHook'), dict(type='DisableObjectSampleHook', disable_after_epoch=3)]
        cfg.runner.max_epochs = epochs
        cfg.checkpoint_config.update(interval=1, max_keep_ckpts=-1)
        cfg.data.workers_per_gpu = 1
        cfg.data.train_dataloader = dict(persistent_workers=persistent)
        path = str(folder / f'persistent{int(persistent)}_{epochs}e.py')
        cfg.dump(path)
        return path

    return make, str(folder)


def _train(tools_cli, config, work_dir, count_dir, module_dir, *extra):
    return tools_cli.run(['bash', 'tools/dist_train.sh', config, '2', '--work-dir', str(work_dir), '--no-validate',
                          *extra], timeout=600,
                         env=dict(CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1', PYTHON=sys.executable,
                                  PORT=str(tools_cli.free_port()), GT_SAMPLE_COUNT_DIR=str(count_dir),
                                  PYTHONPATH=module_dir))


def _counts(count_dir):
    """``{(rank, epoch): [objects added by each GT-sampling call]}`` and ``{(rank, epoch): {processes that loaded
    a sample}}``."""
    added, processes = defaultdict(list), defaultdict(set)
    for path in count_dir.glob('counts_*.txt'):
        for line in path.read_text().splitlines():
            rank, pid, epoch, what = line.split()
            if what == 'loaded':
                processes[rank, int(epoch)].add(pid)
            else:
                added[rank, int(epoch)].append(int(what))
    return dict(added), dict(processes)


def _assert_sampled_until_epoch_3(added, processes):
    assert sorted(processes) == [(rank, epoch) for rank in '01' for epoch in (1, 2, 3, 4)], sorted(processes)
    for rank in '01':
        assert all(sum(added[rank, epoch]) > 0 for epoch in (1, 2, 3)), added
        assert sum(added.get((rank, 4), [])) == 0, f'rank {rank} sampled {added[rank, 4]} objects in epoch 4'


@pytest.mark.slow(seconds=60)
@pytest.mark.parametrize('persistent', [True, False])
def test_gt_sampling_stops_after_epoch_3_in_every_rank_and_worker(counting_config, tools_cli, tmp_path, persistent):
    make, module_dir = counting_config
    count_dir = tmp_path / 'counts'
    count_dir.mkdir()
    out = _train(tools_cli, make(persistent, 4), tmp_path / 'work', count_dir, module_dir)
    switch = ('GT sampling off from epoch 4 on (disable_after_epoch=3): removed CountingObjectSample from the '
              'training pipeline')
    assert switch + ('; data loader workers restarted' if persistent else '\n') in out  # rank 0's log line
    added, processes = _counts(count_dir)
    _assert_sampled_until_epoch_3(added, processes)
    for rank in '01':  # persistent: one worker for epochs 1-3, a new one for epoch 4; else a new one every epoch
        assert (processes[rank, 1] == processes[rank, 3]) == persistent and not processes[rank, 3] & processes[rank, 4]


@pytest.mark.slow(seconds=60)
def test_a_run_resumed_into_epoch_4_trains_without_gt_sampling(counting_config, tools_cli, tmp_path):
    make, module_dir = counting_config
    count_dir, work_dir = tmp_path / 'counts', tmp_path / 'work'
    count_dir.mkdir()
    _train(tools_cli, make(False, 3), work_dir, count_dir, module_dir)
    assert (work_dir / 'epoch_3.pth').is_file() and not (work_dir / 'epoch_4.pth').exists()
    out = _train(tools_cli, make(False, 4), work_dir, count_dir, module_dir, '--auto-resume')
    assert 'GT sampling off from epoch 4 on' in out and (work_dir / 'epoch_4.pth').is_file()
    _assert_sampled_until_epoch_3(*_counts(count_dir))
