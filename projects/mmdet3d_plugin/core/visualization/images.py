"""Camera images of a batch back as displayable pictures, and camera names."""
import os.path as osp
from typing import List, Sequence, Union

import numpy as np
from torch import Tensor


def denormalize_image(img: Union[np.ndarray, Tensor], mean: Sequence[float], std: Sequence[float],
                      to_rgb: bool = True) -> np.ndarray:
    """Undo ``NormalizeMultiviewImage``: a normalised ``[3, H, W]`` input image -> ``[H, W, 3]`` uint8 RGB.

    Args:
        img (np.ndarray | Tensor): ``[3, H, W]`` normalised image (padding included).
        mean (Sequence[float]): the normalisation's per-channel mean.
        std (Sequence[float]): its per-channel std.
        to_rgb (bool): whether the normalisation converted BGR to RGB (if
            not, the channels are BGR and are flipped here).
    """
    if isinstance(img, Tensor):
        img = img.detach().cpu().float().numpy()
    img = np.asarray(img, dtype=np.float32)
    if img.ndim != 3 or img.shape[0] != 3:
        raise ValueError(f'expected a [3, H, W] image, got shape {img.shape}')
    pixels = img.transpose(1, 2, 0) * np.asarray(std, dtype=np.float32) + np.asarray(mean, dtype=np.float32)
    if not to_rgb:
        pixels = pixels[..., ::-1]
    return np.clip(np.round(pixels), 0, 255).astype(np.uint8)


def camera_names(filenames: Sequence[str]) -> List[str]:
    """Camera of each image file: its folder name (nuScenes ``samples/CAM_FRONT/...jpg`` -> ``CAM_FRONT``)."""
    return [osp.basename(osp.dirname(name)) or f'view {index}' for index, name in enumerate(filenames)]
