"""Local attention mask (LAM) as sparse products over each query's window tokens.

Instead of a dense ``[bs * heads, Q, K]`` boolean mask, every query addresses
the memory tokens inside its windows (``window_size x window_size`` cells
around its projected cell: at most ``15 * 15`` camera + ``5 * 5`` BEV tokens
with the defaults) through an index tensor, and attends over those only. This
is exact: a masked-out key contributes ``exp(-inf) = 0`` to a dense softmax,
so dropping it changes nothing. Cost: ``O(Q * L * C)`` with ``L`` the window
length, independent of the number of keys ``K``.

A window is the square of cells with Chebyshev distance ``<= window_size // 2``
from the centre cell. Cells outside the grid (windows clipped at borders) and
every camera cell of a query visible in no view are padded: their index points
at the grid's first token and their validity flag is False
(:func:`~projects.mmdet3d_plugin.attention.bias.window_cells.window_token_index`).
"""
from typing import Optional

import torch
from torch import Tensor, nn

from ...attention.slots import SlotPattern


class WindowAttentionFunction(torch.autograd.Function):
    """Softmax attention of each query over its own window slots, with sparse slot products and no gathered copy.

    The forward computes ``p = softmax_j(scale * q . k_j)`` over the valid
    slots ``j`` of each query and ``out = sum_j p_j keep_j v_j``; the backward
    is written out (``dS = p (dP - sum_j p_j dP_j)`` with
    ``dP_j = keep_j dout . v_j``) with the same products, so neither pass makes
    a ``[bs, Q, L, C]`` copy of the window tokens.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, pattern: SlotPattern, valid: Tensor,
                keep: Optional[Tensor], scale: float) -> Tensor:
        """Args: q ``[bs, heads, Q, d]``; k, v ``[bs, heads, K, d]``; pattern (the ``[bs, Q, L]`` slots);
        valid ``[bs, 1, Q, L]`` bool; keep ``[bs, heads, Q, L]`` dropout scale (0 or 1 / (1 - p)) or None;
        scale. Returns ``[bs, heads, Q, d]`` in v's dtype (a query with no valid slot gets 0)."""
        invalid = ~valid
        scores = pattern.dot(q, k, scale).masked_fill_(invalid, float('-inf'))
        # a query without a valid slot gets a row of NaN from the softmax, all of it invalid: zeroed by the fill
        probs = torch.softmax(scores, -1).masked_fill_(invalid, 0.0)
        weights = probs if keep is None else probs * keep
        ctx.save_for_backward(q, k, v, probs, keep)
        ctx.pattern, ctx.scale = pattern, scale
        return pattern.weighted_sum(weights, v).to(v.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, probs, keep = ctx.saved_tensors
        pattern, scale = ctx.pattern, ctx.scale
        grad_out = grad_out.float()
        grad_probs = pattern.dot(grad_out, v)
        if keep is not None:
            grad_probs.mul_(keep)
        grad_scores = probs * (grad_probs - (probs * grad_probs).sum(-1, keepdim=True))
        grad_q = pattern.weighted_sum(grad_scores, k).mul_(scale)
        grad_k = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        pattern.scatter_add_(grad_k, grad_scores, q, alpha=scale)
        grad_v = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        pattern.scatter_add_(grad_v, probs if keep is None else probs * keep, grad_out)
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None, None, None


class LocalWindowAttention(nn.Module):
    """Multi-head attention of each query over its own window tokens.

    Projections are applied to the whole memory once (``K`` tokens), then each
    query attends over its window slots through sparse slot products
    (:class:`WindowAttentionFunction`), so the cost is
    ``O(K * C^2 + Q * L * C)``, no ``[Q, K]`` tensor exists and no
    ``[Q, L, C]`` copy of the window tokens is made.

    Args:
        embed_dims (int): channels ``C``.
        num_heads (int): attention heads; must divide ``embed_dims``.
        attn_drop (float): dropout on the attention probabilities.
    """

    def __init__(self, embed_dims: int, num_heads: int, attn_drop: float = 0.0) -> None:
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims ({embed_dims}) must be divisible by num_heads ({num_heads})')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.q_proj = nn.Linear(embed_dims, embed_dims)
        self.k_proj = nn.Linear(embed_dims, embed_dims)
        self.v_proj = nn.Linear(embed_dims, embed_dims)
        self.out_proj = nn.Linear(embed_dims, embed_dims)
        self.attn_drop = nn.Dropout(attn_drop)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, index: Tensor, valid: Tensor) -> Tensor:
        """Attend over the window tokens.

        Args:
            query (Tensor): ``[bs, Q, C]`` (positional embedding already added).
            key (Tensor): ``[bs, K, C]`` memory (positional embedding already added).
            value (Tensor): ``[bs, K, C]`` memory.
            index (Tensor): ``[bs, Q, L]`` long token index of each window slot.
            valid (Tensor): ``[bs, Q, L]`` bool; False slots are ignored. A query
                with no valid slot gets a zero attention output (then
                ``out_proj``'s bias), never NaN.

        Returns:
            Tensor: ``[bs, Q, C]``.
        """
        bs, num_query, _ = query.shape
        heads, head_dim = self.num_heads, self.embed_dims // self.num_heads
        q = self.q_proj(query).reshape(bs, num_query, heads, head_dim).transpose(1, 2)
        k = self.k_proj(key).reshape(bs, key.size(1), heads, head_dim).transpose(1, 2)
        v = self.v_proj(value).reshape(bs, value.size(1), heads, head_dim).transpose(1, 2)
        keep = None
        if self.training and self.attn_drop.p > 0:
            # the dropout scale of every (query, head, slot), drawn in the order nn.Dropout draws it on [bs, Q, h, L]
            keep = self.attn_drop(torch.ones(bs, num_query, heads, index.size(-1), device=query.device))
            keep = keep.permute(0, 2, 1, 3)
        pattern = SlotPattern(index, key.size(1), heads)
        with torch.autocast(query.device.type, enabled=False):  # the products run in float32 themselves
            out = WindowAttentionFunction.apply(q, k, v, pattern, valid[:, None], keep, head_dim**-0.5)
        out = out.transpose(1, 2).reshape(bs, num_query, self.embed_dims)
        return self.out_proj(out)
