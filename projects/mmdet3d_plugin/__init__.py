"""CMT-AQR plugin for mmdetection3d 1.x.

Importing this package registers every module of the plugin into the
mmcv/mmdet/mmdet3d registries, so configs can name them by ``type``.
Nothing here imports optional CUDA-only packages (flash-attn): the attention
backends look for them only when they are selected.
"""
from . import attention, core, datasets, mmcv_custom, models  # noqa: F401
