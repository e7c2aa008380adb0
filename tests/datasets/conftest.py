"""A tiny synthetic nuScenes set, converted with create_data once per test session, and the CMT pipelines for it.

v1.0-mini names, 1 train + 1 val scene of 2 key frames each, 2 sweeps per key
frame, 256x144 images and a 32x360-ray LiDAR: a few seconds to generate and
convert, yet every detection class appears with LiDAR points in every sample.

The train / test pipelines, the GT-database sampler, the classes and the
``Collect3D`` meta keys are those of the repository's fusion config
(``FUSION_CONFIG``); only the image augmentation sizes, the database path and
the randomness the tests need to control are replaced.
"""
import copy
import os.path as osp
from typing import Dict, List, Optional

import pytest

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
FUSION_CONFIG = osp.join(REPO_ROOT, 'configs', 'cmt_voxel0100_r50_800x320_cbgs.py')
SYNTHETIC_VERSION = 'v1.0-mini'
IMAGE_W, IMAGE_H = 256, 144
INPUT_MODALITY = dict(use_lidar=True, use_camera=True, use_radar=False, use_map=False, use_external=False)
#: The CMT data_aug_conf scaled to the small synthetic images (upstream: H=900, W=1600, final_dim=(320, 800)).
DATA_AUG_CONF = dict(resize_lim=(0.94, 1.25), final_dim=(128, 256), bot_pct_lim=(0.0, 0.0), rot_lim=(0.0, 0.0),
                     H=IMAGE_H, W=IMAGE_W, rand_flip=True)
NUM_LOADING_STEPS = 4  # points, sweeps, images, annotations


def _adapt(step: Dict, info_path: Optional[str], overrides: Dict[str, Dict]) -> Dict:
    """One config pipeline step for the synthetic set: small-image augmentation, local GT database, overrides."""
    step = copy.deepcopy(step)
    if 'data_aug_conf' in step:
        step['data_aug_conf'] = dict(DATA_AUG_CONF)
    if 'db_sampler' in step:
        step['db_sampler']['info_path'] = info_path
    if 'transforms' in step:
        step['transforms'] = [_adapt(t, info_path, overrides) for t in step['transforms']]
    step.update(overrides.get(step['type'], {}))
    return step


class FusionConfig:
    """The pieces of ``FUSION_CONFIG`` the tests use."""

    def __init__(self) -> None:
        from mmcv import Config
        cfg = Config.fromfile(FUSION_CONFIG)
        self.cfg = cfg
        self.CLASS_NAMES = list(cfg.class_names)
        self.IMG_NORM_CFG = dict(cfg.img_norm_cfg)
        self.META_KEYS = tuple(cfg.meta_keys)
        self.DATA_AUG_CONF = DATA_AUG_CONF
        self.VERSION = SYNTHETIC_VERSION
        self.IMAGE_SIZE = (IMAGE_W, IMAGE_H)
        self.LOADING_PIPELINE = [step.to_dict() for step in cfg.train_pipeline[:NUM_LOADING_STEPS]]

    def db_sampler_cfg(self, info_path: str) -> Dict:
        """The config's UnifiedDataBaseSampler on the given database."""
        return dict(copy.deepcopy(self.cfg.db_sampler.to_dict()), info_path=info_path)

    def train_pipeline(self, info_path: str, mixup_rate: float = 0.5, image_drop_prob: float = 0.25,
                       points_drop_prob: float = 0.25) -> List[Dict]:
        """The config's training pipeline with the given copy-paste blending and modality-drop rates."""
        overrides = dict(UnifiedObjectSample=dict(mixup_rate=mixup_rate),
                         ModalMask3D=dict(image_drop_prob=image_drop_prob, points_drop_prob=points_drop_prob))
        return [_adapt(step.to_dict(), info_path, overrides) for step in self.cfg.train_pipeline]

    def test_pipeline(self) -> List[Dict]:
        """The config's test pipeline."""
        return [_adapt(step.to_dict(), None, {}) for step in self.cfg.test_pipeline]

    def build_dataset(self, root: str, ann_file: str, pipeline: list, test_mode: bool, **kwargs):
        """A CustomNuScenesDataset on the synthetic root."""
        from mmdet3d.datasets import build_dataset
        import projects.mmdet3d_plugin  # noqa: F401
        return build_dataset(dict(type='CustomNuScenesDataset', data_root=root, ann_file=ann_file, pipeline=pipeline,
                                  classes=self.CLASS_NAMES, modality=INPUT_MODALITY, test_mode=test_mode,
                                  box_type_3d='LiDAR', **kwargs))


@pytest.fixture(scope='session')
def cmt() -> FusionConfig:
    """The fusion config's pipelines and settings, adapted to the synthetic set."""
    return FusionConfig()


@pytest.fixture(scope='session')
def synthetic_root(tmp_path_factory) -> str:
    """Data root of the tiny synthetic set."""
    from tools.data_converter.synthetic.generator import SyntheticConfig, generate_synthetic_nuscenes
    root = str(tmp_path_factory.mktemp('synthetic_nuscenes'))
    generate_synthetic_nuscenes(SyntheticConfig(root=root, version=SYNTHETIC_VERSION, num_scenes=2, num_val_scenes=1,
                                                samples_per_scene=2, sweeps_per_sample=2, seed=0,
                                                image_size=(IMAGE_W, IMAGE_H), objects_per_scene=14,
                                                lidar_beams=32, lidar_azimuths=360), log=None)
    return root


@pytest.fixture(scope='session')
def created_data(synthetic_root) -> dict:
    """``tools/create_data.py nuscenes`` output for the tiny set: split name / ``'dbinfos'`` -> file path."""
    import projects.mmdet3d_plugin  # noqa: F401  (registers the plugin)
    from tools.create_data import nuscenes_data_prep
    return nuscenes_data_prep(synthetic_root, synthetic_root, 'nuscenes', SYNTHETIC_VERSION, max_sweeps=10,
                              verbose=False)


@pytest.fixture(scope='session')
def loaded_sample(synthetic_root, created_data, cmt):
    """Factory of a fresh ``results`` dict of val sample 0 after the loading steps (points, sweeps, images, GT).

    A val sample, so that the GT database (made from the train scene) holds objects from elsewhere.
    """
    from mmdet3d.datasets.pipelines import Compose
    dataset = cmt.build_dataset(synthetic_root, created_data['val'], pipeline=[], test_mode=False)
    loading = Compose(copy.deepcopy(cmt.LOADING_PIPELINE))
    input_dict = dataset.get_data_info(0)
    dataset.pre_pipeline(input_dict)
    loaded = loading(input_dict)

    def fresh() -> dict:
        return copy.deepcopy(loaded)

    return fresh
