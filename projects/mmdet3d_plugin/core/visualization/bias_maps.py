"""One query's cross-attention bias, laid out on CMT's BEV and camera key grids."""
from typing import Optional, Tuple

import numpy as np
import torch

from ...attention import DecoderBias, as_attention_bias


def query_bias_row(bias: DecoderBias, query: int, num_matching: Optional[int] = None, batch: int = 0,
                   layer: int = -1) -> Tuple[np.ndarray, int]:
    """The bias the cross-attention adds to the scores of one query over every key.

    Args:
        bias (DecoderBias): the decoder's cross-attention bias; a
            ``PerLayer`` (or any sequence) holds one per layer.
        query (int): index among the decoder's queries, or among the
            matching queries when ``num_matching`` is given.
        num_matching (int, optional): number of matching queries; they are
            the last ones (DN queries come first in CMT's decoder).
        batch (int): sample of the batch.
        layer (int): decoder layer, for a per-layer bias.

    Returns:
        tuple[np.ndarray, int]: the ``[K]`` float32 bias (the mean over the
        heads for a per-head bias) and the number of heads it was averaged over.

    Raises:
        IndexError: ``query`` is not a query of the bias.
    """
    if isinstance(bias, (list, tuple)):
        bias = bias[layer]
    bias = as_attention_bias(bias)
    if num_matching is not None:
        if not 0 <= query < num_matching <= bias.num_queries:
            raise IndexError(f'query {query} is not among the {num_matching} matching queries of {bias.describe()}')
        query += bias.num_queries - num_matching
    if not 0 <= query < bias.num_queries:
        raise IndexError(f'query {query} is not among the {bias.num_queries} queries of {bias.describe()}')
    index = torch.tensor([query], device=bias.device)
    dense = bias.select_queries(batch, index).to_dense(torch.float32)  # [1, heads | 1, 1, K]
    return dense[0, :, 0].mean(dim=0).detach().cpu().numpy(), int(dense.size(1))


def split_key_bias(row: np.ndarray, bev_shape: Tuple[int, int],
                   camera_shape: Tuple[int, int, int]) -> Tuple[np.ndarray, np.ndarray]:
    """Split a ``[K]`` row over CMT's keys ``[BEV tokens ; camera tokens]`` into its two grids.

    Args:
        row (np.ndarray): ``[H_bev * W_bev + N * H_img * W_img]``.
        bev_shape (tuple[int, int]): ``(H_bev, W_bev)``; BEV token
            ``y * W_bev + x`` (row ``y`` from ``y_min``, column ``x`` from ``x_min``).
        camera_shape (tuple[int, int, int]): ``(N, H_img, W_img)``; camera
            tokens in ``(view, h, w)`` order.

    Returns:
        tuple[np.ndarray, np.ndarray]: ``[H_bev, W_bev]`` and ``[N, H_img, W_img]``.
    """
    row = np.asarray(row)
    bev_h, bev_w = (int(s) for s in bev_shape)
    views, img_h, img_w = (int(s) for s in camera_shape)
    num_bev = bev_h * bev_w
    if row.shape != (num_bev + views * img_h * img_w, ):
        raise ValueError(f'a bias row of shape {row.shape} does not cover {bev_h}x{bev_w} BEV keys and '
                         f'{views}x{img_h}x{img_w} camera keys')
    return row[:num_bev].reshape(bev_h, bev_w), row[num_bev:].reshape(views, img_h, img_w)
