"""Registered data pipelines with upstream CMT names (importing this package registers them)."""
from .corruption import CORRUPTION_KEY, SensorCorruption
from .corruption_spec import parse_corruption
from .dbsampler import UnifiedDataBaseSampler
from .global_rot_scale_trans import GlobalRotScaleTransAll, GlobalRotScaleTransImage
from .modal_mask_3d import DROPPED_MODALITIES_KEY, ModalMask3D
from .multiview_image import NormalizeMultiviewImage, PadMultiViewImage, ResizeCropFlipImage
from .object_sample import UnifiedObjectSample
from .random_corruption import RandomSensorCorruption
from .random_flip_3d import CustomRandomFlip3D

__all__ = [
    'UnifiedDataBaseSampler', 'GlobalRotScaleTransAll', 'GlobalRotScaleTransImage', 'DROPPED_MODALITIES_KEY',
    'ModalMask3D', 'NormalizeMultiviewImage', 'PadMultiViewImage', 'ResizeCropFlipImage',
    'UnifiedObjectSample', 'CustomRandomFlip3D', 'CORRUPTION_KEY', 'SensorCorruption', 'parse_corruption',
    'RandomSensorCorruption'
]
