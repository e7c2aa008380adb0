"""AQR weight generator: per-query LiDAR / camera trust from a local-window transformer layer."""
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
from mmcv.cnn.bricks.transformer import FFN
from mmcv.runner import BaseModule
from mmdet.models.builder import MODELS
from torch import Tensor, nn

from ...attention.bias.window_cells import check_window_size, window_offsets, window_token_index
from ...config_upgrade import current_keys_only
from ..utils.camera_geometry import CameraGeometry
from .aux_loss import modality_drop_flags, routing_loss
from .local_window import LocalWindowAttention
from .projection import project_reference_points
from .routing_targets import camera_visible_objects, matched_object_targets, query_target_loss
from .sensor_lies import lidar_misaligned

WEIGHT_ACTIVATIONS = ('sigmoid', 'softmax')
#: ``'query'``: every query its own weights (AQR); ``'sample'``: one pair per sample for all its queries (a global gate).
GRANULARITIES = ('query', 'sample')


def flatten_memory(bev_feat: Tensor, img_feat: Tensor) -> Tuple[Tensor, Tuple[int, int], Tuple[int, int, int]]:
    """Concatenate BEV and camera feature maps into CMT's key layout.

    Args:
        bev_feat (Tensor): ``[bs, C, H_bev, W_bev]``.
        img_feat (Tensor): ``[bs * N, C, H_img, W_img]``.

    Returns:
        tuple: ``memory [bs, H_bev * W_bev + N * H_img * W_img, C]`` (BEV tokens
        row-major, then camera tokens in ``(view, h, w)`` order), ``bev_shape
        (H_bev, W_bev)`` and ``camera_shape (N, H_img, W_img)``.
    """
    if bev_feat.dim() != 4 or img_feat.dim() != 4:
        raise ValueError(f'expected bev_feat [bs, C, H, W] and img_feat [bs*N, C, h, w], '
                         f'got {tuple(bev_feat.shape)} and {tuple(img_feat.shape)}')
    bs, channels, bev_h, bev_w = bev_feat.shape
    if img_feat.shape[1] != channels:
        raise ValueError(f'bev_feat has {channels} channels but img_feat has {img_feat.shape[1]}')
    if img_feat.shape[0] % bs != 0:
        raise ValueError(f'img_feat batch {img_feat.shape[0]} is not a multiple of the BEV batch {bs}')
    num_views, img_h, img_w = img_feat.shape[0] // bs, img_feat.shape[2], img_feat.shape[3]
    bev_tokens = bev_feat.flatten(2).transpose(1, 2)
    img_tokens = img_feat.reshape(bs, num_views, channels, img_h, img_w).permute(0, 1, 3, 4, 2)
    memory = torch.cat([bev_tokens, img_tokens.reshape(bs, -1, channels)], dim=1)
    return memory, (bev_h, bev_w), (num_views, img_h, img_w)


def _pos_tokens(pos: Optional[Tensor], bs: int, count: int, channels: int, name: str, like: Tensor) -> Tensor:
    """Bring a positional embedding to ``[bs, count, C]`` (zeros when ``None``)."""
    if pos is None:
        return like.new_zeros(bs, count, channels)
    if pos.dim() == 2:
        pos = pos.unsqueeze(0).expand(bs, -1, -1)
    elif pos.dim() == 4:
        pos = pos.reshape(bs, -1, pos.shape[-1])
    if tuple(pos.shape) != (bs, count, channels):
        raise ValueError(f'{name} must hold {count} tokens of {channels} channels per sample, '
                         f'got shape {tuple(pos.shape)}')
    return pos


