"""``train_detector``: the training entry point (``tools/train.py``), beside the test one (:mod:`.test`).

mmdet's training loop (epoch- or iteration-based, :func:`seed_sync_on`), on GPU or CPU, single-process or
distributed: the steps of mmdet 2.x's ``train_detector`` (data loaders, model wrapper, optimizer, runner, hooks,
evaluation, resume), except that

* the model is wrapped by ``mmcv_custom.parallel.wrap_model``, which also handles distributed runs on CPU, after
  the ``FreezeParametersHook`` of ``cfg.custom_hooks`` froze its parameters
  (``mmcv_custom.freeze_parameters.freeze_before_wrapping``), so that ``DistributedDataParallel`` registers only
  the trainable ones;
* a resumed run sees the data order and random numbers of the interrupted one: the training order depends only
  on ``(seed, epoch)`` (mmdet's seeded ``DistributedGroupSampler``, in single-process runs too), and
  ``mmcv_custom.seeding.EpochSeedHook`` re-seeds the random generators at every epoch start;
* the training log is read once per logging interval: the detector keeps its log variables on the device, the
  runner's ``log_buffer`` is a ``mmcv_custom.device_log.DeviceLogBuffer``, and an ``optimizer_config`` without a
  ``type`` builds ``DeviceLogOptimizerHook``;
* ``load_from`` reports AQR's parameters that a CMT checkpoint lacks apart from any other missing key, and
  refuses a checkpoint of another config (:func:`.checkpoint_loading.load_detector_checkpoint`);
* auto-resume takes the newest checkpoint that loads, found once by rank 0 for every process
  (``mmcv_custom.checkpoint.find_resume_checkpoint_once``), and an explicit ``resume_from`` that does not load is
  a clear error.

:func:`linear_scaled_lr` is ``--autoscale-lr``'s rule.
"""
import contextlib
import functools
from typing import Iterator, Optional, Sequence
from unittest import mock

from mmcv import Config
from mmcv.runner import DistSamplerSeedHook, EpochBasedRunner, build_runner
from mmdet.core import DistEvalHook, EvalHook, build_optimizer
from mmdet.datasets import build_dataloader
from mmdet.utils import compat_cfg, get_root_logger
from mmdet3d.datasets import build_dataset

from ..mmcv_custom.checkpoint import check_resumable, find_resume_checkpoint_once
from ..mmcv_custom.device_log import DeviceLogBuffer
from ..mmcv_custom.freeze_parameters import freeze_before_wrapping
from ..mmcv_custom.parallel import wrap_model
from ..mmcv_custom.seeding import EpochSeedHook
from .checkpoint_loading import load_detector_checkpoint

#: The number of GPUs (processes) the configs' learning rates are set for, as in mmdet3d.
REFERENCE_GPUS = 8


@contextlib.contextmanager
def seed_sync_on(device: str) -> Iterator[None]:
    """While open, mmdet's ``InfiniteGroupBatchSampler`` (the sampler of ``IterBasedRunner``) broadcasts its seed
    through a tensor on ``device``: mmdet puts it on CUDA, which a CPU (gloo) process group cannot use."""
    from mmdet.core.utils import sync_random_seed
    from mmdet.datasets.samplers import infinite_sampler
    with mock.patch.object(infinite_sampler, 'sync_random_seed', functools.partial(sync_random_seed, device=device)):
        yield


def linear_scaled_lr(lr: float, num_gpus: int, reference_gpus: int = REFERENCE_GPUS) -> float:
    """mmdet3d's ``--autoscale-lr``: ``lr`` set for ``reference_gpus`` processes, scaled to ``num_gpus``.

    The linear scaling rule (Goyal et al., 2017): the total batch size is
    ``num_gpus x data.samples_per_gpu``, and the configs' learning rates are set
    for ``reference_gpus`` processes of their ``samples_per_gpu``, so the rate
    becomes ``lr * num_gpus / reference_gpus``.
    """
    if num_gpus < 1 or reference_gpus < 1:
        raise ValueError(f'linear_scaled_lr needs positive process counts, got {num_gpus} and {reference_gpus}')
    return lr * num_gpus / reference_gpus


