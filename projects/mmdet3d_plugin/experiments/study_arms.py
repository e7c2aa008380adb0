"""The arms of the robustness study (``tools/robustness_study.py``): what each model is and how it is made.

All on the camera-pass detector of ``make demo`` (``configs/demo/cmt_aqr_synthetic_tiny_passes.py``), in table
order::

    lidar_only   the same detector trained from scratch on black camera views (every point cloud kept)
    camera_only  camera-only CMT (configs/demo/cmt_camera_synthetic_tiny.py) trained from scratch
    stage1       the baseline: the detector with AQR's window bias held fixed (routing off), from scratch
    control      stage 1 trained further with the stage-2 corruptions, routing still off
    global_gate  stage 2: one LiDAR / camera weight per sample, MoME's per-sample label
    aqr_targets  stage 2: CMT-AQR per query with per-query routing targets
    oracle       CMT-AQR's checkpoint, each query's weights replaced at test time by the input's truth

Every stage-2 arm trains every parameter (detector and router) from the
stage-1 checkpoint for the same epochs with the same train-time corruptions
(:data:`STAGE2_CORRUPTIONS`), so the control differs from the routing arms
only in that its router stays frozen.

:func:`arm_config` turns an arm into the mmcv ``Config`` its training runs.
"""
import os.path as osp
from dataclasses import dataclass
from typing import Optional, Tuple, Union

from mmcv import Config

from ..datasets.corruption_config import SENSOR_FAILURE_CORRUPTIONS, add_train_corruptions, train_pipelines
from ..datasets.data_root_config import retarget_data_root

#: How an arm gets its checkpoint: trained from scratch for the stage-1 epochs, trained from the stage-1
#: checkpoint for the stage-2 epochs, or none of its own (it evaluates another arm's checkpoint).
TRAININGS = ('stage1', 'stage2', 'none')
STAGE1_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny_passes_fixed_routing.py'
#: make demo's camera-pass CMT-AQR: every parameter trains, the router with per-query routing targets.
ROUTING_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny_passes.py'
#: The LiDAR-only model's ModalMask3D: every camera view black, every point cloud kept (docs/demo.md: 0.482 on the
#: demo data with make demo's recipe).
LIDAR_ONLY_DROP = (1.0, 0.0)
#: The train-time corruptions of every stage-2 arm: the sensor failures make demo's CMT-AQR fine-tunes on.
STAGE2_CORRUPTIONS = SENSOR_FAILURE_CORRUPTIONS


@dataclass(frozen=True)
class StudyArm:
    """One model of the study.

    Attributes:
        name (str): key in tables, JSON and work dirs.
        label (str): column title.
        description (str): what it is, for the report.
        config (str): the config it trains (``training='none'``: the config of the arm it evaluates).
        training (str): one of :data:`TRAININGS`.
        test_routing (str): AQR's routing at test time, ``'learned'`` or an oracle (``query_router.ORACLE_TRUTHS``).
        train_corruptions (tuple[dict]): ``RandomSensorCorruption`` items added to the training pipeline.
        modality_drop (tuple[float, float] | str): the training pipeline's ``ModalMask3D`` (image, points) drop
            probabilities; ``'study'``: the study's options; ``'none'``: the config has no such step (a model
            without one of the sensors).
        evaluates (str, optional): ``training='none'`` only: the trained arm whose checkpoint it evaluates.
    """

    name: str
    label: str
    description: str
    config: str
    training: str
    test_routing: str = 'learned'
    train_corruptions: Tuple[dict, ...] = ()
    modality_drop: Union[str, Tuple[float, float]] = 'study'
    evaluates: Optional[str] = None

    def __post_init__(self) -> None:
        if self.training not in TRAININGS:
            raise ValueError(f'arm {self.name}: training must be one of {TRAININGS}, got {self.training!r}')
        if (self.training == 'none') != (self.evaluates is not None):
            raise ValueError(f"arm {self.name}: an arm evaluates another arm's checkpoint (evaluates=...) exactly "
                             f"when it trains none of its own (training='none'), got training={self.training!r}, "
                             f'evaluates={self.evaluates!r}')
        if isinstance(self.modality_drop, str) and self.modality_drop not in ('study', 'none'):
            raise ValueError(f"arm {self.name}: modality_drop must be (image, points), 'study' or 'none', got "
                             f'{self.modality_drop!r}')

    @property
    def is_trained(self) -> bool:
        """Whether the arm trains a checkpoint of its own."""
        return self.training != 'none'


