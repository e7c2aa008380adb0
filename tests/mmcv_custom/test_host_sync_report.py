"""mmcv_custom/host_sync_report.py: the host synchronisations of a window of iterations, counted where they are
made; CUDA's sync-debug mode replaced by a fake that records its settings (the warnings it would raise are raised
as torch raises them, through Python's warnings)."""
import inspect
import logging
import warnings

import pytest
import torch

from projects.mmdet3d_plugin.mmcv_custom.host_sync_report import SYNC_WARNING, HostSyncReportHook


class _Runner:
    def __init__(self):
        self.iter = 0
        self.messages = []
        self.logger = logging.getLogger('host_sync_test')
        self.logger.info = self.messages.append


def _synchronising_op():
    warnings.warn(SYNC_WARNING)  # what torch does at a synchronising op in sync-debug mode 'warn'
    return inspect.currentframe().f_lineno - 1


@pytest.fixture
def fake_cuda(monkeypatch):
    modes = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_sync_debug_mode', lambda: modes[-1] if modes else 0)
    monkeypatch.setattr(torch.cuda, 'set_sync_debug_mode', modes.append)
    return modes


def test_the_window_counts_each_place_per_iteration_and_restores_the_mode(fake_cuda):
    runner, hook = _Runner(), HostSyncReportHook(start=1, iters=2)
    hook.before_run(runner)
    for iteration in range(4):
        runner.iter = iteration
        hook.before_train_iter(runner)
        line = _synchronising_op()
        if iteration == 1:
            _synchronising_op()
            warnings.warn('an ordinary warning')  # shown as usual, not counted
        hook.after_train_iter(runner)
    assert fake_cuda == ['warn', 0, 'warn', 0]  # on in iterations 1 and 2 only, then back to off
    site = f'{__file__}:{line}'
    assert hook.sites == {site: 3} and hook.listed == 2
    assert runner.messages == [hook.report()]
    assert hook.report().splitlines() == ['HostSyncReportHook: iterations 1-2, host syncs / iter: 1.5',
                                          '| where | syncs / iter |', '|---|---:|', f'| {site} | 1.5 |']


def test_without_cuda_nothing_is_listed_and_bad_windows_are_refused():
    runner, hook = _Runner(), HostSyncReportHook(start=0, iters=1)
    if torch.cuda.is_available():
        pytest.skip('a CUDA machine lists the synchronisations')
    hook.before_run(runner)
    hook.before_train_iter(runner)
    _synchronising_op()
    hook.after_train_iter(runner)
    assert not hook.sites and 'no CUDA device' in runner.messages[0]
    with pytest.raises(ValueError, match='start >= 0 and iters >= 1'):
        HostSyncReportHook(iters=0)
