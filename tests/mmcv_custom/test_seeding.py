"""EpochSeedHook: the random state at an epoch start depends only on (seed, epoch)."""
import random
from types import SimpleNamespace

import numpy as np
import torch

from projects.mmdet3d_plugin.mmcv_custom.seeding import EpochSeedHook, epoch_seed


def _draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def _start_epoch(seed: int, epoch: int):
    EpochSeedHook(seed).before_train_epoch(SimpleNamespace(epoch=epoch))
    return _draws()


def test_random_state_at_an_epoch_start_is_a_function_of_seed_and_epoch():
    first = _start_epoch(seed=5, epoch=3)
    _draws()  # e.g. an evaluation between epochs
    assert _start_epoch(seed=5, epoch=3) == first
    others = [_start_epoch(seed=5, epoch=4), _start_epoch(seed=6, epoch=3), _start_epoch(seed=6, epoch=2)]
    for other in others:
        assert all(a != b for a, b in zip(other, first))


def test_epoch_seeds_do_not_collide_along_seed_plus_epoch():
    seeds = {epoch_seed(seed, epoch) for seed in range(20) for epoch in range(20)}
    assert len(seeds) == 400 and all(0 <= value < 2**32 for value in seeds)
    assert epoch_seed(-1, 0) == epoch_seed(2**32 - 1, 0)  # negative --seed values are accepted
