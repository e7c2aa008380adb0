"""``DisableObjectSampleHook``: GT sampling off for the last epochs (upstream CMT's "15e + 5e" in one run).

mmdet3d 1.1's hook of the same name and meaning, for the mmcv 1.x ``EpochBasedRunner``: from epoch
``disable_after_epoch`` on (0-based, as ``runner.epoch``: ``disable_after_epoch=15`` of 20 trains epochs 1–15
with GT sampling and 16–20 without), the training pipeline has no GT-sampling transform (mmdet3d's
``ObjectSample``, the plugin's ``UnifiedObjectSample``). The transforms are removed from every pipeline of the
training set, through its wrappers (``CBGSDataset``, ``RepeatDataset``, ``ConcatDataset``, ...). Every process
runs its own hook before its epoch's data loader starts its workers; a loader with persistent workers (which
hold a copy of the dataset made when they started) has its workers restarted, so they see the new pipeline. A run
resumed at or after the switch epoch removes the transforms before its first epoch. One log line when it
switches; a warning when the training set has no GT sampling to turn off, or when the runner does not count
epochs (``IterBasedRunner``: the hook does nothing).
"""
from typing import Iterator, List, Optional

from mmcv.runner import HOOKS, EpochBasedRunner, Hook
from mmdet3d.datasets.pipelines import ObjectSample
from torch.utils.data import DataLoader

from ..datasets.pipelines.object_sample import UnifiedObjectSample

#: The GT-sampling transforms the hook removes.
GT_SAMPLING_TRANSFORMS = (ObjectSample, UnifiedObjectSample)


def dataset_pipelines(dataset) -> Iterator:
    """The ``Compose`` pipelines of ``dataset`` and of every dataset it wraps (``dataset`` / ``datasets``)."""
    pipeline = getattr(dataset, 'pipeline', None)
    if pipeline is not None and hasattr(pipeline, 'transforms'):
        yield pipeline
    inner = getattr(dataset, 'dataset', None)
    if inner is not None:
        yield from dataset_pipelines(inner)
    for member in getattr(dataset, 'datasets', None) or []:
        yield from dataset_pipelines(member)


def remove_gt_sampling(dataset) -> List[str]:
    """Remove the GT-sampling transforms from every pipeline of ``dataset``.

    Returns:
        list[str]: the class names of the removed transforms (empty when there were none left).
    """
    removed = []
    for pipeline in dataset_pipelines(dataset):
        kept = [t for t in pipeline.transforms if not isinstance(t, GT_SAMPLING_TRANSFORMS)]
        removed += [type(t).__name__ for t in pipeline.transforms if isinstance(t, GT_SAMPLING_TRANSFORMS)]
        pipeline.transforms[:] = kept
    return removed


def has_gt_sampling(dataset) -> bool:
    """Whether a pipeline of ``dataset`` (or of a dataset it wraps) has a GT-sampling transform."""
    return any(isinstance(t, GT_SAMPLING_TRANSFORMS) for p in dataset_pipelines(dataset) for t in p.transforms)


def restart_persistent_workers(data_loader: DataLoader) -> bool:
    """Shut down the persistent workers of ``data_loader``, so that its next epoch starts new ones.

    Returns:
        bool: whether there were workers to restart.
    """
    iterator = getattr(data_loader, '_iterator', None)
    if not getattr(data_loader, 'persistent_workers', False) or iterator is None:
        return False
    shutdown = getattr(iterator, '_shutdown_workers', None)
    if shutdown is not None:
        shutdown()
    data_loader._iterator = None
    return True


@HOOKS.register_module()
class DisableObjectSampleHook(Hook):
    """Train without GT sampling from epoch ``disable_after_epoch`` on.

    Args:
        disable_after_epoch (int, optional): the number of epochs trained with GT sampling (upstream CMT: 15 of 20);
            ``None`` keeps GT sampling for the whole run (the switch of a config that has the hook, turned off:
            ``--cfg-options custom_hooks.0.disable_after_epoch=None``).
    """

    def __init__(self, disable_after_epoch: Optional[int] = 15) -> None:
        if disable_after_epoch is not None and (isinstance(disable_after_epoch, bool)
                                                or not isinstance(disable_after_epoch, int) or disable_after_epoch < 0):
            raise ValueError(f'DisableObjectSampleHook: disable_after_epoch must be an epoch count >= 0 or None, '
                             f'got {disable_after_epoch!r}')
        self.disable_after_epoch = disable_after_epoch
        self._checked = False

    def before_run(self, runner) -> None:
        if not isinstance(runner, EpochBasedRunner):
            runner.logger.warning(f'DisableObjectSampleHook counts epochs: under {type(runner).__name__} it does '
                                  f'nothing, GT sampling stays on')
        elif self.disable_after_epoch is None:
            runner.logger.info('DisableObjectSampleHook: disable_after_epoch=None, GT sampling stays on every epoch')

    def before_train_epoch(self, runner) -> None:
        dataset = runner.data_loader.dataset
        if not self._checked:
            self._checked = True
            if not has_gt_sampling(dataset):
                pipelines = [[type(t).__name__ for t in p.transforms] for p in dataset_pipelines(dataset)]
                runner.logger.warning(f'DisableObjectSampleHook: the training pipeline has no GT sampling '
                                      f'({", ".join(t.__name__ for t in GT_SAMPLING_TRANSFORMS)}) to turn off; '
                                      f'its pipelines: {pipelines}')
                return
        if self.disable_after_epoch is None or runner.epoch < self.disable_after_epoch:
            return
        removed = remove_gt_sampling(dataset)
        if removed:
            restarted = restart_persistent_workers(runner.data_loader)
            runner.logger.info(f'DisableObjectSampleHook: GT sampling off from epoch {runner.epoch + 1} on '
                               f'(disable_after_epoch={self.disable_after_epoch}): removed {", ".join(removed)} from '
                               f'the training pipeline' + ('; data loader workers restarted' if restarted else ''))
