"""CMT's transformer: the memory of BEV and/or camera tokens fed to the PETR decoder.

``CmtTransformer`` builds the memory from the tokens it is given: ``[BEV
tokens ; camera tokens]`` with both, one modality's tokens when the other's
features are None (a LiDAR-only or camera-only head, a single-modality
decoding pass of ``CmtHead``): which keys a head decodes is the head's
choice (``PassPlan``), not the transformer's. Upstream CMT's names of its
LiDAR-only and camera-only transformers, ``CmtLidarTransformer`` and
``CmtImageTransformer``, are legacy names that ``config_upgrade`` rewrites
(registered only to refuse, naming ``CmtTransformer``). It owns no parameters
besides the decoder's, so upstream checkpoints map onto
``transformer.decoder.*`` unchanged.

Token order (the order of the keys K, which any cross-attention bias must
follow): BEV cell ``(h, w)`` is key ``h * W + w``; camera cell ``(v, h, w)``
of view ``v`` comes after all BEV keys, at ``H * W + (v * h_img + h) * w_img + w``.
"""
from typing import Optional, Tuple

import torch
from mmcv.cnn import xavier_init
from mmcv.cnn.bricks.transformer import build_transformer_layer_sequence
from mmcv.runner.base_module import BaseModule
from mmdet.models.utils.builder import TRANSFORMER

from ...attention.bias import DecoderBias
from ...config_upgrade import register_legacy_types


def flatten_bev(bev_feat: torch.Tensor) -> torch.Tensor:
    """``[bs, C, H, W]`` BEV map -> ``[H * W, bs, C]`` tokens (row-major)."""
    return bev_feat.flatten(2).permute(2, 0, 1)


def flatten_views(img_feat: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``[bs * N, h, w, C]`` per-view maps (channels last) -> ``[N * h * w, bs, C]`` tokens."""
    if img_feat.size(0) % batch_size:
        raise ValueError(f'{img_feat.size(0)} camera feature maps cannot be split into {batch_size} samples')
    num_views = img_feat.size(0) // batch_size
    _, height, width, channels = img_feat.shape
    tokens = img_feat.reshape(batch_size, num_views * height * width, channels)
    return tokens.transpose(0, 1)


def bev_memory(bev_feat: torch.Tensor, bev_pos_embed: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """BEV tokens and their position embeddings.

    Args:
        bev_feat (Tensor): ``[bs, C, H, W]``.
        bev_pos_embed (Tensor): ``[H * W, C]`` (shared by the samples).

    Returns:
        tuple[Tensor, Tensor]: memory and position embeddings, each ``[H * W, bs, C]``.
    """
    return flatten_bev(bev_feat), bev_pos_embed.unsqueeze(1).expand(-1, bev_feat.size(0), -1)


def camera_memory(img_feat: torch.Tensor, rv_pos_embed: torch.Tensor,
                  batch_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Camera tokens and their position embeddings.

    Args:
        img_feat (Tensor): ``[bs * N, C, h, w]``.
        rv_pos_embed (Tensor): ``[bs * N, h, w, C]``.
        batch_size (int): bs.

    Returns:
        tuple[Tensor, Tensor]: memory and position embeddings, each ``[N * h * w, bs, C]``.
    """
    return flatten_views(img_feat.permute(0, 2, 3, 1), batch_size), flatten_views(rv_pos_embed, batch_size)


@TRANSFORMER.register_module()
class CmtTransformer(BaseModule):
    """Queries attend to ``[BEV tokens ; camera tokens]``, or to the tokens of one of them.

    Args:
        decoder (dict): ``PETRTransformerDecoder`` config.
        init_cfg (dict, optional): mmcv init config.
    """

    def __init__(self, decoder: dict, init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.decoder = build_transformer_layer_sequence(decoder)
        self.embed_dims = self.decoder.embed_dims

    def init_weights(self) -> None:
        """DETR's initialisation: Xavier-uniform for every weight matrix."""
        for module in self.modules():
            if hasattr(module, 'weight') and module.weight is not None and module.weight.dim() > 1:
                xavier_init(module, distribution='uniform')
        self._is_init = True

    def _decode(self, memory: torch.Tensor, pos_embed: torch.Tensor, query_embed: torch.Tensor,
                self_attn_mask: Optional[torch.Tensor], cross_attn_bias: Optional[DecoderBias]) -> torch.Tensor:
        """Decode zero-initialised queries against ``memory``.

        Args:
            memory (Tensor): ``[K, bs, C]``.
            pos_embed (Tensor): ``[K, bs, C]``.
            query_embed (Tensor): ``[bs, Q, C]`` query positional embeddings.
            self_attn_mask (Tensor, optional): ``[Q, Q]`` bool, True = blocked.
            cross_attn_bias (DecoderBias, optional): mask or additive bias on
                the ``[bs, heads, Q, K]`` cross-attention scores (a ``PerLayer``: one per layer).

        Returns:
            Tensor: ``[num_layers, bs, Q, C]``.
        """
        if memory.shape != pos_embed.shape:
            raise ValueError(f'memory {tuple(memory.shape)} and its position embedding '
                             f'{tuple(pos_embed.shape)} differ in shape')
        query_pos = query_embed.transpose(0, 1)
        target = torch.zeros_like(query_pos)
        out_dec = self.decoder(
            query=target,
            key=memory,
            value=memory,
            key_pos=pos_embed,
            query_pos=query_pos,
            attn_masks=[self_attn_mask, cross_attn_bias])
        return out_dec.transpose(1, 2)

    def forward(self, x: Optional[torch.Tensor], x_img: Optional[torch.Tensor], query_embed: torch.Tensor,
                bev_pos_embed: Optional[torch.Tensor], rv_pos_embed: Optional[torch.Tensor],
                self_attn_mask: Optional[torch.Tensor] = None,
                cross_attn_bias: Optional[DecoderBias] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Decode.

        Args:
            x (Tensor, optional): ``[bs, C, H, W]`` BEV features; None decodes
                against the camera tokens only.
            x_img (Tensor, optional): ``[bs * N, C, h, w]`` camera features;
                None decodes against the BEV tokens only.
            query_embed (Tensor): ``[bs, Q, C]``; its first dim gives bs.
            bev_pos_embed (Tensor, optional): ``[H * W, C]`` (with ``x``).
            rv_pos_embed (Tensor, optional): ``[bs * N, h, w, C]`` (with ``x_img``).
            self_attn_mask (Tensor, optional): ``[Q, Q]`` bool (DN mask).
            cross_attn_bias (DecoderBias, optional): over the keys
                given, ``K = H * W + N * h * w`` with both, in the module
                docstring's order.

        Returns:
            tuple[Tensor, Tensor]: decoder outputs ``[num_layers, bs, Q, C]``
            and the memory ``[K, bs, C]``.
        """
        parts = []
        if x is not None:
            parts.append(bev_memory(x, bev_pos_embed))
        if x_img is not None:
            parts.append(camera_memory(x_img, rv_pos_embed, query_embed.size(0)))
        if not parts:
            raise ValueError('CmtTransformer needs BEV features (x), camera features (x_img) or both')
        memory, pos_embed = (torch.cat(tensors, dim=0) for tensors in zip(*parts))
        return self._decode(memory, pos_embed, query_embed, self_attn_mask, cross_attn_bias), memory


register_legacy_types(TRANSFORMER, ('CmtLidarTransformer', 'CmtImageTransformer'))
