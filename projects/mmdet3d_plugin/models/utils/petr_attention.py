"""Attention modules of CMT's decoder, under upstream CMT's registry names.

* ``PETRMultiheadAttention``: mmcv's ``MultiheadAttention`` (a wrapper of
  ``torch.nn.MultiheadAttention``) under CMT's name.
* ``PETRMultiheadFlashAttention``: the cross-attention. Same parameter names as
  ``nn.MultiheadAttention`` (``attn.in_proj_weight``, ``attn.in_proj_bias``,
  ``attn.out_proj``) so CMT checkpoints load, but the attention itself runs
  through :func:`projects.mmdet3d_plugin.attention.dispatch.apply_attention`,
  which picks a backend (math / SDPA / segment / FlashBias / flex /
  flash-attn) and applies the mask or bias it is given, or raises.
  Upstream CMT's version silently dropped ``attn_mask``; this one never does.
  Like upstream's, it computes the attention in float16 on CUDA between
  float32 projections (``attention_dtype``, see ``attention/precision.py``).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from mmcv.cnn.bricks.drop import build_dropout
from mmcv.cnn.bricks.registry import ATTENTION
from mmcv.cnn.bricks.transformer import MultiheadAttention
from mmcv.runner.base_module import BaseModule
from torch import nn

from ...attention.backends.base import dense_additive_bias
from ...attention.backends.math import reference_probabilities
from ...attention.bias import LayerBias
from ...attention.dispatch import apply_attention
from ...attention.precision import attention_compute_dtype, check_attention_dtype
from ...config_upgrade import current_keys_only


@ATTENTION.register_module()
@current_keys_only
class PETRMultiheadAttention(MultiheadAttention):
    """mmcv ``MultiheadAttention`` registered under upstream CMT's name.

    Upstream's class is a copy of mmcv's; configs and checkpoints that name
    ``PETRMultiheadAttention`` get the same module (keys ``attn.in_proj_weight``,
    ``attn.in_proj_bias``, ``attn.out_proj.*``). mmcv's class silently ignores
    unknown keyword arguments; this one raises for them.
    """

    def __init__(self, *args, **kwargs) -> None:
        unknown = sorted(set(kwargs) - {'dropout'})
        if unknown:
            raise ValueError(f'{type(self).__name__}: unsupported argument(s) {unknown}')
        super().__init__(*args, **kwargs)


def attn_mask_to_bias(attn_mask: Optional[LayerBias], batch_size: int, num_heads: int, num_queries: int,
                      num_keys: int) -> Optional[LayerBias]:
    """Bring an ``nn.MultiheadAttention``-style mask to ``apply_attention``'s bias layout.

    Args:
        attn_mask (Tensor | AttentionBias | None): one of
            ``[Q, K]``, ``[bs * heads, Q, K]`` (torch's layout),
            ``[bs, Q, K]`` or ``[bs | 1, heads | 1, Q, K]``; bool (True =
            blocked), uint8 (non-zero = blocked) or float (added to the
            scores). A structured ``AttentionBias`` is passed through as is.
        batch_size (int): bs.
        num_heads (int): heads.
        num_queries (int): Q.
        num_keys (int): K.

    Returns:
        Tensor | AttentionBias | None: a tensor broadcastable to
        ``[bs, heads, Q, K]``, or the structured bias unchanged.
    """
    if attn_mask is None or not isinstance(attn_mask, torch.Tensor):
        return attn_mask
    if attn_mask.dtype == torch.uint8:
        attn_mask = attn_mask.bool()
    if tuple(attn_mask.shape[-2:]) != (num_queries, num_keys):
        raise ValueError(f'attn_mask of shape {tuple(attn_mask.shape)} does not match {num_queries} queries x '
                         f'{num_keys} keys')
    if attn_mask.dim() == 2:
        return attn_mask[None, None]
    if attn_mask.dim() == 3:
        if attn_mask.size(0) == batch_size * num_heads:
            return attn_mask.view(batch_size, num_heads, num_queries, num_keys)
        if attn_mask.size(0) == batch_size:
            return attn_mask[:, None]
        raise ValueError(f'a 3-dim attn_mask must have bs*heads={batch_size * num_heads} or bs={batch_size} '
                         f'rows, got {tuple(attn_mask.shape)}')
    if attn_mask.dim() == 4:
        if attn_mask.size(0) not in (1, batch_size) or attn_mask.size(1) not in (1, num_heads):
            raise ValueError(f'a 4-dim attn_mask must be [1|{batch_size}, 1|{num_heads}, Q, K], got '
                             f'{tuple(attn_mask.shape)}')
        return attn_mask
    raise ValueError(f'attn_mask must have 2, 3 or 4 dims, got {tuple(attn_mask.shape)}')


class BiasedMultiheadAttention(nn.Module):
    """Multi-head attention with ``nn.MultiheadAttention``'s parameters and a pluggable kernel.

    Args:
        embed_dim (int): E.
        num_heads (int): heads; must divide E.
        bias (bool): learn ``in_proj_bias`` and ``out_proj.bias``.
        attn_drop (float): dropout on the attention weights (training only).
        backend (str): ``apply_attention`` backend (``'auto'``, ``'math'``,
            ``'sdpa'``, ``'segment'``, ``'flashbias'``, ``'flex'``,
            ``'flash_attn'``).
        prefer (str, optional): with ``backend='auto'``, the backend to run
            whenever it applies the call exactly, otherwise what ``'auto'``
            picks (``apply_attention``'s ``prefer``, which logs the choice and
            why the preferred backend was skipped). Default: None.
        attention_dtype (str): the dtype q, k and v are cast to after the
            in-projections, the output coming back to the projections' dtype
            before ``out_proj``: ``'auto'`` (float16 on CUDA as upstream CMT,
            unchanged on the CPU), ``'float16'``, ``'bfloat16'`` or
            ``'float32'``; under ``torch.autocast`` nothing is cast (see
            :func:`~...attention.precision.attention_compute_dtype`).
            Default: ``'auto'``.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, attn_drop: float = 0.0,
                 backend: str = 'auto', prefer: Optional[str] = None, attention_dtype: str = 'auto') -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f'embed_dim {embed_dim} is not divisible by num_heads {num_heads}')
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.attn_drop = attn_drop
        if prefer is not None and backend != 'auto':
            raise ValueError(f"prefer={prefer!r} needs backend='auto', got backend={backend!r}; set one of them")
        self.backend = backend
        self.prefer = prefer
        self.attention_dtype = attention_dtype
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim)) if bias else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self._reset_parameters()

    @property
    def attention_dtype(self) -> str:
        """The precision option (``'auto'``, ``'float16'``, ``'bfloat16'``, ``'float32'``); settable."""
        return self._attention_dtype

    @attention_dtype.setter
    def attention_dtype(self, option: str) -> None:
        self._attention_dtype = check_attention_dtype(option)

    def compute_dtype(self, projected: torch.Tensor) -> torch.dtype:
        """The dtype the attention of in-projected ``projected`` (q) runs in, here and now."""
        device_type = projected.device.type
        return attention_compute_dtype(self.attention_dtype, device_type, projected.dtype,
                                       torch.is_autocast_enabled(device_type))

    def _reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        bs, length, _ = x.shape
        return x.view(bs, length, self.num_heads, self.head_dim).transpose(1, 2)

    def _project(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """``[bs, L, E]`` -> ``[bs, heads, L, head_dim]`` through the q (0), k (1) or v (2) input projection."""
        weight = self.in_proj_weight.chunk(3)[index]
        bias = self.in_proj_bias.chunk(3)[index] if self.in_proj_bias is not None else None
        return self._split_heads(F.linear(x, weight, bias))

    @staticmethod
    def _checked_padding(key_padding_mask: Optional[torch.Tensor], bs: int,
                         num_keys: int) -> Optional[torch.Tensor]:
        if key_padding_mask is None:
            return None
        if tuple(key_padding_mask.shape) != (bs, num_keys):
            raise ValueError(f'key_padding_mask must be [bs, K] = {(bs, num_keys)}, got '
                             f'{tuple(key_padding_mask.shape)}')
        return key_padding_mask.bool()

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: Optional[LayerBias] = None,
                key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Attend.

        Args:
            query (Tensor): ``[bs, Q, E]``.
            key (Tensor): ``[bs, K, E]``.
            value (Tensor): ``[bs, K, E]``.
            bias (Tensor | AttentionBias | None): see :func:`attn_mask_to_bias`.
            key_padding_mask (Tensor, optional): ``[bs, K]`` bool, True = padding.

        Returns:
            Tensor: ``[bs, Q, E]`` in the projections' dtype.
        """
        bs, num_queries, _ = query.shape
        num_keys = key.size(1)
        q, k, v = self._project(query, 0), self._project(key, 1), self._project(value, 2)
        projected, dtype = q.dtype, self.compute_dtype(q)
        if dtype != projected:
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        out = apply_attention(
            q, k, v,
            bias=attn_mask_to_bias(bias, bs, self.num_heads, num_queries, num_keys),
            key_padding_mask=self._checked_padding(key_padding_mask, bs, num_keys),
            backend=self.backend,
            dropout_p=self.attn_drop if self.training else 0.0,
            prefer=self.prefer)
        out = out.transpose(1, 2).reshape(bs, num_queries, self.embed_dim)
        return self.out_proj(out.to(projected) if dtype != projected else out)

    def attention_weights(self, query: torch.Tensor, key: torch.Tensor, bias: Optional[LayerBias] = None,
                          key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The attention probabilities :meth:`forward` applies to the same inputs (without dropout), for analysis.

        Dense: materialises ``[bs, heads, Q, K]`` in float32 (float64 for float64 inputs) whatever
        ``attention_dtype``.

        Args:
            query (Tensor): ``[bs, Q, E]``.
            key (Tensor): ``[bs, K, E]``.
            bias (Tensor | AttentionBias | None): see :func:`attn_mask_to_bias`.
            key_padding_mask (Tensor, optional): ``[bs, K]`` bool, True = padding.

        Returns:
            Tensor: ``[bs, heads, Q, K]``, each row summing to 1 (0 where every key is blocked).
        """
        bs, num_queries, _ = query.shape
        num_keys = key.size(1)
        q, k = self._project(query, 0), self._project(key, 1)
        dtype = torch.promote_types(q.dtype, torch.float32)
        dense = dense_additive_bias(attn_mask_to_bias(bias, bs, self.num_heads, num_queries, num_keys),
                                    self._checked_padding(key_padding_mask, bs, num_keys), dtype)
        return reference_probabilities(q, k, dense, self.head_dim ** -0.5)


def set_attention_dtype(model: nn.Module, option: str) -> int:
    """Set ``attention_dtype`` of every cross-attention (:class:`BiasedMultiheadAttention`) in ``model``; returns how
    many there are (``tools/benchmark_model.py``, ``tools/check_gpu.py --attention-dtype``)."""
    modules = [module for module in model.modules() if isinstance(module, BiasedMultiheadAttention)]
    for module in modules:
        module.attention_dtype = option
    return len(modules)


@ATTENTION.register_module()
@current_keys_only
class PETRMultiheadFlashAttention(BaseModule):
    """CMT's cross-attention, with the mmcv attention call signature and an honest mask.

    Args:
        embed_dims (int): E.
        num_heads (int): heads.
        attn_drop (float): dropout on the attention weights.
        proj_drop (float): dropout after the output projection.
        dropout_layer (dict): dropout on the residual branch.
        init_cfg (dict, optional): mmcv init config.
        batch_first (bool): inputs are ``[bs, L, E]`` (True) or ``[L, bs, E]``
            (False, the layout of CMT's decoder).
        backend (str): attention kernel, see :class:`BiasedMultiheadAttention`.
        bias (bool): learn the projection biases. Upstream CMT configs always
            got them (they passed the dropout rate into this argument), so
            checkpoints have ``in_proj_bias`` and ``out_proj.bias``.
        dropout (float, optional): upstream CMT's config key
            (``dropout=0.1``). It sets the *residual* dropout only
            (``dropout_layer``) and leaves ``attn_drop`` as given (default 0):
            upstream forwarded the value into its flash module's ``bias``
            argument, so the published models were trained with no dropout on
            the cross-attention probabilities and 0.1 on the residual branch.
            Keeping ``attn_drop = 0`` also lets the fast attention kernels run.
        prefer (str, optional): a backend to run where it applies the mask or
            bias exactly, otherwise what ``backend='auto'`` picks; the fallback
            is logged with its reason. ``'flashbias'`` applies no mask and
            low-rank biases such as AQR's global bias. Needs ``backend='auto'``.
            Default: None.
        attention_dtype (str): the precision of the attention between the
            float32 projections: ``'auto'`` (float16 on CUDA, as upstream
            CMT; unchanged on the CPU), ``'float16'``, ``'bfloat16'`` or
            ``'float32'``, see :class:`BiasedMultiheadAttention`. Not in the
            state dict. Default: ``'auto'``.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.,
                 dropout_layer: Optional[dict] = dict(type='Dropout', drop_prob=0.),
                 init_cfg: Optional[dict] = None,
                 batch_first: bool = False,
                 backend: str = 'auto',
                 bias: bool = True,
                 dropout: Optional[float] = None,
                 prefer: Optional[str] = None,
                 attention_dtype: str = 'auto') -> None:
        super().__init__(init_cfg)
        if dropout is not None:
            dropout_layer = dict(dropout_layer or dict(type='Dropout'), drop_prob=dropout)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.batch_first = batch_first
        self.attn = BiasedMultiheadAttention(embed_dims, num_heads, bias=bias, attn_drop=attn_drop,
                                             backend=backend, prefer=prefer, attention_dtype=attention_dtype)
        self.proj_drop = nn.Dropout(proj_drop)
        self.dropout_layer = build_dropout(dropout_layer) if dropout_layer else nn.Identity()

    @property
    def backend(self) -> str:
        """The ``apply_attention`` backend this module asks for."""
        return self.attn.backend

    @property
    def attention_dtype(self) -> str:
        """The precision option of the attention (:class:`BiasedMultiheadAttention`'s); settable."""
        return self.attn.attention_dtype

    @attention_dtype.setter
    def attention_dtype(self, option: str) -> None:
        self.attn.attention_dtype = option

    def forward(self,
                query: torch.Tensor,
                key: Optional[torch.Tensor] = None,
                value: Optional[torch.Tensor] = None,
                identity: Optional[torch.Tensor] = None,
                query_pos: Optional[torch.Tensor] = None,
                key_pos: Optional[torch.Tensor] = None,
                attn_mask: Optional[LayerBias] = None,
                key_padding_mask: Optional[torch.Tensor] = None,
                **kwargs) -> torch.Tensor:
        """Attention with identity connection, positional encodings added to query and key.

        Args:
            query (Tensor): ``[Q, bs, E]`` (``[bs, Q, E]`` if ``batch_first``).
            key (Tensor, optional): ``[K, bs, E]``; defaults to ``query``.
            value (Tensor, optional): like ``key``; defaults to ``key``.
            identity (Tensor, optional): residual input; defaults to ``query``.
            query_pos (Tensor, optional): added to ``query``.
            key_pos (Tensor, optional): added to ``key``; defaults to
                ``query_pos`` when that has the key's shape.
            attn_mask (Tensor | AttentionBias, optional): mask or additive
                bias on the ``[bs, heads, Q, K]`` scores, see
                :func:`attn_mask_to_bias`. Always applied.
            key_padding_mask (Tensor, optional): ``[bs, K]`` bool, True = padding.

        Returns:
            Tensor: same layout as ``query``.
        """
        if key is None:
            key = query
        if value is None:
            value = key
        if identity is None:
            identity = query
        if key_pos is None and query_pos is not None:
            if query_pos.shape != key.shape:
                raise ValueError(f'{type(self).__name__}: key_pos is missing and query_pos {tuple(query_pos.shape)} '
                                 f'cannot stand in for it (key is {tuple(key.shape)})')
            key_pos = query_pos
        if query_pos is not None:
            query = query + query_pos
        if key_pos is not None:
            key = key + key_pos
        if not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        out = self.attn(query, key, value, bias=attn_mask, key_padding_mask=key_padding_mask)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return identity + self.dropout_layer(self.proj_drop(out))
