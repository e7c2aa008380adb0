"""Matching costs registered in mmdet's ``MATCH_COST`` registry."""
from .match_cost import BBox3DL1Cost, BBoxBEVL1Cost, IoU3DCost

__all__ = ['BBox3DL1Cost', 'BBoxBEVL1Cost', 'IoU3DCost']
