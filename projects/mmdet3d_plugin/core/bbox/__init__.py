"""Box assignment, coding and matching costs."""
from . import assigners, coders, match_costs  # noqa: F401
from .util import denormalize_bbox, normalize_bbox

__all__ = ['normalize_bbox', 'denormalize_bbox']
