"""CMT's decoder: ``PETRTransformerDecoder`` (a stack) and ``PETRTransformerDecoderLayer``.

Each layer runs ``self_attn -> norm -> cross_attn -> norm -> ffn -> norm``
(mmcv ``BaseTransformerLayer``). Its ``attn_masks`` list is indexed per
attention in ``operation_order``: index 0 is the self-attention (CMT's
denoising mask, bool ``[Q, Q]``), index 1 the cross-attention (a mask or
additive bias, e.g. AQR's). Gradient checkpointing (``with_cp``) keeps every
argument, the masks included.
"""
from typing import List, Optional, Sequence, Union

import torch
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.registry import TRANSFORMER_LAYER, TRANSFORMER_LAYER_SEQUENCE
from mmcv.cnn.bricks.transformer import BaseTransformerLayer, TransformerLayerSequence
from torch.utils.checkpoint import checkpoint

from ...attention.bias import DecoderBias, LayerBias, PerLayer

_CMT_OPERATIONS = {'self_attn', 'norm', 'cross_attn', 'ffn'}


def _layer_masks(attn_masks: Union[None, torch.Tensor, Sequence[Optional[DecoderBias]]], layer: int,
                 num_layers: int) -> Union[None, torch.Tensor, List[Optional[LayerBias]]]:
    """``attn_masks`` as layer ``layer`` sees it: every :class:`PerLayer` entry replaced by its element."""
    if attn_masks is None or isinstance(attn_masks, torch.Tensor):
        return attn_masks
    masks = []
    for mask in attn_masks:
        if isinstance(mask, PerLayer):
            if len(mask) != num_layers:
                raise ValueError(f'a PerLayer attention mask has {len(mask)} entries for {num_layers} decoder layers')
            mask = mask[layer]
        masks.append(mask)
    return masks


@TRANSFORMER_LAYER_SEQUENCE.register_module()
class PETRTransformerDecoder(TransformerLayerSequence):
    """A stack of decoder layers with a final LayerNorm.

    Args:
        post_norm_cfg (dict, optional): norm applied to each returned output;
            None for no norm.
        return_intermediate (bool): return the (normed) output of every layer
            instead of only the last one.
        transformerlayers (dict | list[dict]): layer config(s).
        num_layers (int): number of layers.
        init_cfg (dict, optional): mmcv init config.
    """

    def __init__(self, *args, post_norm_cfg: Optional[dict] = dict(type='LN'), return_intermediate: bool = False,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.return_intermediate = return_intermediate
        self.post_norm = build_norm_layer(post_norm_cfg, self.embed_dims)[1] if post_norm_cfg is not None else None

    def _normed(self, x: torch.Tensor) -> torch.Tensor:
        return self.post_norm(x) if self.post_norm is not None else x

    def forward(self, query: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """Run every layer.

        Args:
            query (Tensor): ``[Q, bs, C]``.
            *args, **kwargs: passed to every layer (``key``, ``value``,
                ``query_pos``, ``key_pos``, ``attn_masks``, ...); a
                :class:`PerLayer` entry of ``attn_masks`` gives each layer its own mask.

        Returns:
            Tensor: ``[num_layers, Q, bs, C]`` if ``return_intermediate``, else
            ``[1, Q, bs, C]``.
        """
        outputs = []
        attn_masks = kwargs.pop('attn_masks', None)
        for index, layer in enumerate(self.layers):
            query = layer(query, *args, attn_masks=_layer_masks(attn_masks, index, self.num_layers), **kwargs)
            if self.return_intermediate:
                outputs.append(self._normed(query))
        if not self.return_intermediate:
            outputs.append(self._normed(query))
        return torch.stack(outputs)


@TRANSFORMER_LAYER.register_module()
class PETRTransformerDecoderLayer(BaseTransformerLayer):
    """mmcv ``BaseTransformerLayer`` with CMT's operation order and safe checkpointing.

    Args:
        attn_cfgs (list[dict]): the self- and cross-attention configs.
        operation_order (tuple[str]): six operations, each of ``self_attn``,
            ``norm``, ``cross_attn``, ``ffn`` present.
        with_cp (bool): recompute the layer in the backward pass (training
            only) to save memory. Upstream CMT's default is True.
        **kwargs: the other ``BaseTransformerLayer`` arguments (``ffn_cfgs``,
            ``norm_cfg``, ``batch_first``, ...).
    """

    def __init__(self, attn_cfgs, operation_order=None, with_cp: bool = True, **kwargs) -> None:
        super().__init__(attn_cfgs=attn_cfgs, operation_order=operation_order, **kwargs)
        if len(self.operation_order) != 6 or set(self.operation_order) != _CMT_OPERATIONS:
            raise ValueError(f'PETRTransformerDecoderLayer needs 6 operations using each of '
                             f'{sorted(_CMT_OPERATIONS)}, got {self.operation_order}')
        self.with_cp = with_cp

    def forward(self,
                query: torch.Tensor,
                key: Optional[torch.Tensor] = None,
                value: Optional[torch.Tensor] = None,
                query_pos: Optional[torch.Tensor] = None,
                key_pos: Optional[torch.Tensor] = None,
                attn_masks: Union[None, torch.Tensor, Sequence[Optional[LayerBias]]] = None,
                query_key_padding_mask: Optional[torch.Tensor] = None,
                key_padding_mask: Optional[torch.Tensor] = None,
                **kwargs) -> torch.Tensor:
        """Run the layer.

        Args:
            query (Tensor): ``[Q, bs, C]``.
            key, value (Tensor, optional): ``[K, bs, C]`` memory.
            query_pos, key_pos (Tensor, optional): positional encodings.
            attn_masks (list, optional): ``[self_attn_mask, cross_attn_mask]``,
                each a tensor, an ``AttentionBias`` or None.
            query_key_padding_mask (Tensor, optional): ``[bs, Q]`` for the
                self-attention.
            key_padding_mask (Tensor, optional): ``[bs, K]`` for the cross-attention.
            **kwargs: passed to the attentions.

        Returns:
            Tensor: ``[Q, bs, C]``.
        """
        def run(layer_query: torch.Tensor) -> torch.Tensor:
            return BaseTransformerLayer.forward(
                self, layer_query, key=key, value=value, query_pos=query_pos, key_pos=key_pos,
                attn_masks=attn_masks, query_key_padding_mask=query_key_padding_mask,
                key_padding_mask=key_padding_mask, **kwargs)

        if self.with_cp and self.training and torch.is_grad_enabled():
            return checkpoint(run, query, use_reentrant=False)
        return run(query)
