"""Testing a checkpoint on the test split: config, corruption, dataset, model and nuScenes metrics.

The test entry point (``tools/test.py``), beside the training one
(:mod:`.train`); ``tools/eval_robustness.py`` and ``tools/visualize_aqr.py``
test a model the same way::

    cfg = load_test_config('configs/demo/cmt_aqr_synthetic_tiny.py')
    samples_per_gpu = prepare_test_config(cfg)
    cfg = apply_corruption(cfg, 'fov:120', seed=0, logger=logger)
    dataset = build_dataset(cfg.data.test)
    model = build_test_model(cfg, checkpoint, dataset.CLASSES, logger=logger)
    outputs = single_gpu_test(wrap_model(model, 'cpu', False), build_test_loader(dataset, cfg, samples_per_gpu))
    metrics = evaluate_results(dataset, outputs, cfg, ['bbox'], logger=logger)
    nuscenes_scores(metrics)                 # {'mAP': ..., 'NDS': ...}
"""
import logging
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence, Union

from mmcv import Config
from mmcv.cnn import fuse_conv_bn
from mmcv.runner import wrap_fp16_model
from mmcv.utils import print_log
from mmdet.datasets import build_dataloader, replace_ImageToTensor
from mmdet3d.models import build_model
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..datasets.corruption_config import corrupt_config
from ..datasets.pipelines.corruption import parse_corruption
from ..mmcv_custom.launch import load_config
from ..models.dense_heads.query_router import TEST_ROUTINGS
from .checkpoint_loading import load_detector_checkpoint

#: ``evaluation`` config keys that belong to mmcv's EvalHook, not to ``dataset.evaluate``.
EVAL_HOOK_KEYS = ('interval', 'tmpdir', 'start', 'gpu_collect', 'save_best', 'rule')

Logger = Union[logging.Logger, str, None]


def load_test_config(config: str, cfg_options: Optional[dict] = None) -> Config:
    """The config file ``config`` with ``cfg_options`` merged in and its plugin imported, for single-process tools.

    The same as ``tools/test.py`` loads it (``mmcv_custom.launch.load_config``, local rank 0).
    """
    return load_config(SimpleNamespace(config=config, cfg_options=cfg_options, local_rank=0, work_dir=None))


def prepare_test_config(cfg: Config) -> int:
    """Set ``cfg`` up for testing in place: no pretrained weights, ``data.test`` in test mode.

    Returns:
        int: samples per batch (``data.test.samples_per_gpu``, popped; default 1).
    """
    cfg.model.pretrained = None
    cfg.data.test.test_mode = True
    samples_per_gpu = cfg.data.test.pop('samples_per_gpu', 1)
    if samples_per_gpu > 1:
        cfg.data.test.pipeline = replace_ImageToTensor(cfg.data.test.pipeline)
    return samples_per_gpu


def apply_corruption(cfg: Config, corruption: Optional[str], seed: int = 0, logger: Logger = None) -> Config:
    """``cfg`` whose val / test pipelines apply a test-time sensor corruption, and a log line saying so.

    Args:
        cfg (Config): the (test) config.
        corruption (str, optional): ``mode[:arg[:arg]]`` (see
            ``datasets.pipelines.corruption``); None keeps the inputs clean.
        seed (int): seed of the random corruptions.
        logger (logging.Logger | str, optional): where the line goes.

    Returns:
        Config: a corrupted copy (``cfg`` itself when ``corruption`` is None).

    Raises:
        ValueError: a bad spec, or a pipeline it cannot be inserted into.
    """
    if corruption is None:
        print_log('test-time corruption: none (clean inputs)', logger=logger)
        return cfg
    corrupted = corrupt_config(cfg, corruption, seed=seed)
    transform = dict(parse_corruption(corruption), seed=seed)
    print_log(f'test-time corruption {corruption}: {transform} inserted into the data.val / data.test pipelines '
              f'right after their loading steps', logger=logger)
    return corrupted


def build_test_loader(dataset: Dataset, cfg: Config, samples_per_gpu: int = 1, distributed: bool = False) -> DataLoader:
    """The ordered (unshuffled) data loader of ``dataset`` with the config's ``workers_per_gpu``."""
    return build_dataloader(dataset, samples_per_gpu=samples_per_gpu, workers_per_gpu=cfg.data.workers_per_gpu,
                            dist=distributed, shuffle=False)


