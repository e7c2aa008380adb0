"""Detectors."""
from .cmt import CmtDetector

__all__ = ['CmtDetector']
