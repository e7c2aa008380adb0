"""The robustness studies (``tools/robustness_study.py --design``): their arms, what each model is and how it is made.

All on the camera-pass detector of ``make demo`` (``configs/demo/cmt_aqr_synthetic_tiny_passes.py``). The
``failures`` design (sensors that fail), in table order::

    lidar_only   the same detector trained from scratch on black camera views (every point cloud kept)
    camera_only  camera-only CMT (configs/demo/cmt_camera_synthetic_tiny.py) trained from scratch
    stage1       the baseline: the detector with AQR's window bias held fixed (routing off), from scratch
    control      stage 1 trained further with the stage-2 corruptions, routing still off
    global_gate  stage 2: one LiDAR / camera weight per sample, MoME's per-sample label
    aqr_targets  stage 2: CMT-AQR per query with per-query routing targets
    oracle       CMT-AQR's checkpoint, each query's weights replaced at test time by the input's truth

The ``lies`` design (sensors that give plausible but wrong evidence) trains
stage 1, the control, the global gate and CMT-AQR on the failures and the lies
(:data:`LIE_STAGE2_CORRUPTIONS`) with targets that know where a sensor lies,
adds CMT-AQR with the muting bias (``aqr_mute``) and tests the oracle with
``oracle_lies``. The ``finetune`` design runs the published fine-tune recipe
(``configs/finetune/``) at the demo's scale: stage 1 stands in for a trained
CMT, fine-tuned 1 epoch on clean data without (``control``) and with
(``aqr_finetune``) the router learning. Every stage-2 arm trains every parameter from the stage-1
checkpoint for the same epochs with the same train-time corruptions, so the
control differs from the routing arms only in that its router stays frozen.
:func:`arm_config` turns an arm into the mmcv ``Config`` its training runs.
"""
import os.path as osp
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

from mmcv import Config

from ..apis.robustness_eval import CLEAN, DEFAULT_CORRUPTIONS
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
#: The lie study's train-time corruptions: the failures and the four lies (each sample draws one of them).
LIE_CORRUPTIONS = (dict(spec='lidar_ghost:3', prob=0.1), dict(spec='view_yaw:2:20', prob=0.1),
                   dict(spec='lidar_misalign:0.4:2', prob=0.1), dict(spec='mixed_lie:120', prob=0.1))
LIE_STAGE2_CORRUPTIONS = SENSOR_FAILURE_CORRUPTIONS + LIE_CORRUPTIONS
#: What the lie study evaluates: clean, the lies, and the failures where a sensor or its objects go missing.
LIE_TEST_CORRUPTIONS = (CLEAN, *(item['spec'] for item in LIE_CORRUPTIONS), 'lidar_drop', 'camera_drop',
                        'object_drop:0.5', 'mixed:120')
#: The lie study's routing targets: per query (matched and unmatched) and per sample, they know where a sensor lies.
LIE_TARGETS = (('model.pts_bbox_head.aqr_config.lie_targets', True), )
UNMATCHED_TARGETS = (('model.pts_bbox_head.aqr_config.unmatched_loss_weight', 1.0), )


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
        cfg_options (tuple[tuple[str, Any]]): ``(key, value)`` settings merged into its config (mmcv's
            ``--cfg-options`` keys).
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
    cfg_options: Tuple[Tuple[str, Any], ...] = ()

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
MUTE_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny_passes_mute.py'
_LIE_ROUTING = LIE_TARGETS + UNMATCHED_TARGETS
LIE_STUDY_ARMS: Tuple[StudyArm, ...] = (
    STUDY_ARMS[2],
    StudyArm('control', 'control', 'the stage-1 config trained further for the stage-2 epochs with the failures and '
             'the lies, every parameter it trains, routing still off', STAGE1_CONFIG, 'stage2',
             train_corruptions=LIE_STAGE2_CORRUPTIONS),
    StudyArm('global_gate', 'global gate', 'one LiDAR and one camera weight per sample with MoME\'s per-sample label, '
             'which for a lie is the modality that lies anywhere in the sample (both under `mixed_lie`)',
             'configs/demo/cmt_aqr_synthetic_tiny_passes_global_gate.py', 'stage2',
             train_corruptions=LIE_STAGE2_CORRUPTIONS, cfg_options=LIE_TARGETS),
    StudyArm('aqr_targets', 'CMT-AQR', 'per query, with routing targets that know where a sensor lies (a yawed view '
             'or a misaligned cloud is no evidence, a query within 2 m of a ghost gets LiDAR 0), for the matched '
             'and the unmatched queries (unmatched_loss_weight=1)', ROUTING_CONFIG, 'stage2',
             train_corruptions=LIE_STAGE2_CORRUPTIONS, cfg_options=_LIE_ROUTING),
    StudyArm('aqr_mute', 'CMT-AQR mute', 'CMT-AQR with the same targets and the muting bias (mute_scale=5: a query '
             'that routes a modality away lowers all of its keys, not only its window)', MUTE_CONFIG, 'stage2',
             train_corruptions=LIE_STAGE2_CORRUPTIONS, cfg_options=_LIE_ROUTING),
    StudyArm('oracle', 'oracle', 'CMT-AQR\'s checkpoint with each query\'s weights replaced at test time by the '
             'truth that ignores the lies (`oracle_lies`: the object oracle with yawed views, a misaligned cloud and '
             'ghosts within 2 m muted): the headroom of the final router', ROUTING_CONFIG, 'none',
             test_routing='oracle_lies', evaluates='aqr_targets'),
)
#: The published fine-tune recipe at the demo's scale (``--design finetune``): its baseline and CMT-AQR twins.
FINETUNE_CONTROL_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny_passes_fixed_routing_finetune.py'
FINETUNE_ROUTING_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny_passes_finetune.py'
FINETUNE_TEST_CORRUPTIONS = (CLEAN, 'lidar_drop', 'camera_drop', 'lidar_ghost:3')
FINETUNE_ARMS: Tuple[StudyArm, ...] = (
    STUDY_ARMS[2],
    StudyArm('control', 'CMT fine-tune', 'stage 1, standing in for a trained CMT, fine-tuned as the published '
             'recipe (configs/finetune/): 1 epoch on clean data without GT sampling at 1/40 of the peak learning rate, '
             'routing still off', FINETUNE_CONTROL_CONFIG, 'stage2'),
    StudyArm('aqr_finetune', 'CMT-AQR fine-tune', 'the same fine-tune with the router and alpha learning (10x the '
             'learning rate) from the detection loss alone; loaded from stage 1, it starts exactly where stage 1 is',
             FINETUNE_ROUTING_CONFIG, 'stage2'),
)
#: The arm every paired difference is taken against.
REFERENCE_ARM = 'control'


