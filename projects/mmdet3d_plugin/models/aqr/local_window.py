"""Local attention mask (LAM) as a sparse gather of each query's window tokens.

Instead of a dense ``[bs * heads, Q, K]`` boolean mask, every query gathers
the memory tokens inside its windows (``window_size x window_size`` cells
around its projected cell: at most ``15 * 15`` camera + ``5 * 5`` BEV tokens
with the defaults) through an index tensor, and attends over those only. This
is exact: a masked-out key contributes ``exp(-inf) = 0`` to a dense softmax,
so dropping it changes nothing. Cost: ``O(Q * L * C)`` with ``L`` the window
length, independent of the number of keys ``K``.

A window is the square of cells with Chebyshev distance ``<= window_size // 2``
from the centre cell. Cells outside the grid (windows clipped at borders) and
every camera cell of a query visible in no view are padded: their index points
at token 0 and their validity flag is False.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def check_window_size(window_size: int, name: str = 'window_size') -> int:
    """Validate an odd, positive window size and return it as ``int``."""
    if isinstance(window_size, bool) or int(window_size) != window_size or window_size < 1 or window_size % 2 == 0:
        raise ValueError(f'{name} must be an odd positive integer, got {window_size!r}')
    return int(window_size)


def window_offsets(window_size: int, device: Optional[torch.device] = None) -> Tensor:
    """Cell offsets of a square window.

    Args:
        window_size (int): odd side length.
        device (torch.device, optional): device of the result.

    Returns:
        Tensor: ``[window_size ** 2, 2]`` long ``(dy, dx)`` in row-major order.
    """
    radius = check_window_size(window_size) // 2
    steps = torch.arange(-radius, radius + 1, device=device)
    dy, dx = torch.meshgrid(steps, steps, indexing='ij')
    return torch.stack([dy.reshape(-1), dx.reshape(-1)], dim=-1)


def window_token_index(centers: Tensor,
                       grid_hw: Tuple[int, int],
                       window_size: int,
                       center_valid: Optional[Tensor] = None,
                       plane: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Flattened token indices of every query's window on a grid.

    Args:
        centers (Tensor): ``[bs, Q, 2]`` long ``(y, x)`` centre cells.
        grid_hw (tuple[int, int]): ``(H, W)`` of the grid.
        window_size (int): odd window side length.
        center_valid (Tensor, optional): ``[bs, Q]`` bool; a query whose centre
            is invalid gets no valid token (e.g. invisible to every camera).
        plane (Tensor, optional): ``[bs, Q]`` long plane (camera view) of each
            centre; the index is then ``plane * H * W + y * W + x``.

    Returns:
        tuple[Tensor, Tensor]: ``index`` ``[bs, Q, L]`` long (0 where invalid)
        and ``valid`` ``[bs, Q, L]`` bool, ``L = window_size ** 2``.
    """
    height, width = (int(s) for s in grid_hw)
    offsets = window_offsets(window_size, centers.device)  # [L, 2]
    ys = centers[..., 0:1] + offsets[:, 0]  # [bs, Q, L]
    xs = centers[..., 1:2] + offsets[:, 1]
    valid = (ys >= 0) & (ys < height) & (xs >= 0) & (xs < width)
    if center_valid is not None:
        valid = valid & center_valid[..., None]
    index = ys * width + xs
    if plane is not None:
        index = index + plane[..., None] * (height * width)
    return torch.where(valid, index, torch.zeros_like(index)), valid


def gather_tokens(tokens: Tensor, index: Tensor) -> Tensor:
    """Gather per-query tokens.

    Args:
        tokens (Tensor): ``[bs, K, C]``.
        index (Tensor): ``[bs, Q, L]`` long, values in ``[0, K)``.

    Returns:
        Tensor: ``[bs, Q, L, C]``.
    """
    bs, num_query, length = index.shape
    flat = index.reshape(bs, num_query * length, 1).expand(-1, -1, tokens.shape[-1])
    return tokens.gather(1, flat).reshape(bs, num_query, length, tokens.shape[-1])


class LocalWindowAttention(nn.Module):
    """Multi-head attention of each query over its own gathered window tokens.

    Projections are applied to the whole memory once (``K`` tokens), then the
    projected keys/values of every query's window are gathered, so the cost is
    ``O(K * C^2 + Q * L * C)`` and no ``[Q, K]`` tensor exists.

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
        q = self.q_proj(query).reshape(bs, num_query, heads, head_dim)
        k = gather_tokens(self.k_proj(key), index).reshape(bs, num_query, -1, heads, head_dim)
        v = gather_tokens(self.v_proj(value), index).reshape(bs, num_query, -1, heads, head_dim)
        scores = torch.einsum('bqhd,bqlhd->bqhl', q, k).float() * head_dim**-0.5
        slot_valid = valid[:, :, None, :]  # [bs, Q, 1, L]
        any_valid = valid.any(dim=-1)[:, :, None, None]
        scores = scores.masked_fill(~slot_valid, float('-inf')).masked_fill(~any_valid, 0.0)
        probs = F.softmax(scores, dim=-1) * slot_valid
        probs = self.attn_drop(probs).to(v.dtype)
        out = torch.einsum('bqhl,bqlhd->bqhd', probs, v).reshape(bs, num_query, self.embed_dims)
        return self.out_proj(out)
