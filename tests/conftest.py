"""Shared pytest setup: deterministic seeds, the cores split between parallel workers, the slow tests first.

Under pytest-xdist (``tools/run_tests.sh`` runs the whole suite in one worker per core, up to 4) each worker gets
its share of the cores for torch's threads and for the tools the tests start (``OMP_NUM_THREADS``); in one process
the tests use up to 2 threads.
"""
import os
import random
import sys
from typing import List

import numpy as np
import pytest
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from projects.mmdet3d_plugin.utils.local_resources import usable_cores  # noqa: E402 (needs the repository on sys.path)


def threads_per_worker(cores: int, workers: int) -> int:
    """Torch threads for one of ``workers`` test processes sharing ``cores``: at least 1, at most 2."""
    return max(1, min(2, cores // max(1, workers)))


_WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
_THREADS = threads_per_worker(usable_cores(), _WORKERS)
torch.set_num_threads(_THREADS)
if _WORKERS > 1:
    os.environ.setdefault('OMP_NUM_THREADS', str(_THREADS))


def slow_seconds(item: pytest.Item) -> float:
    """The seconds a test's ``slow`` mark says it takes on 2 cores; 0 for a test without the mark."""
    mark = item.get_closest_marker('slow')
    if mark is None:
        return 0.0
    if 'seconds' not in mark.kwargs:
        raise pytest.UsageError(f'{item.nodeid}: write @pytest.mark.slow(seconds=N), N its time on 2 cores')
    return float(mark.kwargs['seconds'])


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """Under parallel workers, the slow tests first, slowest first: the workers start them together instead of one
    worker running them at the end. In one process the order stays pytest's (module fixtures set up once)."""
    seconds = {item.nodeid: slow_seconds(item) for item in items}
    if _WORKERS > 1:
        items.sort(key=lambda item: -seconds[item.nodeid])


@pytest.fixture
def reference_threads():
    """Torch on 2 threads for the test, as the recorded reference outputs under ``tests/data/reference`` were
    computed: a bit-for-bit comparison depends on the thread count (the order of the CPU kernels' sums)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def slot_formulations_used(monkeypatch) -> List[str]:
    """The formulation of every ``SlotPattern.weighted_sum`` call during the test (window slot products,
    ``attention/slots/window_slots.py``): which formulation really ran."""
    from projects.mmdet3d_plugin.attention.slots.window_slots import SlotPattern
    used: List[str] = []
    original = SlotPattern.weighted_sum

    def recording(self, *args, **kwargs):
        used.append(self.formulation)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SlotPattern, 'weighted_sum', recording)
    return used
