"""``segment``: exact segment-constant and windowed biases on top of bias-free fused attention.

**Segment bias** (constant per query over each contiguous key segment, the AQR global bias). The bias-free
fused kernel runs once per segment ``s`` and returns ``o_s`` and ``lse_s``; with ``a_s = lse_s + b_s`` the
exact output is ``out = sum_s softmax_s(a_s) o_s`` (the split-KV combine of flash-decoding).

**Window bias** (non-zero on at most ``L`` gathered keys per query, the AQR local bias). With
``e^{x + w} = e^x + e^x (e^w - 1)`` the windowed softmax is the bias-free one plus a correction over each
query's gathered keys ``j``: ``Z = sum_s e^{a_s} + sum_j c_j``, ``out = (sum_s e^{a_s} o_s + sum_j c_j v_j) / Z``
with ``c_j = e^{x_j + g_j} (e^{w_j} - 1)``, ``x_j`` the key's score and ``g_j`` its segment bias, all shifted
by the row maximum. Where the correction removes most of the mass (``Z < tol * sum_s e^{a_s}``) the
subtraction is ill-conditioned; those rows are recomputed exactly over all keys (:mod:`.exact_rows`: every
such row on the CPU; elsewhere a budget of rows set by the shapes alone, with no host synchronisation).

**Backward** (a custom ``autograd.Function``). With ``pi_s = e^{a_s} / Z`` the probability of key ``k`` in
segment ``s`` is ``pi_s p_s(k)`` plus, for a window key, ``c_k / Z``. The fused backward of each segment,
called with ``grad_out = pi_s dO`` and the merged output (so ``D = dO . out`` is the full row term), gives that
segment's share of ``dq, dk, dv``; the window keys add ``dS_j = (c_j / Z)(dO . v_j - D)``;
``dL/db_s = pi_s (dO . o_s - D) + sum_{j in s} dS_j`` and ``dL/dw_j = P_j (dO . v_j - D)``, ``P_j`` the key's
full probability.

No tensor of size ``Q * K`` is made: the window part costs ``O(Q * L * heads * d)`` time and
``O(Q * L * heads)`` memory through the slot products of ``attention.slots``.
"""
import bisect
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ....utils.host_data import device_constant, permitted_host_sync
from ...bias import SegmentBias, WindowBias, WindowKeys
from ...bias.window import cat_slots
from ..base import AttentionBackend, AttentionCall, segment_window_reasons, sum_broadcast_heads
from .exact_rows import budget_of, recompute_rows
from .fused_lse import fused_attention_with_lse, fused_attention_with_lse_backward, fused_lse_not_supported_reasons
from ...slots import SlotPattern, default_formulation

#: rows whose corrected normaliser keeps less than this share of the mass it
#: was computed from are recomputed exactly (per input dtype)
CANCELLATION_TOLERANCE = {torch.float16: 0.25, torch.bfloat16: 0.25}
#: float32 too: the fused kernels' exponentials are a few ulp off (CPU: ~1e-6 relative), which a row keeping a
#: share r of its mass amplifies by 1 / r; below a quarter the gradients' errors grow past 1e-5
DEFAULT_CANCELLATION_TOLERANCE = 0.25


class SegmentPlan:
    """Everything about a call that the autograd function needs besides the differentiable tensors.

    Attributes:
        bounds (list[tuple[int, int]]): key range of each segment.
        key_masks (list[Tensor | None]): per segment ``[bs, 1, 1, K_s]``
            additive key padding mask in q's dtype, None where nothing is padded.
        empty (Tensor | None): ``[bs, S]`` bool, True where a segment is all padding.
        window (SlotPattern | None): the window slots (``[bs, Q, L]`` key indices).
        window_valid (Tensor | None): ``[bs, Q, L]`` bool, the slot is a real, unpadded key.
        window_segment (Tensor | None): ``[bs, Q, L]`` segment of each slot.
        scale (float): multiplier of ``q k^T``.
        tolerance (float): ill-conditioning threshold of the window correction.
    """

    def __init__(self, bounds, key_masks, empty, window, window_valid, window_segment, scale, tolerance):
        self.bounds, self.key_masks, self.empty = bounds, key_masks, empty
        self.window, self.window_valid, self.window_segment = window, window_valid, window_segment
        self.scale, self.tolerance = scale, tolerance

    @property
    def has_window(self) -> bool:
        """Whether there is a window correction."""
        return self.window is not None


