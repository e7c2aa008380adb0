"""Random bird's-eye-view mirror of points and boxes that keeps the camera matrices consistent."""
from typing import Dict

from mmdet.datasets.builder import PIPELINES

from .lidar_scene import random_bev_flips


@PIPELINES.register_module()
class CustomRandomFlip3D:
    """Mirror the LiDAR frame in BEV: ``'horizontal'`` negates y, ``'vertical'`` negates x.

    Points, every box field and the per-view ``lidar2img`` / ``lidar2cam``
    are mirrored together (``lidar2img' = lidar2img @ F`` with ``F`` the
    mirror), so the images themselves stay untouched and a LiDAR point still
    projects onto the same pixel. Flags already in ``results``
    (``pcd_horizontal_flip`` / ``pcd_vertical_flip``, e.g. from
    ``MultiScaleFlipAug3D``) are honoured; otherwise each flip is drawn with
    its ratio. Appends ``'HF'`` / ``'VF'`` to ``transformation_3d_flow``.
    Each mirror is its own inverse.

    Args:
        sync_2d (bool): must be False (upstream CMT configs set it so): the
            multi-view images are flipped independently by
            ``ResizeCropFlipImage``, which updates ``lidar2img`` itself.
        flip_ratio_bev_horizontal (float): probability of negating y.
        flip_ratio_bev_vertical (float): probability of negating x.
    """

    def __init__(self, sync_2d: bool = False, flip_ratio_bev_horizontal: float = 0.0,
                 flip_ratio_bev_vertical: float = 0.0) -> None:
        if sync_2d:
            raise ValueError('CustomRandomFlip3D: sync_2d=True is not supported; the multi-view images are flipped '
                             'by ResizeCropFlipImage, independently of the BEV flip (use sync_2d=False)')
        for name, ratio in (('flip_ratio_bev_horizontal', flip_ratio_bev_horizontal),
                            ('flip_ratio_bev_vertical', flip_ratio_bev_vertical)):
            if not 0.0 <= ratio <= 1.0:
                raise ValueError(f'CustomRandomFlip3D: {name} must be in [0, 1], got {ratio}')
        self.sync_2d = sync_2d
        self.flip_ratio_bev_horizontal = flip_ratio_bev_horizontal
        self.flip_ratio_bev_vertical = flip_ratio_bev_vertical

    def __call__(self, results: Dict) -> Dict:
        random_bev_flips(results, self.flip_ratio_bev_horizontal, self.flip_ratio_bev_vertical)
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(sync_2d={self.sync_2d}, '
                f'flip_ratio_bev_horizontal={self.flip_ratio_bev_horizontal}, '
                f'flip_ratio_bev_vertical={self.flip_ratio_bev_vertical})')