@dataclass(frozen=True)
class StudyDesign:
    """One robustness study: its question, its arms and what they train and are tested on.

    Attributes:
        name (str): ``tools/robustness_study.py --design``.
        title (str): the report's title.
        arms (tuple[StudyArm]): in table order.
        stage2_corruptions (tuple[dict]): the train-time corruptions of its stage-2 arms (for the report).
        corruptions (tuple[str]): what it evaluates by default, ``clean`` first.
        report (str): the stem of its report files (``<report>.md``, ``.json``, ``_chart.png``, pictures).
        picture_corruptions (tuple[str]): the corruptions the routing pictures are drawn under.
    """

    name: str
    title: str
    arms: Tuple[StudyArm, ...]
    stage2_corruptions: Tuple[dict, ...]
    corruptions: Tuple[str, ...]
    report: str
    picture_corruptions: Tuple[str, ...]


STUDY_DESIGNS = {design.name: design for design in (
    StudyDesign('failures', 'Robustness study: does routing pay under sensor failures?', STUDY_ARMS,
                STAGE2_CORRUPTIONS, DEFAULT_CORRUPTIONS, 'study', ('object_drop:0.5', 'mixed:120')),
    StudyDesign('lies', 'Robustness study: does routing pay when sensors lie?', LIE_STUDY_ARMS,
                LIE_STAGE2_CORRUPTIONS, LIE_TEST_CORRUPTIONS, 'study_lies', ('lidar_ghost:3', 'mixed_lie:120')),
    StudyDesign('finetune', 'CMT-AQR from a trained CMT: does a routed fine-tune beat the same fine-tune without?',
                FINETUNE_ARMS, (), FINETUNE_TEST_CORRUPTIONS, 'study_finetune', ('lidar_ghost:3', )),
)}


def study_design(name: str) -> StudyDesign:
    """The design called ``name``; ``ValueError`` naming the designs otherwise."""
    if name not in STUDY_DESIGNS:
        raise ValueError(f'no study design {name!r}; the designs are {sorted(STUDY_DESIGNS)}')
    return STUDY_DESIGNS[name]


def study_arm(name: str, arms: Tuple[StudyArm, ...] = STUDY_ARMS) -> StudyArm:
    """The arm of ``arms`` called ``name``; ``ValueError`` naming the arms otherwise."""
    for arm in arms:
        if arm.name == name:
            return arm
    raise ValueError(f'no study arm {name!r}; the arms are {[arm.name for arm in arms]}')


def checkpoint_arm(arm: StudyArm, arms: Tuple[StudyArm, ...] = STUDY_ARMS) -> StudyArm:
    """The arm whose checkpoint ``arm`` is evaluated with: itself, or the arm of ``arms`` it ``evaluates``."""
    return arm if arm.is_trained else study_arm(arm.evaluates, arms)


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
    cfg.merge_from_dict({'runner.max_epochs': epochs, 'checkpoint_config.max_keep_ckpts': 1, 'load_from': load_from,
                         **dict(arm.cfg_options)})
    return cfg