def initial_logits(weight_activation: str, init_weight: Optional[Union[float, Sequence[float]]]) -> Tensor:
    """Bias of the weight head that makes the modality weights start at ``init_weight``.

    Args:
        weight_activation (str): ``'sigmoid'`` (2 logits) or ``'softmax'`` (3 routes).
        init_weight (float | Sequence[float], optional): start value of both
            weights, or ``(lidar, camera)``; None gives zero logits.

    Returns:
        Tensor: ``[2]`` or ``[3]`` logits.
    """
    num_logits = 2 if weight_activation == 'sigmoid' else 3
    if init_weight is None:
        return torch.zeros(num_logits)
    pair = (init_weight, init_weight) if isinstance(init_weight, (int, float)) else tuple(init_weight)
    if len(pair) != 2 or not all(0.0 < w < 1.0 for w in pair):
        raise ValueError(f'init_weight must be a weight in (0, 1) or a (lidar, camera) pair of them, got {init_weight}')
    lidar, camera = (float(w) for w in pair)
    if weight_activation == 'sigmoid':
        return torch.tensor([lidar, camera]).logit()
    if lidar + camera <= 1.0:
        raise ValueError(f'with weight_activation=\'softmax\' the init_weight (lidar, camera) must sum to more than 1 '
                         f'(p_both = lidar + camera - 1), got {init_weight}')
    return torch.tensor([1.0 - camera, 1.0 - lidar, lidar + camera - 1.0]).log()


