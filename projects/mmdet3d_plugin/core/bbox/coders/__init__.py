"""Box coders registered in mmdet's ``BBOX_CODERS`` registry."""
from .multi_task_bbox_coder import MultiTaskBBoxCoder

__all__ = ['MultiTaskBBoxCoder']
