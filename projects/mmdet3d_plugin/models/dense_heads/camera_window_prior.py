"""A fixed locality prior on a camera-only head's cross-attention: AQR's local camera bias without a router.

CMT-AQR learns to localise its queries quickly because its router starts at a
camera weight ``w`` that :class:`~..aqr.bias_generator.AttentionBiasGenerator`
turns into a window of bias around each query's projected camera cell,
``(w - 0.5) * 2 * bias_scale`` at the centre (0.9 and 5.0 give +4), decaying
linearly to 0 at ``window_size / 2`` cells. :class:`CameraWindowPrior` gives
every query of ``CmtImageHead`` (anchors and DN queries) that bias with the
constant amplitude ``bias``, built by the same code
(:func:`~..aqr.projection.project_to_camera_cells`,
:func:`~..aqr.bias_generator.local_window_bias`). The keys are the camera
tokens only, ``K = N * H_img * W_img`` in ``(view, h, w)`` order; no
parameters.
"""
from typing import Sequence, Tuple

import torch
from mmdet.models.builder import MODELS
from torch import Tensor, nn

from ...attention import AttentionBias
from ...attention.bias.window_cells import check_window_size
from ..aqr.bias_generator import local_window_bias
from ..aqr.projection import project_to_camera_cells
from ..utils.camera_geometry import CameraGeometry


@MODELS.register_module()
class CameraWindowPrior(nn.Module):
    """Per query, ``bias * max(0, 1 - d / (window_size / 2))`` on the camera tokens around its projected cell.

    ``d`` is the Euclidean distance in cells to the cell of the first view
    that sees the query's reference point; the window is the
    ``window_size`` square around it (clipped at the map's borders), every
    other key gets 0, and a query visible in no view gets 0 everywhere. It
    is the camera part of ``AttentionBiasGenerator``'s local bias for a
    constant camera weight ``w`` with ``bias = (w - 0.5) * 2 * bias_scale``,
    the same for every decoder layer and head.

    Args:
        window_size (int): odd window side, in camera feature cells. Default: 5.
        bias (float): bias at the window's centre. Default: 4.0.
    """

    def __init__(self, window_size: int = 5, bias: float = 4.0) -> None:
        super().__init__()
        self.window_size = check_window_size(window_size)
        self.bias = float(bias)

    def forward(self, reference_points: Tensor, pc_range: Sequence[float], camera_shape: Tuple[int, int, int],
                geometry: CameraGeometry) -> AttentionBias:
        """Build the bias.

        Args:
            reference_points (Tensor): ``[bs, P, 3]`` normalised reference
                points of all the decoder's queries (DN queries included).
            pc_range (Sequence[float]): the head's point-cloud range.
            camera_shape (tuple[int, int, int]): ``(N, H_img, W_img)`` of the camera memory.
            geometry (CameraGeometry): the batch's ``lidar2img`` and per-view image and padded sizes.

        Returns:
            AttentionBias: over ``P`` queries and ``N * H_img * W_img`` keys, shared by all heads.
        """
        pts_pers_idx, visible = project_to_camera_cells(reference_points, pc_range, camera_shape, geometry)
        amplitude = torch.full((visible.size(0), 1, visible.size(1)), self.bias, device=visible.device)
        return local_window_bias(dict(pts_pers_idx=pts_pers_idx, visible=visible), amplitude, camera_shape,
                                 self.window_size)

    def extra_repr(self) -> str:
        return f'window_size={self.window_size}, bias={self.bias}'
