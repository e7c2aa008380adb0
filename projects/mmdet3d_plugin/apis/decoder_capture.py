"""What a CMT head decided for one batch: its raw predictions, AQR's routing and the cross-attention bias.

:func:`capture_decoder` hooks the head and its transformer while the model
runs its ordinary test forward, so the pictures show what the decoder really
received (not a recomputation)::

    with capture_decoder(model.pts_bbox_head) as snapshot:
        results = wrapped_model(return_loss=False, rescale=True, **data)
    snapshot.routing            # QueryRouting or None (plain CMT)
    snapshot.cross_attn_bias    # AttentionBias / PerLayer or None
"""
import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..attention import DecoderBias
from ..models.dense_heads.query_router import QueryRouting, routing_of


@dataclass
class DecoderSnapshot:
    """The head's inputs and outputs of the last forward pass.

    Attributes:
        preds_dicts (tuple[list[dict]], optional): the head's output (per task).
        cross_attn_bias (optional): the ``cross_attn_bias`` the transformer got
            (``AttentionBias``, ``PerLayer`` of them, or None).
        bev_shape (tuple[int, int], optional): ``(H_bev, W_bev)`` of the BEV memory.
        camera_shape (tuple[int, int, int], optional): ``(N, H_img, W_img)``.
    """

    preds_dicts: Optional[Tuple[List[dict], ...]] = None
    cross_attn_bias: Optional[DecoderBias] = None
    bev_shape: Optional[Tuple[int, int]] = None
    camera_shape: Optional[Tuple[int, int, int]] = None

    @property
    def routing(self) -> Optional[QueryRouting]:
        """AQR's routing of the matching queries (None without AQR)."""
        if self.preds_dicts is None:
            raise RuntimeError('the head has not run inside capture_decoder')
        return routing_of(self.preds_dicts)


@contextlib.contextmanager
def capture_decoder(head: nn.Module) -> Iterator[DecoderSnapshot]:
    """Record the head's predictions and its transformer's memory shapes and bias while the block runs.

    Args:
        head (nn.Module): a ``CmtHead`` (or a variant) with a ``transformer``
            whose ``forward`` names the BEV memory ``x``, the camera memory
            ``x_img`` and the bias ``cross_attn_bias``.

    Yields:
        DecoderSnapshot: filled in by every forward pass of the head.
    """
    snapshot = DecoderSnapshot()
    signature = inspect.signature(head.transformer.forward)

    def record_predictions(module: nn.Module, args: tuple, output: Tuple[List[dict], ...]) -> None:
        snapshot.preds_dicts = output

    def record_decoder_inputs(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        inputs = signature.bind(*args, **kwargs).arguments
        snapshot.cross_attn_bias = inputs.get('cross_attn_bias')
        bev, camera = inputs.get('x'), inputs.get('x_img')
        batch_size = inputs['query_embed'].size(0)
        snapshot.bev_shape = tuple(bev.shape[-2:]) if bev is not None else None
        snapshot.camera_shape = ((camera.size(0) // batch_size, *camera.shape[-2:]) if camera is not None else None)

    handles = [head.register_forward_hook(record_predictions),
               head.transformer.register_forward_hook(record_decoder_inputs, with_kwargs=True)]
    try:
        yield snapshot
    finally:
        for handle in handles:
            handle.remove()


def query_scores(preds_dicts: Sequence[List[dict]]) -> Tuple[Tensor, Tensor]:
    """Best class score of every query in the last decoder layer.

    Args:
        preds_dicts (Sequence[list[dict]]): a CMT head's output; per task
            ``cls_logits`` ``[L, bs, Q, C_t]``.

    Returns:
        tuple[Tensor, Tensor]: ``[bs, Q]`` sigmoid scores and ``[bs, Q]`` class
        indices (over the tasks' classes in order, i.e. the global classes).
    """
    logits = torch.cat([task[0]['cls_logits'][-1] for task in preds_dicts], dim=-1)
    return logits.float().sigmoid().max(dim=-1)
