"""AQR attention bias: per-query modality weights -> a structured bias on the cross-attention scores.

The decoder's cross-attention keys are ``[BEV tokens ; camera tokens]``
(``K = H_bev * W_bev + N * H_img * W_img``, see ``cmt_transformer``). A query
with LiDAR weight ``w_l`` and camera weight ``w_c`` gets the biases
``b_l = (w_l - 0.5) * 2 * alpha`` and ``b_c = (w_c - 0.5) * 2 * alpha``:

* global (``use_local_bias=False``): ``b_l`` on every BEV key and ``b_c`` on
  every camera key, a :class:`SegmentBias` with two segments (rank 2);
* local (``use_local_bias=True``): ``b_l * decay`` on the BEV keys inside a
  ``window_size`` square around the query's BEV cell and ``b_c * decay`` on
  the camera keys inside the square around its camera cell (in the view that
  sees it), ``decay = max(0, 1 - d / (window_size / 2))`` with ``d`` the
  Euclidean distance in cells; 0 elsewhere, and no camera bias for a query
  visible in no camera. A :class:`WindowBias` on two :class:`KeyGrid` s
  (:func:`local_window_bias`, shared with ``CmtImageHead``'s ``camera_window_prior``);
* with ``mute_scale`` (local bias only), a mute term next to the windows:
  ``-beta * (1 - w_l)`` on every BEV key and ``-beta * (1 - w_c)`` on every
  camera key (a two-segment :class:`SegmentBias`, ``beta`` learned from
  ``mute_scale``): a query that routes a modality away (weight towards 0)
  lowers all of that modality's keys, not only its window, towards a mask.

Nothing ``[Q, K]``-sized is built here (the attention backends apply the structured bias). Denoising (DN)
queries come first in CMT's query order and get **zero bias**: they reconstruct noised ground-truth boxes, a
task AQR should not alter.
"""
from typing import Dict, Mapping, Optional, Tuple, Union

import torch
from mmcv.runner import BaseModule
from mmdet.models.builder import MODELS
from torch import Tensor, nn

from ...attention import AttentionBias, KeyGrid, PerLayer, SegmentBias, WindowBias
from ...attention.bias.window_cells import check_window_size
from ...config_upgrade import current_keys_only

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def weights_to_bias(weights: Tensor, scale: Union[float, Tensor]) -> Tensor:
    """The AQR mapping ``(w - 0.5) * 2 * scale``: weight 0.5 is neutral, 1 adds ``scale``, 0 subtracts it.

    Args:
        weights (Tensor): modality weights in ``[0, 1]``, any shape.
        scale (float | Tensor): ``alpha``, broadcastable to ``weights``.

    Returns:
        Tensor: the bias, same shape as ``weights``.
    """
    return (weights - 0.5) * 2.0 * scale


