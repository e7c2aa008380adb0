"""Layers that share a bias share what the backends derive from it, and stay exact.

The decoder's cross-attention layers share one ``AttentionBias``. The
``segment`` backend makes its window layout (the ``SlotPattern`` over the
window slots, their validity and segments, all functions of the centres) on
the first call and reuses it; the window weights, which carry the
amplitudes' gradients, are made on every call. Dense backends reuse the
dense form of a bias no gradient flows to (inference) and make a
differentiable one on every call, which gradient checkpointing needs.
"""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from projects.mmdet3d_plugin.attention import AttentionBias, apply_attention
from projects.mmdet3d_plugin.attention.backends.segment import backend as segment_module
from projects.mmdet3d_plugin.attention.slots.window_slots import SlotPattern
from test_backends import FP32_TOLERANCE, _outputs_and_grads


@pytest.fixture
def patterns_made(monkeypatch):
    """How many ``SlotPattern`` s the segment backend builds."""
    made = []

    class CountingPattern(SlotPattern):

        def __init__(self, *args, **kwargs):
            made.append(args[0].shape)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(segment_module, 'SlotPattern', CountingPattern)
    return made


@pytest.mark.parametrize('kind', ['window', 'segment+window'])
def test_layers_sharing_a_bias_build_its_window_layout_once_and_stay_exact(cases, patterns_made, kind):
    """Three layers (different q, k, v) on one bias: one pattern; every layer's outputs and gradients (q, k, v and
    the amplitudes) equal math's."""
    bias, leaves = cases.make_bias(kind)
    for layer in range(3):
        q, k, v = cases.make_qkv()  # each layer its own
        out, grads = _outputs_and_grads(q, k, v, bias, leaves, 'segment')
        ref, ref_grads = _outputs_and_grads(q, k, v, bias, leaves, 'math')
        assert cases.relative_error(out, ref) <= FP32_TOLERANCE, layer
        for grad, ref_grad in zip(grads, ref_grads):
            assert cases.relative_error(grad, ref_grad) <= FP32_TOLERANCE, layer
    assert len(patterns_made) == 1


def test_a_new_bias_other_heads_or_key_padding_get_their_own_layout(cases, patterns_made):
    bias, _ = cases.make_bias('window', requires_grad=False)
    q, k, v = cases.make_qkv()
    with torch.no_grad():
        apply_attention(q, k, v, bias, backend='segment')
        apply_attention(q, k, v, bias, backend='segment')
        assert len(patterns_made) == 1
        apply_attention(q[:, :2], k[:, :2], v[:, :2], bias, backend='segment')  # fewer heads
        assert len(patterns_made) == 2
        other, _ = cases.make_bias('window', requires_grad=False)
        apply_attention(q, k, v, other, backend='segment')
        assert len(patterns_made) == 3
        padding = torch.zeros(q.size(0), k.size(2), dtype=torch.bool)
        padding[0, :5] = True
        for _ in range(2):  # padding changes the slots' validity: never cached
            apply_attention(q, k, v, bias, key_padding_mask=padding, backend='segment')
        assert len(patterns_made) == 5




@pytest.fixture
def dense_forms_made(monkeypatch):
    """How many times a bias is densified."""
    made = []
    original = AttentionBias.to_dense

    def counting(self, *args, **kwargs):
        made.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(AttentionBias, 'to_dense', counting)
    return made


def test_layers_sharing_a_bias_without_gradients_densify_it_once(cases, dense_forms_made):
    bias, _ = cases.make_bias('segment+window')
    q, k, v = cases.make_qkv(requires_grad=False)
    with torch.no_grad():
        outs = [apply_attention(q, k, v, bias, backend='sdpa') for _ in range(3)]
        assert len(dense_forms_made) == 1
        apply_attention(q.double(), k.double(), v.double(), bias, backend='sdpa')  # another dtype
        assert len(dense_forms_made) == 2
        ref = apply_attention(q, k, v, bias, backend='math')
    for out in outs:
        assert cases.relative_error(out, ref) <= FP32_TOLERANCE


def test_a_bias_gradients_flow_to_is_densified_on_every_call(cases, dense_forms_made):
    bias, leaves = cases.make_bias('window')
    for layer in range(2):
        q, k, v = cases.make_qkv()
        out, grads = _outputs_and_grads(q, k, v, bias, leaves, 'sdpa')
        ref, ref_grads = _outputs_and_grads(q, k, v, bias, leaves, 'math')
        assert cases.relative_error(out, ref) <= FP32_TOLERANCE
        for grad, ref_grad in zip(grads, ref_grads):
            assert cases.relative_error(grad, ref_grad) <= FP32_TOLERANCE, layer
    assert len([made for made in dense_forms_made if made is bias]) == 4  # each layer, sdpa and math


@pytest.mark.parametrize('backend', ['segment', 'sdpa'])
def test_checkpointed_layers_sharing_a_bias_train_as_without_checkpointing(cases, backend):
    """Two layers recomputed in the backward pass (``with_cp``, non-reentrant) on one bias: the same gradients of
    q, k, v and the amplitudes as without checkpointing (a reused differentiable tensor would break the
    recomputation)."""
    bias, leaves = cases.make_bias('segment+window')
    q, k, v = cases.make_qkv()

    def layers(query):
        for _ in range(2):
            query = query + apply_attention(query, k, v, bias, backend=backend)
        return query

    grads = []
    for checkpointed in (False, True):
        out = checkpoint(layers, q, use_reentrant=False) if checkpointed else layers(q)
        grads.append(torch.autograd.grad(out.pow(2).sum(), [q, k, v] + leaves))
    for plain, recomputed in zip(*grads):
        assert cases.relative_error(recomputed, plain) <= FP32_TOLERANCE
