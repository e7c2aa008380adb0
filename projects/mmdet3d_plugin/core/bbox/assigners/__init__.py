"""Box assigners registered in mmdet's ``BBOX_ASSIGNERS`` registry."""
from .hungarian_assigner_3d import HungarianAssigner3D

__all__ = ['HungarianAssigner3D']