def segment_layout(parts: List[SegmentBias], num_keys: int) -> Tuple[List[Tuple[int, int]], Optional[Tensor]]:
    """Common segments of several segment biases and their summed values.

    Returns:
        tuple: the key range of every segment of the common refinement, and
        the summed values ``[bs, heads | 1, Q, S]`` float32 (None without parts).
    """
    if not parts:
        return [(0, num_keys)], None
    cuts = sorted({end for part in parts for _, end in part.segment_bounds} | {0})
    bounds = list(zip(cuts[:-1], cuts[1:]))
    total = None
    for part in parts:
        starts = [start for start, _ in part.segment_bounds]
        source = [bisect.bisect_right(starts, start) - 1 for start, _ in bounds]
        values = part.values.float()
        if source != list(range(values.size(-1))):  # a list index would be copied to the device on every call
            values = values.index_select(-1, device_constant(source, values.device, torch.long))
        total = values if total is None else total + values
    return bounds, total


def _window_logits(q: Tensor, k: Tensor, segment_values: Optional[Tensor], window_weight: Tensor,
                   plan: SegmentPlan) -> Tuple[Tensor, Tensor]:
    """Bias-free and biased logits of the window slots, ``[bs, heads, Q, L]`` float32.

    Returns ``x_j + g_j`` and ``x_j + g_j + w_j`` (``x_j`` the scaled score of the
    slot's key, ``g_j`` its segment bias, ``w_j`` its window bias), both
    ``-inf`` for unused slots.
    """
    logits = plan.window.dot(q, k, plan.scale)
    if segment_values is not None:
        index = plan.window_segment[:, None].expand(-1, segment_values.size(1), -1, -1)
        logits += torch.gather(segment_values, -1, index)
    logits.masked_fill_(~plan.window_valid[:, None], float('-inf'))
    return logits, logits + window_weight


