"""Datasets and data pipelines of the plugin (importing this package registers them)."""
from . import pipelines  # noqa: F401
from .custom_nuscenes_dataset import CustomNuScenesDataset

__all__ = ['CustomNuScenesDataset']
