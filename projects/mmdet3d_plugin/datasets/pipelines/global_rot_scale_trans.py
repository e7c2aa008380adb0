"""Global rotation / scaling / translation of the LiDAR frame that keeps the camera matrices consistent."""
from typing import Dict, Sequence, Union

import numpy as np
from mmdet.datasets.builder import PIPELINES

from .lidar_scene import random_bev_flips, rotate_scene, scale_scene, translate_scene

Range = Union[float, Sequence[float]]


def _as_range(value: Range, name: str) -> tuple:
    if isinstance(value, (int, float)):
        value = (-abs(value), abs(value))
    if len(value) != 2 or value[0] > value[1]:
        raise ValueError(f'{name} must be a number or a [low, high] pair with low <= high, got {value}')
    return float(value[0]), float(value[1])


def _check_probability(value: float, name: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f'{name} must be in [0, 1], got {value}')
    return float(value)


@PIPELINES.register_module()
class GlobalRotScaleTransAll:
    """Random rotation about z, then scaling, then translation of points, boxes and camera matrices.

    The points (``results['points']``), every box field and every per-view
    ``lidar2img`` / ``lidar2cam`` move together, so after the transform a
    LiDAR point on an object still projects onto that object in the images.
    Adds ``pcd_rotation``, ``pcd_rotation_angle``, ``pcd_scale_factor``,
    ``pcd_trans`` and appends ``'R', 'S', 'T'`` to ``transformation_3d_flow``.
    A ``pcd_scale_factor`` already in ``results`` (set by
    ``MultiScaleFlipAug3D``) is used instead of a random one.

    Args:
        rot_range (float | list[float]): rotation angle range in radians (a
            number ``r`` means ``[-r, r]``).
        scale_ratio_range (list[float]): scale factor range.
        translation_std (float | list[float]): standard deviation of the
            Gaussian translation along x, y, z in metres.
    """

    def __init__(self, rot_range: Range = (-0.78539816, 0.78539816),
                 scale_ratio_range: Sequence[float] = (0.95, 1.05),
                 translation_std: Union[float, Sequence[float]] = (0.0, 0.0, 0.0)) -> None:
        self.rot_range = _as_range(rot_range, 'rot_range')
        self.scale_ratio_range = _as_range(scale_ratio_range, 'scale_ratio_range')
        if self.scale_ratio_range[0] <= 0:
            raise ValueError(f'scale_ratio_range must be positive, got {scale_ratio_range}')
        if isinstance(translation_std, (int, float)):
            translation_std = [translation_std] * 3
        if len(translation_std) != 3 or any(std < 0 for std in translation_std):
            raise ValueError(f'translation_std must be 3 non-negative numbers, got {translation_std}')
        self.translation_std = np.asarray(translation_std, dtype=np.float64)

    def sample_angle(self) -> float:
        """Draw the rotation angle in radians."""
        return float(np.random.uniform(*self.rot_range))

    def rot_scale_trans(self, results: Dict) -> None:
        """Apply one random rotation, scaling and translation to ``results`` in place."""
        rotate_scene(results, self.sample_angle())
        if 'pcd_scale_factor' not in results:
            results['pcd_scale_factor'] = float(np.random.uniform(*self.scale_ratio_range))
        scale_scene(results, results['pcd_scale_factor'])
        translate_scene(results, np.random.normal(scale=self.translation_std, size=3))
        results.setdefault('transformation_3d_flow', []).extend(['R', 'S', 'T'])

    def __call__(self, results: Dict) -> Dict:
        self.rot_scale_trans(results)
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(rot_range={self.rot_range}, scale_ratio_range={self.scale_ratio_range}, '
                f'translation_std={self.translation_std.tolist()})')


@PIPELINES.register_module()
class GlobalRotScaleTransImage(GlobalRotScaleTransAll):
    """The BEV augmentation of camera-based configs: rotate, scale, translate, then randomly mirror.

    Same transform as :class:`GlobalRotScaleTransAll` (points are moved too
    when the pipeline loaded them), followed by a mirror of y with
    probability ``flip_dy_ratio`` and of x with probability ``flip_dx_ratio``
    (recorded as ``pcd_horizontal_flip`` / ``pcd_vertical_flip``, mmdet3d's
    names; flags already in ``results`` are honoured). Boxes and camera matrices always move together.

    Args:
        rot_range, scale_ratio_range, translation_std: as in
            :class:`GlobalRotScaleTransAll`.
        reverse_angle (bool): draw the angle with the opposite sign (upstream
            CMT's camera configs set it to compensate an older mmdet3d box
            convention; here boxes and cameras stay consistent either way, so
            with a symmetric ``rot_range`` it changes nothing).
        training (bool): when False the transform does nothing.
        flip_dx_ratio (float): probability of mirroring x.
        flip_dy_ratio (float): probability of mirroring y.
    """

    def __init__(self, rot_range: Range = (-0.3925, 0.3925), scale_ratio_range: Sequence[float] = (0.95, 1.05),
                 translation_std: Union[float, Sequence[float]] = (0.0, 0.0, 0.0), reverse_angle: bool = False,
                 training: bool = True, flip_dx_ratio: float = 0.0, flip_dy_ratio: float = 0.0) -> None:
        super().__init__(rot_range, scale_ratio_range, translation_std)
        self.reverse_angle = reverse_angle
        self.training = training
        self.flip_dx_ratio = _check_probability(flip_dx_ratio, 'flip_dx_ratio')
        self.flip_dy_ratio = _check_probability(flip_dy_ratio, 'flip_dy_ratio')

    def sample_angle(self) -> float:
        angle = super().sample_angle()
        return -angle if self.reverse_angle else angle

    def __call__(self, results: Dict) -> Dict:
        if not self.training:
            return results
        self.rot_scale_trans(results)
        random_bev_flips(results, horizontal_ratio=self.flip_dy_ratio, vertical_ratio=self.flip_dx_ratio)
        return results

    def __repr__(self) -> str:
        return (f'{super().__repr__()[:-1]}, reverse_angle={self.reverse_angle}, training={self.training}, '
                f'flip_dx_ratio={self.flip_dx_ratio}, flip_dy_ratio={self.flip_dy_ratio})')
