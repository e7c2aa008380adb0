"""GridMask image augmentation (Chen et al., 2020) as used by CMT's image branch."""
import numpy as np
import torch
from PIL import Image
from torch import nn

from ...utils.host_data import host_to_device


def grid_mask_pattern(height: int, width: int, period: int, keep_len: int, offset_h: int, offset_w: int,
                      use_h: bool = True, use_w: bool = True) -> np.ndarray:
    """A ``[height, width]`` float mask with zeroed stripes of ``keep_len`` every ``period`` pixels.

    Stripe ``k`` covers rows (columns) ``offset + k * period`` to
    ``offset + k * period + keep_len - 1``, for ``k < height // period``
    (``width // period``), clipped to the image.
    """
    mask = np.ones((height, width), np.float32)

    def _stripes(length: int, offset: int) -> np.ndarray:
        shifted = np.arange(length) - offset
        return (shifted >= 0) & (shifted % period < keep_len) & (shifted // period < length // period)

    if use_h:
        mask[_stripes(height, offset_h), :] = 0
    if use_w:
        mask[:, _stripes(width, offset_w)] = 0
    return mask


class GridMask(nn.Module):
    """Multiply images by a random grid of stripes, in training mode only.

    Args:
        use_h (bool): horizontal stripes.
        use_w (bool): vertical stripes.
        rotate (int): the grid is rotated by a random integer angle in
            ``[0, rotate)`` degrees (1 = never).
        offset (bool): fill the dropped pixels with uniform noise in
            ``[-1, 1]`` instead of 0.
        ratio (float): stripe width as a fraction of the period.
        mode (int): 0 drops the stripes, 1 keeps only the stripes.
        prob (float): probability of applying the mask to a batch.
    """

    def __init__(self, use_h: bool = True, use_w: bool = True, rotate: int = 1, offset: bool = False,
                 ratio: float = 0.5, mode: int = 0, prob: float = 1.0) -> None:
        super().__init__()
        if mode not in (0, 1):
            raise ValueError(f'GridMask mode must be 0 or 1, got {mode}')
        if rotate < 1:
            raise ValueError(f'GridMask rotate must be >= 1 (1 = no rotation), got {rotate}')
        self.use_h = use_h
        self.use_w = use_w
        self.rotate = rotate
        self.offset = offset
        self.ratio = ratio
        self.mode = mode
        self.st_prob = prob
        self.prob = prob

    def set_prob(self, epoch: int, max_epoch: int) -> None:
        """Ramp the probability linearly with the epoch."""
        self.prob = self.st_prob * epoch / max_epoch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the mask.

        Args:
            x (Tensor): ``[N, C, H, W]`` images.

        Returns:
            Tensor: ``[N, C, H, W]``, ``x`` itself when not applied.
        """
        if not self.training or np.random.rand() > self.prob:
            return x
        _, _, height, width = x.shape
        if height < 3:
            raise ValueError(f'GridMask needs images at least 3 pixels high, got {height}')
        big_h, big_w = int(1.5 * height), int(1.5 * width)
        period = np.random.randint(2, height)
        keep_len = min(max(int(period * self.ratio + 0.5), 1), period - 1)
        pattern = grid_mask_pattern(big_h, big_w, period, keep_len, np.random.randint(period),
                                    np.random.randint(period), self.use_h, self.use_w)
        angle = np.random.randint(self.rotate)
        if angle:
            pattern = np.asarray(Image.fromarray(np.uint8(pattern)).rotate(angle), dtype=np.float32)
        top, left = (big_h - height) // 2, (big_w - width) // 2
        mask = host_to_device(np.ascontiguousarray(pattern[top:top + height, left:left + width]), x.device).to(x.dtype)
        if self.mode == 1:
            mask = 1 - mask
        if self.offset:
            noise = host_to_device(2 * (np.random.rand(height, width) - 0.5), x.device).to(x.dtype)
            return x * mask + noise * (1 - mask)
        return x * mask