def local_window_bias(projection_info: Mapping[str, Tensor],
                      camera_amplitude: Tensor,
                      camera_shape: Tuple[int, int, int],
                      window_size: int,
                      bev_shape: Optional[Tuple[int, int]] = None,
                      bev_amplitude: Optional[Tensor] = None,
                      num_dn_queries: int = 0) -> AttentionBias:
    """The local (windowed, linearly decaying) bias around each query's camera cell and, optionally, BEV cell.

    A query gets ``amplitude * max(0, 1 - d / (window_size / 2))`` on the keys
    of the ``window_size`` square around its cell (``d`` the Euclidean
    distance in cells), 0 elsewhere; on the camera grid only in the view that
    sees it (none if it is visible in no view). The first ``num_dn_queries``
    queries (DN queries, not in ``projection_info``) get no window.

    Args:
        projection_info (Mapping[str, Tensor]): over Q queries,
            ``pts_pers_idx [bs, Q, 3]`` (view, h, w), ``visible [bs, Q]`` and,
            with ``bev_shape``, ``pts_bev [bs, Q, 2]`` (y, x).
        camera_amplitude (Tensor): ``[bs, heads | 1, num_dn_queries + Q]``
            bias at the centre of each query's camera window.
        camera_shape (tuple[int, int, int]): ``(N, H_img, W_img)`` of the camera memory.
        window_size (int): odd window side, in cells.
        bev_shape (tuple[int, int], optional): ``(H_bev, W_bev)``; given, the
            keys are ``[BEV tokens ; camera tokens]``, else the camera tokens only.
        bev_amplitude (Tensor, optional): like ``camera_amplitude``, for the
            BEV windows (exactly when ``bev_shape`` is given).
        num_dn_queries (int): queries before the ``Q`` of ``projection_info``.

    Returns:
        AttentionBias: one :class:`WindowBias` over ``H_bev * W_bev + N * H_img * W_img``
        keys (``N * H_img * W_img`` without ``bev_shape``).
    """
    if (bev_shape is None) != (bev_amplitude is None):
        raise ValueError('local_window_bias needs bev_shape and bev_amplitude together (or neither)')
    visible = projection_info['visible'].bool()
    grids, centres, valid, amplitudes = [], [], [], []
    num_bev = 0
    if bev_shape is not None:
        bev_h, bev_w = (int(s) for s in bev_shape)
        num_bev = bev_h * bev_w
        pts_bev = projection_info['pts_bev'].long()
        grids.append(KeyGrid(0, 1, bev_h, bev_w))
        centres.append(torch.cat([pts_bev.new_zeros(*pts_bev.shape[:2], 1), pts_bev], dim=-1))
        valid.append(torch.ones_like(visible))
        amplitudes.append(bev_amplitude)
    num_views, img_h, img_w = (int(s) for s in camera_shape)
    grids.append(KeyGrid(num_bev, num_views, img_h, img_w))
    centres.append(projection_info['pts_pers_idx'].long().clamp(min=0))
    valid.append(visible)
    amplitudes.append(camera_amplitude)
    if num_dn_queries:
        def pad(tensor: Tensor) -> Tensor:
            return torch.cat([tensor.new_zeros(tensor.shape[0], num_dn_queries, *tensor.shape[2:]), tensor], 1)

        centres, valid = [pad(c) for c in centres], [pad(v) for v in valid]
    return AttentionBias(WindowBias(grids, centres, valid, amplitudes, window_size),
                         num_bev + num_views * img_h * img_w)


class WeightToBiasMLP(nn.Module):
    """Learned residual on the linear mapping: ``m(w) = (w - 0.5) * 2 + MLP(w)``.

    The MLP's output layer starts at zero, so the learned mapping starts
    equal to the linear one and learns a correction.

    Args:
        hidden_dims (int): hidden width.
    """

    def __init__(self, hidden_dims: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(1, hidden_dims), nn.ReLU(inplace=True), nn.Linear(hidden_dims, 1))
        nn.init.zeros_(self.layers[2].weight)
        nn.init.zeros_(self.layers[2].bias)

    def forward(self, weights: Tensor) -> Tensor:
        """``weights [...]`` -> unscaled bias ``[...]``."""
        return weights_to_bias(weights, 1.0) + self.layers(weights[..., None]).squeeze(-1)


