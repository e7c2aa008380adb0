"""Random state that depends only on ``(seed, epoch)``, so a resumed run repeats the interrupted one exactly.

A run resumed from the checkpoint of epoch ``e`` must draw the same random
numbers in epoch ``e + 1`` (augmentations, GT sampling, modality drop,
GridMask, denoising noise, dropout, the data loader's worker seeds) as the
run that was never interrupted. Saving the generators' states in the
checkpoint is not enough: hooks that run after the checkpoint hook at the end
of an epoch (evaluation creates a data loader, which draws from torch's
generator) consume random numbers the resumed run never sees. Re-seeding
python's ``random``, numpy and torch at the start of every epoch from
``(seed, epoch)`` makes the state at each epoch start the same in both runs;
the shuffling sampler (mmdet's ``DistributedGroupSampler``, see
``train.py``) already depends only on ``(seed, epoch)``.
"""
import numpy as np
from mmcv.runner import HOOKS, Hook
from mmdet.apis import set_random_seed


def epoch_seed(seed: int, epoch: int) -> int:
    """A 32-bit seed for ``epoch`` of a run seeded with ``seed`` (distinct epochs and seeds do not collide)."""
    return int(np.random.SeedSequence((seed % 2**32, epoch)).generate_state(1)[0])


@HOOKS.register_module()
class EpochSeedHook(Hook):
    """Seed python's ``random``, numpy and torch with :func:`epoch_seed` before every training epoch.

    Args:
        seed (int): the run's seed (``cfg.seed``, the same on every process).
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def before_train_epoch(self, runner) -> None:
        set_random_seed(epoch_seed(self.seed, runner.epoch))
