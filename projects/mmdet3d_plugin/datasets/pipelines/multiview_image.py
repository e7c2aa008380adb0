"""Transforms of the list of camera images ``results['img']`` (one ``[H, W, C]`` array per view)."""
from typing import Dict, Optional, Sequence, Tuple

import cv2
import mmcv
import numpy as np
from mmdet.datasets.builder import PIPELINES

from ..camera_geometry import image_affine, lift_image_affine

_AUG_CONF_KEYS = ('resize_lim', 'final_dim', 'bot_pct_lim', 'rot_lim', 'H', 'W', 'rand_flip')


def _check_images(results: Dict, transform: str) -> None:
    if 'img' not in results or not isinstance(results['img'], (list, tuple)):
        raise KeyError(f'{transform} needs results["img"] as a list of per-view images '
                       f'(load them with LoadMultiViewImageFromFiles)')


@PIPELINES.register_module()
class PadMultiViewImage:
    """Pad every view to a fixed size or to a multiple of ``size_divisor`` (bottom / right padding).

    Sets ``pad_shape`` (list of per-view padded shapes), ``pad_fixed_size``
    and ``pad_size_divisor``; ``img_shape`` keeps the unpadded shapes. Padding
    at the bottom/right does not move pixels, so the camera matrices stay valid.

    Args:
        size (tuple[int, int], optional): fixed ``(height, width)``.
        size_divisor (int, optional): pad height and width up to a multiple of it.
        pad_val (float): padding value.
    """

    def __init__(self, size: Optional[Tuple[int, int]] = None, size_divisor: Optional[int] = None,
                 pad_val: float = 0) -> None:
        if (size is None) == (size_divisor is None):
            raise ValueError(f'PadMultiViewImage needs exactly one of size and size_divisor, got size={size}, '
                             f'size_divisor={size_divisor}')
        self.size = size
        self.size_divisor = size_divisor
        self.pad_val = pad_val

    def __call__(self, results: Dict) -> Dict:
        _check_images(results, 'PadMultiViewImage')
        if self.size is not None:
            padded = [mmcv.impad(img, shape=self.size, pad_val=self.pad_val) for img in results['img']]
        else:
            padded = [mmcv.impad_to_multiple(img, self.size_divisor, pad_val=self.pad_val) for img in results['img']]
        results['img_shape'] = [img.shape for img in results['img']]
        results['img'] = padded
        results['pad_shape'] = [img.shape for img in padded]
        results['pad_fixed_size'] = self.size
        results['pad_size_divisor'] = self.size_divisor
        return results

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(size={self.size}, size_divisor={self.size_divisor}, pad_val={self.pad_val})'