@MODELS.register_module()
@current_keys_only
class AttentionBiasGenerator(BaseModule):
    """Turn AQR's per-query LiDAR / camera weights into a cross-attention :class:`AttentionBias`.

    Args:
        window_size (int): odd side, in feature cells, of the local window
            in BEV and in the camera view. Default: 15.
        bias_scale (float): initial ``alpha``. Default: 1.0.
        learnable_scale (bool): learn ``alpha`` (a parameter) or keep it fixed
            (a buffer). Default: True.
        use_local_bias (bool): windowed decaying bias (True) or one bias per
            modality over all its keys (False). Default: True.
        fp16 (bool): emit the bias in the features' half precision when the
            model runs in fp16/bf16 (halves the memory of a dense fallback);
            with False the bias stays float32. Default: False.
        per_head (bool): learn a multiplier of ``alpha`` per attention head
            (initialised to 1), giving a ``[bs, heads, Q, ...]`` bias. Default: False.
        num_heads (int): attention heads, used with ``per_head``. Default: 8.
        per_layer (bool): learn one ``alpha`` per decoder layer; :meth:`forward`
            then returns one bias per layer. Default: False.
        num_layers (int): decoder layers, used with ``per_layer``. Default: 6.
        learned_mapping (bool): per modality, learn a residual MLP on the
            weight -> bias mapping (:class:`WeightToBiasMLP`). Default: False.
        mapping_hidden_dims (int): hidden width of that MLP. Default: 16.
        mute_scale (float, optional): with the local bias, add the mute term
            ``-beta * (1 - w)`` on every key of each modality, ``beta`` a
            learned parameter starting at ``mute_scale`` (see the module
            docstring). Default: None (no mute term, no parameter).
        init_cfg (dict, optional): mmcv initialisation config.
    """

    def __init__(self,
                 window_size: int = 15,
                 bias_scale: float = 1.0,
                 learnable_scale: bool = True,
                 use_local_bias: bool = True,
                 fp16: bool = False,
                 per_head: bool = False,
                 num_heads: int = 8,
                 per_layer: bool = False,
                 num_layers: int = 6,
                 learned_mapping: bool = False,
                 mapping_hidden_dims: int = 16,
                 mute_scale: Optional[float] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.window_size = check_window_size(window_size)
        self.use_local_bias = bool(use_local_bias)
        self.fp16 = bool(fp16)
        self.per_head = bool(per_head)
        self.per_layer = bool(per_layer)
        if per_head and num_heads < 1:
            raise ValueError(f'num_heads must be >= 1 with per_head=True, got {num_heads}')
        if per_layer and num_layers < 1:
            raise ValueError(f'num_layers must be >= 1 with per_layer=True, got {num_layers}')
        self.num_heads = int(num_heads) if per_head else 1
        self.num_layers = int(num_layers) if per_layer else 1
        scale = torch.full((self.num_layers, ), float(bias_scale))
        if learnable_scale:
            self.bias_scale = nn.Parameter(scale)
        else:
            self.register_buffer('bias_scale', scale)
        if per_head:
            self.head_scale = nn.Parameter(torch.ones(self.num_heads))
        self.mapping = (nn.ModuleList([WeightToBiasMLP(mapping_hidden_dims) for _ in range(2)])
                        if learned_mapping else None)
        if mute_scale is not None:
            if not use_local_bias:
                raise ValueError('mute_scale adds a mute term to the local bias; the global bias '
                                 '(use_local_bias=False) already biases every key of a modality')
            if mute_scale < 0:
                raise ValueError(f'mute_scale must be >= 0 (a weight of 0 lowers the keys), got {mute_scale}')
            self.mute_scale = nn.Parameter(torch.tensor(float(mute_scale)))
        else:
            self.mute_scale = None

    def modality_biases(self, lidar_weights: Tensor, camera_weights: Tensor) -> Tensor:
        """Per-layer, per-head LiDAR and camera biases of every query.

        Args:
            lidar_weights (Tensor): ``[bs, Q]`` in ``[0, 1]``.
            camera_weights (Tensor): ``[bs, Q]`` in ``[0, 1]``.

        Returns:
            Tensor: ``[layers, bs, heads, Q, 2]`` (``layers`` = ``num_layers``
            with ``per_layer`` else 1, ``heads`` = ``num_heads`` with
            ``per_head`` else 1); last dim ``(lidar, camera)``.
        """
        dtype = torch.promote_types(self.bias_scale.dtype, torch.float32)  # float32; float64 for a float64 module
        weights = torch.stack([lidar_weights, camera_weights], dim=-1).to(dtype)  # [bs, Q, 2]
        if self.mapping is not None:
            unscaled = torch.stack([mlp(weights[..., i]) for i, mlp in enumerate(self.mapping)], dim=-1)
        else:
            unscaled = weights_to_bias(weights, 1.0)
        scale = self.bias_scale.to(dtype).view(-1, 1, 1, 1, 1)  # [layers, 1, 1, 1, 1]
        if self.per_head:
            scale = scale * self.head_scale.to(dtype).view(1, 1, -1, 1, 1)
        return unscaled[None, :, None] * scale

    def forward(self,
                lidar_weights: Tensor,
                camera_weights: Tensor,
                projection_info: Dict[str, Tensor],
                bev_shape: Tuple[int, int],
                camera_shape: Tuple[int, int, int],
                num_dn_queries: int = 0,
                feature_dtype: Optional[torch.dtype] = None) -> Union[AttentionBias, PerLayer]:
        """Build the cross-attention bias.

        Args:
            lidar_weights (Tensor): ``[bs, Q]`` from ``AQRWeightGenerator``.
            camera_weights (Tensor): ``[bs, Q]``.
            projection_info (dict[str, Tensor]): ``pts_bev [bs, Q, 2]`` (y, x),
                ``pts_pers_idx [bs, Q, 3]`` (view, h, w), ``visible [bs, Q]``.
            bev_shape (tuple[int, int]): ``(H_bev, W_bev)`` of the BEV memory.
            camera_shape (tuple[int, int, int]): ``(N, H_img, W_img)`` of the
                camera memory.
            num_dn_queries (int): DN queries placed before the ``Q`` matching
                queries in the decoder; they get zero bias.
            feature_dtype (torch.dtype, optional): dtype of the decoder's
                features; with ``fp16=True`` and a half dtype the bias uses it.

        Returns:
            AttentionBias | PerLayer: over ``num_dn_queries + Q`` queries and
            ``H_bev * W_bev + N * H_img * W_img`` keys; a :class:`PerLayer`
            of one bias per decoder layer when ``per_layer``.
        """
        self._check_inputs(lidar_weights, camera_weights, projection_info, num_dn_queries)
        biases = self.modality_biases(lidar_weights, camera_weights)
        if num_dn_queries:
            biases = torch.cat([biases.new_zeros(*biases.shape[:3], num_dn_queries, 2), biases], dim=3)
        if self.fp16 and feature_dtype in _HALF_DTYPES:
            biases = biases.to(feature_dtype)
        bev_h, bev_w = (int(s) for s in bev_shape)
        num_views, img_h, img_w = (int(s) for s in camera_shape)
        segments = (bev_h * bev_w, num_views * img_h * img_w)
        if self.use_local_bias:
            layer_biases = [
                local_window_bias(projection_info, b[..., 1], camera_shape, self.window_size, bev_shape=bev_shape,
                                  bev_amplitude=b[..., 0], num_dn_queries=num_dn_queries) for b in biases
            ]
            if self.mute_scale is not None:
                mute = AttentionBias(SegmentBias(self._mute_values(lidar_weights, camera_weights, num_dn_queries,
                                                                  biases.dtype), segments), sum(segments))
                layer_biases = [bias + mute for bias in layer_biases]
        else:
            layer_biases = [AttentionBias(SegmentBias(b, segments), sum(segments)) for b in biases]
        return PerLayer(layer_biases) if self.per_layer else layer_biases[0]

    def _mute_values(self, lidar_weights: Tensor, camera_weights: Tensor, num_dn_queries: int,
                     dtype: torch.dtype) -> Tensor:
        """The mute term ``-beta * (1 - w)`` per query and modality: ``[bs, 1, num_dn_queries + Q, 2]`` (DN
        queries 0)."""
        weights = torch.stack([lidar_weights, camera_weights], dim=-1).to(self.mute_scale.dtype)
        values = (weights - 1.0) * self.mute_scale
        if num_dn_queries:
            values = torch.cat([values.new_zeros(values.shape[0], num_dn_queries, 2), values], dim=1)
        return values[:, None].to(dtype)

    @staticmethod
    def _check_inputs(lidar_weights: Tensor, camera_weights: Tensor, projection_info: Dict[str, Tensor],
                      num_dn_queries: int) -> None:
        if lidar_weights.dim() != 2 or lidar_weights.shape != camera_weights.shape:
            raise ValueError(f'lidar_weights and camera_weights must both be [bs, Q], got '
                             f'{tuple(lidar_weights.shape)} and {tuple(camera_weights.shape)}')
        missing = [key for key in ('pts_bev', 'pts_pers_idx', 'visible') if key not in projection_info]
        if missing:
            raise KeyError(f'projection_info lacks {missing} (produced by AQRWeightGenerator)')
        for key in ('pts_bev', 'pts_pers_idx', 'visible'):
            if tuple(projection_info[key].shape[:2]) != tuple(lidar_weights.shape):
                raise ValueError(f"projection_info['{key}'] has shape {tuple(projection_info[key].shape)}, "
                                 f'the weights are {tuple(lidar_weights.shape)}')
        if num_dn_queries < 0:
            raise ValueError(f'num_dn_queries must be >= 0, got {num_dn_queries}')

    def extra_repr(self) -> str:
        mode = f'local(window_size={self.window_size})' if self.use_local_bias else 'global'
        if self.mute_scale is not None:
            mode += ' + mute'
        return (f'{mode}, layers={self.num_layers}, heads={self.num_heads}, '
                f'learned_mapping={self.mapping is not None}, fp16={self.fp16}')