STUDY_ARMS: Tuple[StudyArm, ...] = (
    StudyArm('lidar_only', 'LiDAR only', 'the stage-1 detector trained from scratch on black camera views in every '
             'sample and every point cloud kept: what this data\'s LiDAR alone detects', STAGE1_CONFIG, 'stage1',
             modality_drop=LIDAR_ONLY_DROP),
    StudyArm('camera_only', 'camera only', 'camera-only CMT (CmtImageHead, the camera locality prior and learning '
             'aids) trained from scratch: what this data\'s cameras alone detect',
             'configs/demo/cmt_camera_synthetic_tiny.py', 'stage1', modality_drop='none'),
    StudyArm('stage1', 'stage 1', 'make demo\'s camera-pass CMT-AQR (fused and camera passes) with AQR\'s window '
             'bias held fixed: router and alpha frozen at their initialisation, every query trusts LiDAR and camera '
             'equally (weights 0.9 ± 0.01, a +4 window bias), everything else trains', STAGE1_CONFIG, 'stage1'),
    StudyArm('control', 'control', 'the stage-1 config trained further for the stage-2 epochs with the stage-2 '
             'corruptions, every parameter it trains, routing still off: what the extra training and the '
             'corruptions give without routing', STAGE1_CONFIG, 'stage2', train_corruptions=STAGE2_CORRUPTIONS),
    StudyArm('global_gate', 'global gate', 'one LiDAR and one camera weight per sample (the router\'s logits '
             'averaged over the queries) with MoME\'s per-sample label (the modality the sample lost, '
             'aux_loss_weight=1) next to the detection loss',
             'configs/demo/cmt_aqr_synthetic_tiny_passes_global_gate.py', 'stage2',
             train_corruptions=STAGE2_CORRUPTIONS),
    StudyArm('aqr_targets', 'CMT-AQR', 'per query, with per-query routing targets (query_loss_weight=1: LiDAR = '
             'the matched object\'s box keeps >= 5 points, camera = its centre is in a live view)', ROUTING_CONFIG,
             'stage2', train_corruptions=STAGE2_CORRUPTIONS),
    StudyArm('oracle', 'oracle', 'CMT-AQR\'s checkpoint with each query\'s weights replaced at test time by the '
             'corrupted input\'s truth (LiDAR 1 where its BEV window holds points, camera 1 where a live view sees '
             'it): the headroom of the final router', ROUTING_CONFIG, 'none', test_routing='oracle',
             evaluates='aqr_targets'),
)
#: The arm every paired difference is taken against.
REFERENCE_ARM = 'control'


def study_arm(name: str) -> StudyArm:
    """The arm called ``name``; ``ValueError`` naming the arms otherwise."""
    for arm in STUDY_ARMS:
        if arm.name == name:
            return arm
    raise ValueError(f'no study arm {name!r}; the arms are {[arm.name for arm in STUDY_ARMS]}')


def checkpoint_arm(arm: StudyArm) -> StudyArm:
    """The arm whose checkpoint ``arm`` is evaluated with: itself, or the arm it ``evaluates``."""
    return arm if arm.is_trained else study_arm(arm.evaluates)


def set_modality_drop(cfg: Config, image_drop: float, lidar_drop: float) -> None:
    """Set the drop probabilities of the ``ModalMask3D`` step of ``cfg``'s training pipeline (in place).

    Raises:
        ValueError: the training pipeline has no ``ModalMask3D`` step.
    """
    steps = [step for pipeline in train_pipelines(cfg) for step in pipeline if step['type'] == 'ModalMask3D']
    if not steps:
        raise ValueError('the training pipeline has no ModalMask3D step: the study trains with modality drop')
    for step in steps:
        step.update(image_drop_prob=image_drop, points_drop_prob=lidar_drop)


def arm_config(arm: StudyArm, data_root: str, epochs: int, image_drop: float, lidar_drop: float,
               load_from: Optional[str] = None, repo_root: str = '.') -> Config:
    """The config that trains ``arm`` on the study's data set.

    Args:
        arm (StudyArm): a trained arm.
        data_root (str): the synthetic set (relative to ``repo_root``).
        epochs (int): training epochs.
        image_drop (float): ``ModalMask3D``: probability that a sample loses its images (arms whose
            ``modality_drop`` is ``'study'``).
        lidar_drop (float): ``ModalMask3D``: probability that it loses its points instead (likewise).
        load_from (str, optional): the checkpoint it starts from (stage 2).
        repo_root (str): where the config and data paths are relative to.

    Returns:
        Config: keeps one checkpoint.
    """
    cfg = retarget_data_root(Config.fromfile(osp.join(repo_root, arm.config)), osp.join(repo_root, data_root))
    if arm.modality_drop != 'none':
        set_modality_drop(cfg, *((image_drop, lidar_drop) if arm.modality_drop == 'study' else arm.modality_drop))
    if arm.train_corruptions:
        add_train_corruptions(cfg, arm.train_corruptions)
    cfg.merge_from_dict({'runner.max_epochs': epochs, 'checkpoint_config.max_keep_ckpts': 1, 'load_from': load_from})
    return cfg

