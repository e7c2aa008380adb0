"""``HostSyncReportHook``: where training iterations make the host wait for the GPU, listed in the log.

``custom_hooks = [dict(type='HostSyncReportHook', start=5, iters=10)]`` (``tools/check_published_configs.py
--host-syncs`` adds it) puts CUDA's sync-debug mode at ``'warn'`` for iterations ``start`` to
``start + iters - 1`` (counted from 0): every operation that makes the host wait for the device in the data
transfer, the forward, the losses, the backward and the optimizer hook (with mixed precision, the loss scaler's
read of its inf check) raises a warning, which the hook catches and counts by the innermost frame outside torch.
After the last of those iterations it logs one table: each place and its synchronisations per iteration, and the
total per iteration (``host syncs / iter``). Blocks marked ``permitted_host_sync`` (voxelization, the Hungarian
matching on the host) switch the mode off and are not counted. Without CUDA it logs that there is nothing to list
(``tools/check_gpu.py --device cpu`` records the ops that would wait, ``utils/host_data.SyncingOpRecorder``).
"""
import warnings
from collections import Counter
from typing import Optional

import torch
from mmcv.runner import HOOKS, Hook

from ..utils.host_data import calling_site

#: The text of the warning CUDA's sync-debug mode raises at a synchronising operation.
SYNC_WARNING = 'called a synchronizing CUDA operation'


@HOOKS.register_module()
class HostSyncReportHook(Hook):
    """Count the host synchronisations of ``iters`` training iterations from iteration ``start`` (see the module
    docstring). Runs after every other hook of an iteration (priority ``LOWEST``), so the optimizer hook's
    synchronisations are in its window.

    Args:
        start (int): the first listed iteration (0-based; the first ones warm up caches and allocators).
        iters (int): how many iterations are listed.

    Attributes:
        sites (Counter): ``file:line`` -> synchronisations there over the listed iterations.
        listed (int): iterations listed so far.
    """

    priority = 'LOWEST'

    def __init__(self, start: int = 5, iters: int = 10) -> None:
        if start < 0 or iters < 1:
            raise ValueError(f'HostSyncReportHook needs start >= 0 and iters >= 1, got start={start}, iters={iters}')
        self.start, self.iters = start, iters
        self.sites: Counter = Counter()
        self.listed = 0
        self._catcher: Optional[warnings.catch_warnings] = None
        self._previous_mode = 0

    def before_run(self, runner) -> None:
        if not torch.cuda.is_available():
            runner.logger.info('HostSyncReportHook: no CUDA device, no host synchronisation to list (the sync-debug '
                               'mode is CUDA\'s; tools/check_gpu.py --device cpu records the ops that would wait)')

    def _in_window(self, runner) -> bool:
        return torch.cuda.is_available() and self.start <= runner.iter < self.start + self.iters

    def before_train_iter(self, runner) -> None:
        if not self._in_window(runner):
            return
        self._catcher = warnings.catch_warnings()
        self._catcher.__enter__()
        warnings.simplefilter('always')
        shown = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if SYNC_WARNING in str(message):
                self.sites[calling_site(skip=(__file__, warnings.__file__))] += 1
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        self._previous_mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode('warn')

    def after_train_iter(self, runner) -> None:
        if self._catcher is None:
            return
        torch.cuda.set_sync_debug_mode(self._previous_mode)
        self._catcher.__exit__(None, None, None)
        self._catcher = None
        self.listed += 1
        if self.listed == self.iters:
            runner.logger.info(self.report())

    def report(self) -> str:
        """The table of the listed iterations: each place's synchronisations per iteration, most first."""
        per_iter = sum(self.sites.values()) / max(self.listed, 1)
        lines = [f'HostSyncReportHook: iterations {self.start}-{self.start + self.listed - 1}, host syncs / iter: '
                 f'{per_iter:g}', '| where | syncs / iter |', '|---|---:|']
        lines += [f'| {site} | {count / self.listed:g} |' for site, count in self.sites.most_common()]
        return '\n'.join(lines)