@MODELS.register_module()
@current_keys_only
class AQRWeightGenerator(BaseModule):
    """Adaptive Query Routing weights: how much each query trusts LiDAR and camera.

    One post-norm transformer layer (window attention -> norm -> FFN -> norm)
    over the query features, in which every query attends only to the memory
    tokens in its local windows (the local attention mask, LAM): a
    ``window_sizes[0]`` square in the camera view that sees its reference point
    and a ``window_sizes[1]`` square around its BEV cell. The windows are
    gathered with index tensors (:mod:`.local_window`), never as a dense
    ``[bs * heads, Q, K]`` mask. A query visible in no camera attends to its
    LiDAR window only. A linear head then gives the weights:

    * ``weight_activation='sigmoid'``: two logits,
      ``lidar = sigmoid(l_0)``, ``camera = sigmoid(l_1)``;
    * ``weight_activation='softmax'``: three routes (LiDAR, camera, both) as in
      MoME, ``p = softmax(l)``, ``lidar = p_0 + p_2``, ``camera = p_1 + p_2``.

    The head's weights start at zero (``weight_head_std=0``) and its bias at
    the logits of ``init_weight``: every query starts exactly at
    ``init_weight``, and without it at 0.5, a bias of exactly 0, so a CMT
    checkpoint loaded into CMT-AQR predicts CMT's boxes and scores before the
    first step. The head still receives gradients from the first step (its
    input is not zero); the layers before it from the second, once its
    weights have moved. ``init_weight`` starts both weights at another value: above 0.5
    the local bias starts *attracting* each query to its own windows, a
    locality prior that lets a short training run (the CPU demo) learn where a
    query should look — without it the decoder needs thousands of iterations
    to learn that from the position embeddings alone.

    Args:
        embed_dims (int): channels of queries and memory. Default: 256.
        num_heads (int): attention heads. Default: 8.
        window_sizes (Sequence[int]): odd window sides ``[camera, lidar]`` in
            feature cells. Default: ``[15, 5]``.
        feedforward_channels (int): FFN hidden size. Default: 1024.
        dropout (float): dropout on attention probabilities, the
            attention output and in the FFN. Default: 0.1.
        weight_activation (str): ``'sigmoid'`` or ``'softmax'``. Default: ``'sigmoid'``.
        aux_loss_weight (float): weight of the auxiliary routing loss from
            modality-drop augmentation (:mod:`.aux_loss`); 0 turns it off.
            Default: 0.
        query_loss_weight (float): weight of the per-query routing loss
            (:mod:`.routing_targets`): each query matched to an object learns
            LiDAR = "its box holds >= ``min_lidar_points`` points", camera =
            "its centre projects into a live view"; 0 turns it off. With it
            on, the router reads its inputs (queries, memory, positions)
            detached, so the targets train the router and nothing else (the
            detection loss still trains the router's parameters). Default: 0.
        min_lidar_points (int): points an object's box must hold for its
            LiDAR target to be 1. Default: 5.
        unmatched_loss_weight (float): weight of the per-query routing loss of
            the queries the Hungarian assignment left unmatched (where false
            positives are born; needs ``query_loss_weight > 0``): each takes the
            input's truth at its reference point, LiDAR 1 where its LiDAR
            window holds a point, the LiDAR is not dropped and (with
            ``lie_targets``) does not lie there; camera 1 where the point
            projects into a live view (``routing_targets.unmatched_query_targets``);
            0 turns it off. Default: 0.
        lie_targets (bool): the routing targets know where a sensor lies
            (``sensor_lies``; needs ``query_loss_weight > 0`` or
            ``aux_loss_weight > 0``): per query, a yawed view is no live view
            (camera 0), a misaligned point cloud gives every query LiDAR 0, and
            an unmatched query within 2 m of a ghost's box gets LiDAR 0; per
            sample (the auxiliary loss), a modality that lies anywhere in the
            sample is labelled as lost. Default: False.
        granularity (str): ``'query'``: every query gets its own weights;
            ``'sample'``: a global gate, one LiDAR and one camera weight per
            sample: the weight head's logits are averaged over the sample's
            queries before the activation and the result is given to every
            query (the outputs keep their ``[bs, Q]`` shape), as MoME's
            per-sample routing. Default: ``'query'``.
        init_weight (float | Sequence[float], optional): value both weights
            start at, or a ``(lidar, camera)`` pair, each in ``(0, 1)``; with
            ``'softmax'`` the pair must sum to more than 1 (the routes start at
            ``p_lidar = 1 - camera``, ``p_camera = 1 - lidar``, ``p_both =
            lidar + camera - 1``). Default: None (zero bias: 0.5 for sigmoid,
            2/3 for softmax).
        weight_head_std (float): standard deviation of the weight head's
            initial weights; > 0 starts every query at its own weights near
            ``init_weight``. Default: 0.
        init_cfg (dict, optional): mmcv initialisation config.
    """

    def __init__(self,
                 embed_dims: int = 256,
                 num_heads: int = 8,
                 window_sizes: Sequence[int] = (15, 5),
                 feedforward_channels: int = 1024,
                 dropout: float = 0.1,
                 weight_activation: str = 'sigmoid',
                 aux_loss_weight: float = 0.0,
                 query_loss_weight: float = 0.0,
                 min_lidar_points: int = 5,
                 unmatched_loss_weight: float = 0.0,
                 lie_targets: bool = False,
                 granularity: str = 'query',
                 init_weight: Optional[Union[float, Sequence[float]]] = None,
                 weight_head_std: float = 0.0,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if len(window_sizes) != 2:
            raise ValueError(f'window_sizes must be [camera, lidar], got {window_sizes!r}')
        if weight_activation not in WEIGHT_ACTIVATIONS:
            raise ValueError(f'weight_activation must be one of {WEIGHT_ACTIVATIONS}, got {weight_activation!r}')
        if granularity not in GRANULARITIES:
            raise ValueError(f'granularity must be one of {GRANULARITIES}, got {granularity!r}')
        self.embed_dims = embed_dims
        self.camera_window = check_window_size(window_sizes[0], 'window_sizes[0] (camera)')
        self.lidar_window = check_window_size(window_sizes[1], 'window_sizes[1] (lidar)')
        self.weight_activation = weight_activation
        self.granularity = granularity
        if aux_loss_weight < 0:
            raise ValueError(f'aux_loss_weight must be >= 0, got {aux_loss_weight}')
        self.aux_loss_weight = float(aux_loss_weight)
        if query_loss_weight < 0:
            raise ValueError(f'query_loss_weight must be >= 0, got {query_loss_weight}')
        if min_lidar_points < 1:
            raise ValueError(f'min_lidar_points must be >= 1, got {min_lidar_points}')
        if unmatched_loss_weight < 0:
            raise ValueError(f'unmatched_loss_weight must be >= 0, got {unmatched_loss_weight}')
        if unmatched_loss_weight > 0 and query_loss_weight == 0:
            raise ValueError('unmatched_loss_weight shapes the per-query routing loss: it needs query_loss_weight > 0')
        if lie_targets and query_loss_weight == 0 and aux_loss_weight == 0:
            raise ValueError('lie_targets shapes the routing losses: it needs query_loss_weight > 0 (per query) or '
                             'aux_loss_weight > 0 (per sample)')
        self.query_loss_weight = float(query_loss_weight)
        self.min_lidar_points = int(min_lidar_points)
        self.unmatched_loss_weight = float(unmatched_loss_weight)
        self.lie_targets = bool(lie_targets)
        self.attention = LocalWindowAttention(embed_dims, num_heads, attn_drop=dropout)
        self.attn_dropout = nn.Dropout(dropout)
        self.ffn = FFN(embed_dims=embed_dims, feedforward_channels=feedforward_channels, ffn_drop=dropout)
        self.norms = nn.ModuleList([nn.LayerNorm(embed_dims), nn.LayerNorm(embed_dims)])
        self.weight_head = nn.Linear(embed_dims, 2 if weight_activation == 'sigmoid' else 3)
        if weight_head_std < 0:
            raise ValueError(f'weight_head_std must be >= 0, got {weight_head_std}')
        nn.init.normal_(self.weight_head.weight, std=weight_head_std)
        with torch.no_grad():
            self.weight_head.bias.copy_(initial_logits(weight_activation, init_weight))

    def window_index(self, projection_info: Dict[str, Tensor], bev_shape: Tuple[int, int],
                     camera_shape: Tuple[int, int, int]) -> Tuple[Tensor, Tensor]:
        """Memory token indices of every query's LiDAR and camera windows.

        Args:
            projection_info (dict[str, Tensor]): from :func:`project_reference_points`.
            bev_shape (tuple[int, int]): ``(H_bev, W_bev)``.
            camera_shape (tuple[int, int, int]): ``(N, H_img, W_img)``.

        Returns:
            tuple[Tensor, Tensor]: ``index`` and ``valid``, both ``[bs, Q, L]``
            with ``L = lidar_window ** 2 + camera_window ** 2``; indices address
            the memory ``[BEV tokens ; camera tokens]``.
        """
        pers = projection_info['pts_pers_idx']
        bev_index, bev_valid = window_token_index(projection_info['pts_bev'], bev_shape,
                                                  window_offsets(self.lidar_window, pers.device))
        cam_index, cam_valid = window_token_index(
            pers[..., 1:], camera_shape[1:], window_offsets(self.camera_window, pers.device),
            center_valid=projection_info['visible'], plane=pers[..., 0].clamp(min=0),
            first_token=bev_shape[0] * bev_shape[1])
        return torch.cat([bev_index, cam_index], dim=-1), torch.cat([bev_valid, cam_valid], dim=-1)

    def forward(self,
                query_embed: Tensor,
                reference_points: Tensor,
                bev_feat: Tensor,
                img_feat: Tensor,
                geometry: CameraGeometry,
                pc_range: Sequence[float],
                bev_pos: Optional[Tensor] = None,
                img_pos: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
        """Compute the routing weights of every query.

        Args:
            query_embed (Tensor): ``[bs, Q, C]`` query features (CMT's query
                positional embeddings). Q is whatever the caller passes (900
                matching queries; DN queries are usually left out, see
                ``AttentionBiasGenerator``'s ``num_dn``).
            reference_points (Tensor): ``[bs, Q, 3]`` normalised to ``[0, 1]`` in ``pc_range``.
            bev_feat (Tensor): ``[bs, C, H_bev, W_bev]`` BEV memory.
            img_feat (Tensor): ``[bs * N, C, H_img, W_img]`` camera memory.
            geometry (CameraGeometry): the batch's cameras (``lidar2img``, image and padded sizes).
            pc_range (Sequence[float]): ``[x_min, y_min, z_min, x_max, y_max, z_max]``.
            bev_pos (Tensor, optional): BEV positional embedding,
                ``[H_bev * W_bev, C]`` or ``[bs, H_bev * W_bev, C]``; added to the keys.
            img_pos (Tensor, optional): camera positional embedding,
                ``[bs * N, H_img, W_img, C]`` or ``[bs, N * H_img * W_img, C]``.

        Returns:
            tuple: ``lidar_weights [bs, Q]``, ``camera_weights [bs, Q]`` (in
            ``[0, 1]``; the same for every query of a sample with
            ``granularity='sample'``) and ``projection_info`` (``pts_bev [bs, Q, 2]``,
            ``pts_idx [bs, Q]``, ``pts_pers_idx [bs, Q, 3]``, ``visible [bs, Q]``).
        """
        if query_embed.dim() != 3 or query_embed.shape[-1] != self.embed_dims:
            raise ValueError(f'query_embed must be [bs, Q, {self.embed_dims}], got {tuple(query_embed.shape)}')
        if tuple(reference_points.shape[:2]) != tuple(query_embed.shape[:2]):
            raise ValueError(f'reference_points {tuple(reference_points.shape)} do not match '
                             f'query_embed {tuple(query_embed.shape)}')
        if self.with_query_targets:  # supervised routing: the targets train the router, not what it reads
            query_embed, reference_points, bev_feat, img_feat = (
                query_embed.detach(), reference_points.detach(), bev_feat.detach(), img_feat.detach())
            bev_pos = bev_pos.detach() if bev_pos is not None else None
            img_pos = img_pos.detach() if img_pos is not None else None
        memory, bev_shape, camera_shape = flatten_memory(bev_feat, img_feat)
        bs, num_keys, channels = memory.shape
        if channels != self.embed_dims:
            raise ValueError(f'memory has {channels} channels, AQRWeightGenerator expects {self.embed_dims}')
        if bev_feat.shape[0] != query_embed.shape[0]:
            raise ValueError(f'bev_feat batch {bev_feat.shape[0]} != query batch {query_embed.shape[0]}')
        num_bev = bev_shape[0] * bev_shape[1]
        pos = torch.cat([
            _pos_tokens(bev_pos, bs, num_bev, channels, 'bev_pos', memory),
            _pos_tokens(img_pos, bs, num_keys - num_bev, channels, 'img_pos', memory)
        ], dim=1)
        projection_info = project_reference_points(reference_points, pc_range, bev_shape, camera_shape, geometry)
        index, valid = self.window_index(projection_info, bev_shape, camera_shape)
        attn = self.attention(query_embed, memory + pos.to(memory.dtype), memory, index, valid)
        x = self.norms[0](query_embed + self.attn_dropout(attn))
        x = self.norms[1](self.ffn(x))
        logits = self.weight_head(x)  # [bs, Q, 2 or 3]
        if self.granularity == 'sample':
            logits = logits.mean(dim=1, keepdim=True).expand_as(logits)
        if self.weight_activation == 'sigmoid':
            weights = logits.sigmoid()
            return weights[..., 0], weights[..., 1], projection_info
        probs = logits.softmax(dim=-1)
        return probs[..., 0] + probs[..., 2], probs[..., 1] + probs[..., 2], projection_info

    def loss(self, lidar_weights: Tensor, camera_weights: Tensor, img_metas: Sequence[dict]) -> Dict[str, Tensor]:
        """Auxiliary routing loss (empty dict when ``aux_loss_weight`` is 0).

        Args:
            lidar_weights (Tensor): ``[bs, Q]`` from :meth:`forward`.
            camera_weights (Tensor): ``[bs, Q]`` from :meth:`forward`.
            img_metas (Sequence[dict]): with ``dropped_modalities`` where
                ``ModalMask3D`` dropped an input (see :mod:`.aux_loss`); with
                ``lie_targets`` their corruption records.

        Returns:
            dict[str, Tensor]: ``{'loss_aqr_routing': scalar}`` or ``{}``.
        """
        if self.aux_loss_weight == 0:
            return {}
        lidar_dropped, camera_dropped = modality_drop_flags(img_metas, lidar_weights.device, self.lie_targets)
        return dict(loss_aqr_routing=self.aux_loss_weight *
                    routing_loss(lidar_weights, camera_weights, lidar_dropped, camera_dropped))

    @property
    def with_query_targets(self) -> bool:
        """Whether the per-query routing loss is on (it needs the matches and the objects' point counts)."""
        return self.query_loss_weight > 0

    @property
    def with_unmatched_targets(self) -> bool:
        """Whether the unmatched queries get routing targets (they need the input's truth at their reference
        points, ``routing_targets.unmatched_query_targets``)."""
        return self.unmatched_loss_weight > 0

    def query_loss(self, lidar_weights: Tensor, camera_weights: Tensor, matched_objects: Sequence[Sequence[Tensor]],
                   gt_centres: Sequence[Tensor], gt_num_points: Sequence[Tensor],
                   img_metas: Sequence[dict], geometry: CameraGeometry,
                   unmatched_targets: Optional[Tensor] = None) -> Dict[str, Tensor]:
        """Per-query routing loss against what still sees each matched object (empty when it is off).

        Args:
            lidar_weights (Tensor): ``[bs, Q]`` from :meth:`forward`.
            camera_weights (Tensor): ``[bs, Q]`` from :meth:`forward`.
            matched_objects (Sequence[Sequence[Tensor]]): per sample, one
                ``[Q]`` long tensor per matching (task): the object a query is
                matched to, ``-1`` where none.
            gt_centres (Sequence[Tensor]): per sample ``[n, 3]`` object centres (LiDAR frame).
            gt_num_points (Sequence[Tensor]): per sample ``[n]`` LiDAR points in each object's box.
            img_metas (Sequence[dict]): ``pad_shape``, the dead views and (``lie_targets``) the lies.
            geometry (CameraGeometry): the batch's cameras (``lidar2img``).
            unmatched_targets (Tensor, optional): ``[bs, Q, 2]`` every query's
            targets from the input's truth at its reference point; needed with
            ``unmatched_loss_weight > 0``, for the unmatched queries.

        Returns:
            dict[str, Tensor]: ``loss_aqr_query`` and ``aqr_query_accuracy``
            (matched weights on the target's side of 0.5; logged, not optimised);
            with ``unmatched_loss_weight > 0`` also ``loss_aqr_unmatched`` (the
            BCE over the unmatched queries) and ``aqr_unmatched_accuracy``.
        """
        if not self.with_query_targets:
            return {}
        bs = lidar_weights.shape[0]
        if not len(matched_objects) == len(gt_centres) == len(gt_num_points) == len(img_metas) == bs:
            raise ValueError(f'query_loss: {len(matched_objects)} matchings, {len(gt_centres)} centre sets, '
                             f'{len(gt_num_points)} point counts and {len(img_metas)} metas for a batch of {bs}')
        lidar2img = geometry.lidar2img
        targets, matched = [], []
        for index, meta in enumerate(img_metas):
            centres, num_points = gt_centres[index], gt_num_points[index].to(lidar_weights.device)
            if num_points.shape != centres.shape[:1]:
                raise ValueError(f'sample {index}: {num_points.numel()} point counts for {centres.shape[0]} objects')
            lidar_visible = num_points >= self.min_lidar_points
            if self.lie_targets and lidar_misaligned(meta):
                lidar_visible = torch.zeros_like(lidar_visible)
            sample_targets, sample_matched = matched_object_targets(
                matched_objects[index], lidar_visible,
                camera_visible_objects(centres.to(lidar2img.device), lidar2img[index], meta, self.lie_targets))
            targets.append(sample_targets)
            matched.append(sample_matched)
        targets, matched = torch.stack(targets), torch.stack(matched)
        loss = query_target_loss(lidar_weights, camera_weights, targets, matched)
        losses = dict(loss_aqr_query=self.query_loss_weight * loss,
                      aqr_query_accuracy=self._accuracy(lidar_weights, camera_weights, targets, matched))
        if self.with_unmatched_targets:
            if unmatched_targets is None or unmatched_targets.shape != targets.shape:
                raise ValueError(f'unmatched_loss_weight > 0 needs unmatched_targets {tuple(targets.shape)} (the '
                                 f'input\'s truth at each query\'s reference point, QueryRouter computes it)')
            unmatched = ~matched
            unmatched_loss = query_target_loss(lidar_weights, camera_weights, unmatched_targets, unmatched)
            losses.update(loss_aqr_unmatched=self.unmatched_loss_weight * unmatched_loss,
                          aqr_unmatched_accuracy=self._accuracy(lidar_weights, camera_weights, unmatched_targets,
                                                                unmatched))
        return losses

    @staticmethod
    def _accuracy(lidar_weights: Tensor, camera_weights: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
        """The share of the weights of the ``mask`` ed queries ``[bs, Q]`` on their target's side of 0.5."""
        weights = torch.stack([lidar_weights, camera_weights], dim=-1).detach()
        correct = ((weights > 0.5) == (targets > 0.5)).float().mean(dim=-1)
        return (correct * mask).sum() / mask.sum().clamp(min=1)
