"""The plugin package imports, registers its modules and keeps optional CUDA packages optional."""
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Registry names of the upstream CMT plugin (../shared/reference/README.md);
# configs and checkpoints written for CMT refer to these.
UPSTREAM_REGISTRY_NAMES = {
    'models': ['CmtDetector', 'CmtHead', 'CmtImageHead', 'CmtLidarHead', 'SeparateTaskHead', 'VoVNet', 'CPFPN'],
    'transformer': ['CmtTransformer', 'CmtLidarTransformer', 'CmtImageTransformer'],
    'attention': ['PETRMultiheadAttention', 'PETRMultiheadFlashAttention'],
    'sequence': ['PETRTransformerDecoder'],
    'layer': ['PETRTransformerDecoderLayer'],
    'assigner': ['HungarianAssigner3D'],
    'coder': ['MultiTaskBBoxCoder'],
    'match_cost': ['BBox3DL1Cost', 'BBoxBEVL1Cost', 'IoU3DCost'],
    'dataset': ['CustomNuScenesDataset'],
    'pipeline': ['PadMultiViewImage', 'NormalizeMultiviewImage', 'UnifiedObjectSample', 'ResizeCropFlipImage',
                 'GlobalRotScaleTransAll', 'CustomRandomFlip3D', 'ModalMask3D', 'GlobalRotScaleTransImage'],
    'object_sampler': ['UnifiedDataBaseSampler'],
}
AQR_REGISTRY_NAMES = ['AQRWeightGenerator', 'AttentionBiasGenerator', 'WeightRenderer', 'FeatureModulator']


def _registries():
    from mmcv.cnn.bricks.registry import ATTENTION, TRANSFORMER_LAYER, TRANSFORMER_LAYER_SEQUENCE
    from mmdet.core.bbox.builder import BBOX_ASSIGNERS, BBOX_CODERS
    from mmdet.core.bbox.match_costs.builder import MATCH_COST
    from mmdet.datasets.builder import DATASETS, PIPELINES
    from mmdet.models.builder import MODELS
    from mmdet.models.utils.builder import TRANSFORMER
    from mmdet3d.datasets.builder import OBJECTSAMPLERS
    return {
        'models': MODELS, 'transformer': TRANSFORMER, 'attention': ATTENTION,
        'sequence': TRANSFORMER_LAYER_SEQUENCE, 'layer': TRANSFORMER_LAYER, 'assigner': BBOX_ASSIGNERS,
        'coder': BBOX_CODERS, 'match_cost': MATCH_COST, 'dataset': DATASETS, 'pipeline': PIPELINES,
        'object_sampler': OBJECTSAMPLERS,
    }


@pytest.mark.parametrize('registry_key', sorted(UPSTREAM_REGISTRY_NAMES))
def test_upstream_names_are_registered(registry_key):
    import projects.mmdet3d_plugin  # noqa: F401
    registry = _registries()[registry_key]
    missing = [name for name in UPSTREAM_REGISTRY_NAMES[registry_key] if registry.get(name) is None]
    assert not missing, f'not registered in {registry.name}: {missing}'


def test_aqr_modules_are_registered():
    import projects.mmdet3d_plugin  # noqa: F401
    from mmdet.models.builder import MODELS
    missing = [name for name in AQR_REGISTRY_NAMES if MODELS.get(name) is None]
    assert not missing, f'AQR modules not registered: {missing}'


def test_import_does_not_pull_optional_cuda_packages():
    code = ('import sys, projects.mmdet3d_plugin; '
            'bad = [m for m in ("flash_attn", "xformers") if m in sys.modules]; '
            'print(bad); sys.exit(1 if bad else 0)')
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_plugin_dir_import_like_mmdet3d_tools():
    """Configs say plugin_dir='projects/mmdet3d_plugin/'; tools import it as a dotted module path."""
    import importlib
    module_path = 'projects/mmdet3d_plugin/'.rstrip('/').replace('/', '.')
    module = importlib.import_module(module_path)
    assert module.__name__ == 'projects.mmdet3d_plugin'
