"""LiDAR middle encoders."""
from .pillar_scatter import BatchPillarScatter

__all__ = ['BatchPillarScatter']