def train_detector(model, datasets: Sequence, cfg: Config, distributed: bool = False, validate: bool = False,
                   timestamp: Optional[str] = None, meta: Optional[dict] = None) -> None:
    """Train ``model`` on ``datasets`` as ``cfg`` says.

    Args:
        model (nn.Module): the detector (weights initialised).
        datasets (Sequence[Dataset]): one dataset per workflow phase.
        cfg (Config): the full config; ``cfg.device`` (``'cuda'``/``'cpu'``),
            ``cfg.gpu_ids`` and ``cfg.seed`` must be set.
        distributed (bool): a process group is running.
        validate (bool): evaluate on ``cfg.data.val`` as ``cfg.evaluation`` says.
        timestamp (str, optional): shared by the ``.log`` and ``.log.json`` files.
        meta (dict, optional): stored in the checkpoints.
    """
    cfg = compat_cfg(cfg)
    logger = get_root_logger(log_level=cfg.log_level)
    runner_type = cfg.runner['type']
    # compat_cfg moved data.samples_per_gpu / workers_per_gpu into data.train_dataloader etc.
    # dist=True: the (seed, epoch)-shuffled DistributedGroupSampler, also without a process group (rank 0 of 1).
    loader_args = dict(samples_per_gpu=2, workers_per_gpu=2, dist=True, seed=cfg.seed, runner_type=runner_type,
                       persistent_workers=False)
    loader_args.update(cfg.data.train_dataloader)
    with seed_sync_on(cfg.device):
        data_loaders = [build_dataloader(dataset, **loader_args) for dataset in datasets]

    freeze_before_wrapping(model, cfg.get('custom_hooks', None))
    if hasattr(model, 'keep_log_vars_on_device'):
        model.keep_log_vars_on_device = True
    model = wrap_model(model, cfg.device, distributed, gpu_ids=cfg.gpu_ids, broadcast_buffers=False,
                       find_unused_parameters=cfg.get('find_unused_parameters', False))
    optimizer = build_optimizer(model, cfg.optimizer)
    runner = build_runner(cfg.runner, default_args=dict(model=model, optimizer=optimizer, work_dir=cfg.work_dir,
                                                        logger=logger, meta=meta))
    runner.timestamp = timestamp
    runner.log_buffer = DeviceLogBuffer()
    optimizer_config = cfg.optimizer_config
    if isinstance(optimizer_config, dict) and 'type' not in optimizer_config:
        optimizer_config = dict(optimizer_config, type='DeviceLogOptimizerHook')
    runner.register_training_hooks(cfg.lr_config, optimizer_config, cfg.checkpoint_config, cfg.log_config,
                                   cfg.get('momentum_config', None),
                                   custom_hooks_config=cfg.get('custom_hooks', None))
    if isinstance(runner, EpochBasedRunner):
        runner.register_hook(DistSamplerSeedHook())
        runner.register_hook(EpochSeedHook(cfg.seed), priority='VERY_HIGH')
    if validate:
        val_dataset = build_dataset(cfg.data.val, dict(test_mode=True))
        val_args = dict(samples_per_gpu=1, workers_per_gpu=2, dist=distributed, shuffle=False)
        val_args.update(cfg.data.val_dataloader)
        eval_cfg = dict(cfg.get('evaluation', {}), by_epoch=runner_type != 'IterBasedRunner')
        eval_hook = DistEvalHook if distributed else EvalHook
        runner.register_hook(eval_hook(build_dataloader(val_dataset, **val_args), **eval_cfg), priority='LOW')

    resume_from = cfg.resume_from
    if resume_from is None and cfg.get('auto_resume'):
        resume_from = find_resume_checkpoint_once(cfg.work_dir, logger)
        if resume_from is None:
            logger.info(f'auto-resume: no checkpoint to resume from in {cfg.work_dir}, starting from scratch')
    if resume_from:
        check_resumable(resume_from)
        runner.resume(resume_from)
    elif cfg.load_from:
        load_detector_checkpoint(runner.model, cfg.load_from, logger, purpose='load_from')
    runner.run(data_loaders, cfg.workflow)