def build_test_model(cfg: Config, checkpoint: str, classes: Sequence[str], logger: Logger = None,
                     fuse_bn: bool = False) -> nn.Module:
    """The detector of ``cfg.model`` with ``checkpoint``'s weights (on the CPU, not wrapped).

    Args:
        cfg (Config): the config (``fp16`` wraps the model for half precision).
        checkpoint (str): checkpoint file.
        classes (Sequence[str]): class names used when the checkpoint's
            ``meta`` has no ``CLASSES``.
        logger (logging.Logger | str, optional): reports missing / unexpected keys.
        fuse_bn (bool): fold BatchNorms into the preceding convolutions.

    Returns:
        nn.Module: the model, with ``CLASSES`` set.
    """
    model = build_model(cfg.model, train_cfg=None, test_cfg=cfg.get('test_cfg'))
    if cfg.get('fp16', None) is not None:
        wrap_fp16_model(model)
    state = load_detector_checkpoint(model, checkpoint, logger=logger)
    if fuse_bn:
        model = fuse_conv_bn(model)
    model.CLASSES = state.get('meta', {}).get('CLASSES', classes)
    return model


def evaluate_results(dataset: Dataset, outputs: List[dict], cfg: Config, metrics: Sequence[str],
                     logger: Logger = None, **options) -> Dict[str, float]:
    """``dataset.evaluate`` (official nuScenes devkit for ``bbox``) with the config's ``evaluation`` options.

    Args:
        dataset (Dataset): the test dataset the outputs belong to.
        outputs (list[dict]): per sample ``dict(pts_bbox=...)`` in dataset order.
        cfg (Config): its ``evaluation`` dict gives default options (EvalHook keys dropped).
        metrics (Sequence[str]): e.g. ``['bbox']``.
        logger (logging.Logger | str, optional): log of the evaluation.
        **options: further ``evaluate`` arguments (``jsonfile_prefix``, ...).

    Returns:
        dict[str, float]: e.g. ``pts_bbox_NuScenes/mAP``, ``pts_bbox_NuScenes/NDS``.
    """
    kwargs = {key: value for key, value in cfg.get('evaluation', {}).items() if key not in EVAL_HOOK_KEYS}
    kwargs.update(metric=list(metrics), **options)
    return dataset.evaluate(outputs, logger=logger, **kwargs)


def nuscenes_scores(metrics: Dict[str, float], result_name: str = 'pts_bbox') -> Dict[str, float]:
    """``{'mAP': ..., 'NDS': ...}`` of a nuScenes ``evaluate`` result.

    Raises:
        KeyError: the metrics hold no nuScenes detection scores for ``result_name``.
    """
    prefix = f'{result_name}_NuScenes'
    missing = [name for name in ('mAP', 'NDS') if f'{prefix}/{name}' not in metrics]
    if missing:
        raise KeyError(f'no {", ".join(f"{prefix}/{name}" for name in missing)} in the evaluation metrics '
                       f'{sorted(metrics)[:8]}...: was it a nuScenes bbox evaluation?')
    return {name: float(metrics[f'{prefix}/{name}']) for name in ('mAP', 'NDS')}


def set_test_routing(model: nn.Module, routing: str) -> None:
    """Make the CMT-AQR head of ``model`` (bare or wrapped) route with ``routing`` at test time.

    ``'learned'``: the router's weights; ``'oracle'``: the input's truth; ``'oracle_objects'``: the input's truth
    counting only LiDAR points above the local ground; ``'oracle_lies'``: that truth where the sensors do not lie
    (``test_cfg['aqr_routing']``, see ``models/dense_heads/query_router.py``).
    """
    if routing not in TEST_ROUTINGS:
        raise ValueError(f'routing must be one of {TEST_ROUTINGS}, got {routing!r}')
    head = getattr(getattr(model, 'module', model), 'pts_bbox_head', None)
    if not getattr(head, 'with_query_routing', False):
        if routing == 'learned':
            return
        raise ValueError(f'{routing} routing needs a CMT-AQR model (a CmtHead with aqr_config); '
                         f'{type(head).__name__} routes nothing')
    head.test_cfg = dict(head.test_cfg or {}, aqr_routing=routing)