class SegmentAttentionFunction(torch.autograd.Function):
    """Segment merge + window correction; differentiable w.r.t. q, k, v, segment values and window weights."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, segment_values: Optional[Tensor],
                window_weight: Optional[Tensor], plan: SegmentPlan):
        """Args: q/k/v ``[bs, heads, L, d]``; segment_values ``[bs, heads | 1, Q, S]``;
        window_weight ``[bs, heads | 1, Q, L]``; plan. Returns the output in q's
        dtype and the ``[bs, heads, Q]`` float32 share of its mass each row keeps
        after the window correction (1 without a window; rows below
        ``plan.tolerance`` need an exact recomputation)."""
        outs, lses, states = [], [], []
        for i, ((start, end), key_mask) in enumerate(zip(plan.bounds, plan.key_masks)):
            out, lse, state = fused_attention_with_lse(q, k[:, :, start:end], v[:, :, start:end], key_mask, plan.scale)
            if plan.empty is not None:
                lse = lse.masked_fill(plan.empty[:, i, None, None], float('-inf'))
            outs.append(out)
            lses.append(lse)
            states.append(state)
        logits = torch.stack(lses, -1)
        if segment_values is not None:
            logits = logits + segment_values
        row_max = logits.amax(-1)
        if plan.has_window:
            base_mass, window_mass = _window_logits(q, k, segment_values, window_weight, plan)
            row_max = torch.maximum(row_max, window_mass.amax(-1))
        row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)[..., None]
        mass = torch.exp(logits - row_max)
        total = mass.sum(-1)
        numerator = sum(m[..., None] * o.float() for m, o in zip(mass.unbind(-1), outs))
        if plan.has_window:
            # every logit is <= row_max, so both exponentials are <= 1; the difference c_j has an absolute error
            # of eps times the row's mass, which only matters where it cancels most of it (flagged rows)
            window_mass = window_mass.sub_(row_max).exp_()
            corrections = window_mass - base_mass.sub_(row_max).exp_()
            corrected_total = total + corrections.sum(-1)
            retained = corrected_total / torch.where(total > 0, total, 1.0)
            total = corrected_total
            numerator = numerator + plan.window.weighted_sum(corrections, v)
        else:
            retained = torch.ones_like(total)
        safe_total = torch.where(total > 0, total, 1.0)[..., None]
        out = numerator / safe_total
        ctx.mark_non_differentiable(retained)
        if any(ctx.needs_input_grad):
            # the float32 output goes through save_for_backward (for float32 inputs it *is* the output): as a ctx
            # attribute it would hold its own grad_fn (output -> grad_fn -> ctx -> output), a reference cycle that
            # keeps every tensor of the call alive until Python's cycle collector runs
            ctx.save_for_backward(q, k, v, out)
            ctx.plan, ctx.outs, ctx.states = plan, outs, states
            ctx.segment_probs = mass / safe_total
            ctx.segment_heads = None if segment_values is None else segment_values.size(1)
            if plan.has_window:
                ctx.window_probs = window_mass.div_(safe_total)
                ctx.correction_probs = corrections.div_(safe_total)
                ctx.window_heads = window_weight.size(1)
        return out.to(q.dtype), retained

    @staticmethod
    def backward(ctx, grad_out: Tensor, grad_retained: Optional[Tensor]):
        q, k, v, merged = ctx.saved_tensors
        plan = ctx.plan
        grad_out = grad_out.float()
        row_term = (grad_out * merged).sum(-1)
        merged = merged.to(q.dtype)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        if len(plan.bounds) > 1:  # filled segment by segment, so one segment's gradients are alive at a time
            dk, dv = torch.empty_like(k), torch.empty_like(v)
        d_logits = []
        for i, ((start, end), key_mask) in enumerate(zip(plan.bounds, plan.key_masks)):
            prob = ctx.segment_probs[..., i, None]
            dq_s, dk_s, dv_s = fused_attention_with_lse_backward(
                (prob * grad_out).to(q.dtype), q, k[:, :, start:end], v[:, :, start:end], merged, ctx.states[i],
                key_mask, plan.scale)
            dq += dq_s
            if len(plan.bounds) > 1:
                dk[:, :, start:end] = dk_s
                dv[:, :, start:end] = dv_s
            else:
                dk, dv = dk_s, dv_s
            del dq_s, dk_s, dv_s
            d_logits.append(prob[..., 0] * ((grad_out * ctx.outs[i].float()).sum(-1) - row_term))
        d_logits = torch.stack(d_logits, -1)
        d_window = None
        if plan.has_window:
            diff = plan.window.dot(grad_out, v).sub_(row_term[..., None])
            d_scores = ctx.correction_probs * diff
            dq += plan.window.weighted_sum(d_scores, k).mul_(plan.scale)
            dk, dv = dk.float(), dv.float()
            plan.window.scatter_add_(dk, d_scores, q, alpha=plan.scale)
            plan.window.scatter_add_(dv, ctx.correction_probs, grad_out)
            if ctx.segment_heads is not None:
                d_logits = d_logits.scatter_add(-1, plan.window_segment[:, None].expand_as(d_scores), d_scores)
            d_window = sum_broadcast_heads(diff.mul_(ctx.window_probs), 1, ctx.window_heads)
        d_segment = None if ctx.segment_heads is None else sum_broadcast_heads(d_logits, 1, ctx.segment_heads)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_segment, d_window, None


class SegmentBackend(AttentionBackend):
    """Exact :class:`SegmentBias` and :class:`WindowBias` on bias-free fused kernels."""

    name = 'segment'

    def not_supported_reasons(self, call: AttentionCall) -> List[str]:
        reasons = segment_window_reasons(call, self.name)
        reasons += fused_lse_not_supported_reasons(call.device_type, call.q.dtype, call.head_dim,
                                                   call.key_padding_mask is not None)
        return reasons

    def forward(self, call: AttentionCall) -> Tensor:
        plan, segment_values, window_weight = self._plan(call)
        # q, k, v already have the dtype to run in; the function mixes them with float32 statistics itself
        with torch.autocast(call.device_type, enabled=False):
            out, retained = SegmentAttentionFunction.apply(call.q, call.k, call.v, segment_values, window_weight, plan)
        if plan.has_window:
            out = _recompute_cancelled_rows(call, out, retained.amin(1), plan.tolerance)
        return out

    @staticmethod
    def _plan(call: AttentionCall) -> Tuple[SegmentPlan, Optional[Tensor], Optional[Tensor]]:
        num_keys = call.k.size(2)
        bias = call.bias
        segments = bias.parts_of_type(SegmentBias) if bias is not None else []
        bounds, segment_values = segment_layout(segments, num_keys)
        key_masks, empty = [None] * len(bounds), None
        padding = call.key_padding_mask
        if padding is not None:
            empty = torch.stack([padding[:, start:end].all(-1) for start, end in bounds], -1)
            for i, (start, end) in enumerate(bounds):
                # masks of unpadded segments are skipped (exact either way); only the CPU gets here with padding,
                # the CUDA kernels apply none (see fused_lse_not_supported_reasons)
                if bool(padding[:, start:end].any()):
                    mask = torch.zeros(padding[:, start:end].shape, dtype=call.q.dtype, device=padding.device)
                    key_masks[i] = mask.masked_fill(padding[:, start:end], float('-inf'))[:, None, None]
        window = window_valid = window_segment = window_weight = None
        windows = [part.window_keys() for part in bias.parts_of_type(WindowBias)] if bias is not None else []
        if windows:
            heads = max(w.weight.size(1) for w in windows)
            window_weight = cat_slots([w.weight.float().expand(-1, heads, -1, -1) for w in windows])

            def layout() -> Tuple[SlotPattern, Tensor, Tensor]:
                return _window_layout(windows, bounds, padding, num_keys, call.q.size(1))

            if padding is None:  # padding changes the slots' validity: such calls make their own
                key = ('window_layout', num_keys, call.q.size(1), tuple(bounds), default_formulation(call.q.device))
                window, window_valid, window_segment = bias.derived(key, layout)
            else:
                window, window_valid, window_segment = layout()
        tolerance = CANCELLATION_TOLERANCE.get(call.q.dtype, DEFAULT_CANCELLATION_TOLERANCE)
        plan = SegmentPlan(bounds, key_masks, empty, window, window_valid, window_segment, call.scale, tolerance)
        return plan, segment_values, window_weight


def _window_layout(windows: List[WindowKeys], bounds: List[Tuple[int, int]], padding: Optional[Tensor],
                   num_keys: int, num_heads: int) -> Tuple[SlotPattern, Tensor, Tensor]:
    """The slot pattern of the windows' keys, their validity (padded keys invalid) and the segment of each slot,
    all ``[bs, Q, L]``."""
    index, valid = cat_slots([w.index for w in windows]), cat_slots([w.valid for w in windows])
    if padding is not None:
        valid = valid & ~torch.gather(padding, 1, index.view(padding.size(0), -1)).view_as(index)
    segment = torch.zeros_like(index)
    for start, _ in bounds[1:]:  # compared with host numbers: no boundary tensor to copy to the device
        segment += index >= start
    return SlotPattern(index, num_keys, num_heads, valid=valid), valid, segment


def _recompute_cancelled_rows(call: AttentionCall, out: Tensor, retained: Tensor, tolerance: float) -> Tensor:
    """Recompute the queries whose window correction kept less than ``tolerance`` of their mass.

    On the CPU exactly the flagged ones (reading their count is free there);
    elsewhere the device's :class:`~.exact_rows.ExactRowBudget` of rows per
    sample (a function of Q, heads and K only), with the overflow counted on
    the device (no synchronisation).

    Args:
        call (AttentionCall): the call.
        out (Tensor): ``[bs, heads, Q, d]`` output of the merge.
        retained (Tensor): ``[bs, Q]`` share of its mass each query keeps.
        tolerance (float): the flagging threshold.
    """
    if call.device_type == 'cpu':
        with permitted_host_sync():  # free on the CPU
            rows = int((retained < tolerance).sum(-1).max())
        return recompute_rows(call, out, retained, tolerance, rows)[0]
    budget = budget_of(out.device)
    rows = budget.budget(retained.size(-1), out.size(1), call.k.size(2))
    out, overflow = recompute_rows(call, out, retained, tolerance, rows)
    budget.record(overflow)
    return out
