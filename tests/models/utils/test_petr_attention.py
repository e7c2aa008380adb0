"""PETRMultiheadFlashAttention: upstream parameter names, nn.MultiheadAttention numerics, masks always applied."""
import pytest
import torch
from mmcv.cnn.bricks.transformer import build_attention
from torch import nn

import projects.mmdet3d_plugin  # noqa: F401

E, HEADS, Q, K, BS = 16, 4, 5, 7, 2


def _cross_attention(**kwargs):
    cfg = dict(type='PETRMultiheadFlashAttention', embed_dims=E, num_heads=HEADS, backend='math')
    cfg.update(kwargs)
    return build_attention(cfg).eval()


def _torch_twin(module):
    """nn.MultiheadAttention loaded with the module's weights (same key names)."""
    twin = nn.MultiheadAttention(E, HEADS).eval()
    twin.load_state_dict(module.attn.state_dict())
    return twin


def _inputs():
    query, query_pos = torch.randn(Q, BS, E), torch.randn(Q, BS, E)
    key, key_pos, value = torch.randn(K, BS, E), torch.randn(K, BS, E), torch.randn(K, BS, E)
    return query, key, value, query_pos, key_pos


def test_parameter_names_equal_nn_multihead_attention():
    module = _cross_attention(dropout=0.1)
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    assert shapes == {'attn.in_proj_weight': (3 * E, E), 'attn.in_proj_bias': (3 * E, ),
                      'attn.out_proj.weight': (E, E), 'attn.out_proj.bias': (E, )}


def test_upstream_dropout_key_is_residual_dropout_only():
    """Published CMT: dropout=0.1 -> no dropout on the attention probabilities, 0.1 on the residual branch."""
    module = _cross_attention(dropout=0.1)
    assert module.attn.attn_drop == 0.0
    assert module.dropout_layer.p == pytest.approx(0.1)
    module.train()
    query, key, value, query_pos, key_pos = _inputs()
    out = module(query, key, value, query_pos=query_pos, key_pos=key_pos)
    identity_part = out - query
    dropped = (identity_part == 0).float().mean().item()
    assert 0.02 < dropped < 0.3  # the residual branch is dropped elementwise at p = 0.1


@pytest.mark.parametrize('mask_kind', ['none', 'bool', 'float', 'padding'])
def test_matches_nn_multihead_attention(mask_kind):
    module = _cross_attention()
    twin = _torch_twin(module)
    query, key, value, query_pos, key_pos = _inputs()
    attn_mask = key_padding_mask = None
    if mask_kind == 'bool':
        attn_mask = torch.rand(Q, K) < 0.4
        attn_mask[:, 0] = False  # every query keeps a key
    elif mask_kind == 'float':
        attn_mask = torch.randn(Q, K)
    elif mask_kind == 'padding':
        key_padding_mask = torch.zeros(BS, K, dtype=torch.bool)
        key_padding_mask[1, 3:] = True
    out = module(query, key, value, query_pos=query_pos, key_pos=key_pos, attn_mask=attn_mask,
                 key_padding_mask=key_padding_mask)
    expected = query + twin(query + query_pos, key + key_pos, value, attn_mask=attn_mask,
                            key_padding_mask=key_padding_mask)[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('backend', ['math', 'auto'])
def test_attn_mask_gives_masked_keys_zero_weight(backend):
    """Changing a blocked key/value changes nothing for the queries that block it, and changes the others."""
    module = _cross_attention(backend=backend)
    query, key, value, query_pos, key_pos = _inputs()
    attn_mask = torch.zeros(Q, K, dtype=torch.bool)
    attn_mask[:2, 4:] = True  # queries 0, 1 must not see keys 4..6
    out = module(query, key, value, query_pos=query_pos, key_pos=key_pos, attn_mask=attn_mask)
    value2, key2 = value.clone(), key.clone()
    value2[4:] += 100.0
    key2[4:] -= 50.0
    out2 = module(query, key2, value2, query_pos=query_pos, key_pos=key_pos, attn_mask=attn_mask)
    torch.testing.assert_close(out2[:2], out[:2])
    assert (out2[2:] - out[2:]).abs().max() > 1.0


@pytest.mark.parametrize('backend', ['math', 'auto'])
def test_key_padding_mask_gives_padded_keys_zero_weight(backend):
    module = _cross_attention(backend=backend)
    query, key, value, query_pos, key_pos = _inputs()
    padding = torch.zeros(BS, K, dtype=torch.bool)
    padding[0, 5:] = True  # sample 0: keys 5, 6 are padding
    out = module(query, key, value, query_pos=query_pos, key_pos=key_pos, key_padding_mask=padding)
    value2 = value.clone()
    value2[5:] += 100.0
    out2 = module(query, key, value2, query_pos=query_pos, key_pos=key_pos, key_padding_mask=padding)
    torch.testing.assert_close(out2[:, 0], out[:, 0])
    assert (out2[:, 1] - out[:, 1]).abs().max() > 1.0


def test_per_sample_and_per_head_masks():
    """[bs, Q, K] and [bs * heads, Q, K] masks are applied per sample (and head)."""
    module = _cross_attention()
    twin = _torch_twin(module)
    query, key, value, query_pos, key_pos = _inputs()
    per_head = torch.rand(BS * HEADS, Q, K) < 0.3
    per_head[..., 0] = False
    out = module(query, key, value, query_pos=query_pos, key_pos=key_pos, attn_mask=per_head)
    expected = query + twin(query + query_pos, key + key_pos, value, attn_mask=per_head)[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    per_sample = per_head.view(BS, HEADS, Q, K)[:, 0]
    out = module(query, key, value, query_pos=query_pos, key_pos=key_pos, attn_mask=per_sample)
    expected = query + twin(query + query_pos, key + key_pos, value,
                            attn_mask=per_sample.repeat_interleave(HEADS, dim=0))[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_bad_masks_raise():
    module = _cross_attention()
    query, key, value, query_pos, key_pos = _inputs()
    with pytest.raises(ValueError, match='does not match'):
        module(query, key, value, query_pos=query_pos, key_pos=key_pos, attn_mask=torch.zeros(Q, K + 1))
    with pytest.raises(ValueError, match='key_padding_mask'):
        module(query, key, value, query_pos=query_pos, key_pos=key_pos,
               key_padding_mask=torch.zeros(BS, K + 1, dtype=torch.bool))
    with pytest.raises(TypeError):
        _cross_attention(unknown_option=1)


@pytest.mark.parametrize('mask_kind', ['none', 'float', 'padding'])
def test_attention_weights_are_nn_multihead_attentions_weights(mask_kind):
    """attention_weights (for analysis) gives the probabilities forward applies: nn.MultiheadAttention's per head."""
    module = _cross_attention()
    twin = _torch_twin(module)
    query, key, value, query_pos, key_pos = _inputs()
    attn_mask = torch.randn(Q, K) if mask_kind == 'float' else None
    key_padding_mask = None
    if mask_kind == 'padding':
        key_padding_mask = torch.zeros(BS, K, dtype=torch.bool)
        key_padding_mask[1, 3:] = True
    weights = module.attn.attention_weights((query + query_pos).transpose(0, 1), (key + key_pos).transpose(0, 1),
                                            bias=attn_mask, key_padding_mask=key_padding_mask)
    expected = twin(query + query_pos, key + key_pos, value, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                    average_attn_weights=False)[1]
    assert weights.shape == (BS, HEADS, Q, K)
    torch.testing.assert_close(weights, expected, rtol=1e-5, atol=1e-6)
