"""Where the fused pass attends: per query, the share of its cross-attention on the camera keys.

When a sensor fails, routing should move the decoder's attention off that
sensor's keys. :func:`record_camera_mass` measures it while the model runs
its ordinary test forward: in the last decoder layer of the head's
``transformer`` (the fused pass's decoder), the probabilities of the
cross-attention over the fused memory ``[BEV ; camera]``
(:meth:`~..models.utils.petr_attention.BiasedMultiheadAttention.attention_weights`:
dense, evaluation only), summed over the camera keys and averaged over the
heads; the rest of each query's attention is on the BEV (LiDAR) keys::

    with record_camera_mass(model.pts_bbox_head) as mass:
        model.simple_test(points, img_metas, img)
    mass.latest          # [bs, Q], or None when the fused pass did not decode in the last forward
"""
import contextlib
import inspect
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import Tensor, nn


@dataclass
class CameraMass:
    """The camera-key mass of the fused pass in the head's last forward.

    Attributes:
        latest (Tensor, optional): ``[bs, Q]`` in ``[0, 1]``; None when the last forward decoded no fused memory
            (a frame decoded by the camera pass, a model without cameras or without BEV features).
    """

    latest: Optional[Tensor] = None


def fused_cross_attention(head: nn.Module) -> nn.Module:
    """The attention module (``BiasedMultiheadAttention``) of the cross-attention of the last layer of
    ``head.transformer``."""
    layer = head.transformer.decoder.layers[-1]
    attentions = [operation for operation in layer.operation_order if operation in ('self_attn', 'cross_attn')]
    return layer.attentions[attentions.index('cross_attn')].attn


@contextlib.contextmanager
def record_camera_mass(head: nn.Module) -> Iterator[CameraMass]:
    """Within the block, each forward of ``head`` sets the yielded record's ``latest`` (see the module doc).

    Args:
        head (nn.Module): a ``CmtHead`` whose ``transformer`` takes the BEV memory ``x`` and the camera memory
            ``x_img`` and lays the fused keys out as ``[BEV ; camera]``.

    Yields:
        CameraMass: updated by every forward of the head.
    """
    record = CameraMass()
    signature = inspect.signature(head.transformer.forward)
    bev_keys = []

    def start(module: nn.Module, args: tuple) -> None:
        record.latest = None

    def read_memory(module: nn.Module, args: tuple, kwargs: dict) -> None:
        inputs = signature.bind(*args, **kwargs).arguments
        bev, camera = inputs.get('x'), inputs.get('x_img')
        bev_keys[:] = [bev.shape[-2] * bev.shape[-1]] if bev is not None and camera is not None else []

    def measure(module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> None:
        query, key = args[:2]
        if not bev_keys or key.size(1) <= bev_keys[0]:  # not the fused memory
            return
        with torch.no_grad():
            weights = module.attention_weights(query, key, bias=kwargs.get('bias'),
                                               key_padding_mask=kwargs.get('key_padding_mask'))
        record.latest = weights[..., bev_keys[0]:].sum(-1).mean(1).detach()

    handles = [head.register_forward_pre_hook(start),
               head.transformer.register_forward_pre_hook(read_memory, with_kwargs=True),
               fused_cross_attention(head).register_forward_hook(measure, with_kwargs=True)]
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()