@PIPELINES.register_module()
class NormalizeMultiviewImage:
    """Normalise every view: ``(img - mean) / std`` (after BGR->RGB with ``to_rgb``); adds ``img_norm_cfg``.

    Args:
        mean (Sequence[float]): per-channel mean.
        std (Sequence[float]): per-channel standard deviation.
        to_rgb (bool): convert BGR to RGB first.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], to_rgb: bool = True) -> None:
        self.mean = np.array(mean, dtype=np.float32)
        self.std = np.array(std, dtype=np.float32)
        if np.any(self.std == 0):
            raise ValueError(f'NormalizeMultiviewImage: std must be non-zero, got {list(std)}')
        self.to_rgb = to_rgb

    def __call__(self, results: Dict) -> Dict:
        _check_images(results, 'NormalizeMultiviewImage')
        results['img'] = [mmcv.imnormalize(img, self.mean, self.std, self.to_rgb) for img in results['img']]
        results['img_norm_cfg'] = dict(mean=self.mean, std=self.std, to_rgb=self.to_rgb)
        return results

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(mean={self.mean}, std={self.std}, to_rgb={self.to_rgb})'


@PIPELINES.register_module()
class ResizeCropFlipImage:
    """Random resize, crop, horizontal flip and rotation of every view, keeping ``lidar2img`` consistent.

    ``data_aug_conf`` (as in CMT's configs): ``H``, ``W`` the expected input
    size, ``final_dim`` the output ``(height, width)``, ``resize_lim`` the
    range of the resize factor, ``bot_pct_lim`` the range of the fraction of
    the resized image cropped away at the bottom, ``rot_lim`` the rotation
    range in degrees, ``rand_flip`` whether to flip with probability 0.5.
    At test time (``training=False``) the image is resized so that it covers
    ``final_dim``, centred horizontally and cropped from the bottom by the mean
    of ``bot_pct_lim``, without flip or rotation.

    The same pixel affine moves the image content and updates
    ``cam_intrinsic`` and ``lidar2img`` (in place in their lists), so a LiDAR
    point still projects onto the same content. ``img_shape`` becomes the
    output shape.

    Args:
        data_aug_conf (dict): see above.
        training (bool): random (True) or deterministic (False) augmentation.
        pic_wise (bool): draw the augmentation per view instead of per sample.
    """

    def __init__(self, data_aug_conf: Dict, training: bool = True, pic_wise: bool = False) -> None:
        missing = [key for key in _AUG_CONF_KEYS if key not in data_aug_conf]
        if missing:
            raise KeyError(f'ResizeCropFlipImage: data_aug_conf lacks {missing}')
        self.data_aug_conf = data_aug_conf
        self.training = training
        self.pic_wise = pic_wise

    def sample_augmentation(self) -> Tuple[float, Tuple[int, int], Tuple[int, int], bool, float]:
        """Draw ``(resize, resized (width, height), crop corner (u0, v0), flip, rotate_deg)``."""
        conf = self.data_aug_conf
        height, width = conf['H'], conf['W']
        final_h, final_w = conf['final_dim']
        if self.training:
            resize = np.random.uniform(*conf['resize_lim'])
            bottom_pct = np.random.uniform(*conf['bot_pct_lim'])
        else:
            resize = max(final_h / height, final_w / width)
            bottom_pct = float(np.mean(conf['bot_pct_lim']))
        new_w, new_h = int(width * resize), int(height * resize)
        crop_v = int((1 - bottom_pct) * new_h) - final_h
        if self.training:
            crop_u = int(np.random.uniform(0, max(0, new_w - final_w)))
            flip = bool(conf['rand_flip'] and np.random.choice([0, 1]))
            rotate = float(np.random.uniform(*conf['rot_lim']))
        else:
            crop_u = int(max(0, new_w - final_w) / 2)
            flip, rotate = False, 0.0
        return resize, (new_w, new_h), (crop_u, crop_v), flip, rotate

    def __call__(self, results: Dict) -> Dict:
        _check_images(results, 'ResizeCropFlipImage')
        conf = self.data_aug_conf
        final_h, final_w = conf['final_dim']
        augmentation = self.sample_augmentation()
        images = []
        for view, img in enumerate(results['img']):
            if img.shape[:2] != (conf['H'], conf['W']):
                raise ValueError(f'ResizeCropFlipImage: view {view} is {img.shape[0]}x{img.shape[1]} but '
                                 f'data_aug_conf expects H={conf["H"]}, W={conf["W"]}')
            if self.pic_wise and view > 0:
                augmentation = self.sample_augmentation()
            _, (new_w, new_h), crop, flip, rotate = augmentation
            affine = image_affine((new_w / conf['W'], new_h / conf['H']), crop, flip, rotate, (final_w, final_h))
            images.append(cv2.warpAffine(img, affine[:2], (final_w, final_h), flags=cv2.INTER_LINEAR,
                                         borderMode=cv2.BORDER_CONSTANT, borderValue=0))
            lifted = lift_image_affine(affine)
            for key in ('cam_intrinsic', 'lidar2img'):
                if key in results:
                    results[key][view] = lifted @ results[key][view]
        results['img'] = images
        results['img_shape'] = [img.shape for img in images]
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(data_aug_conf={self.data_aug_conf}, training={self.training}, '
                f'pic_wise={self.pic_wise})')
