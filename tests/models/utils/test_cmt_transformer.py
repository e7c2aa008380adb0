"""CmtTransformer token order, and PETR decoder layers that keep both attention masks under checkpointing."""
import torch
from mmdet.models.utils import build_transformer

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.models.utils import CmtTransformer

C, HEADS = 16, 4


def _transformer(with_cp=False, dropout=0.0):
    layer = dict(
        type='PETRTransformerDecoderLayer', with_cp=with_cp,
        attn_cfgs=[dict(type='MultiheadAttention', embed_dims=C, num_heads=HEADS, dropout=dropout),
                   dict(type='PETRMultiheadFlashAttention', embed_dims=C, num_heads=HEADS, dropout=dropout,
                        backend='math')],
        ffn_cfgs=dict(type='FFN', embed_dims=C, feedforward_channels=32, num_fcs=2, ffn_drop=0.0),
        operation_order=('self_attn', 'norm', 'cross_attn', 'norm', 'ffn', 'norm'))
    transformer = build_transformer(dict(type='CmtTransformer', decoder=dict(
        type='PETRTransformerDecoder', return_intermediate=True, num_layers=2, transformerlayers=layer)))
    transformer.init_weights()
    return transformer


def _inputs(bs=2, views=3, bev_hw=(3, 4), img_hw=(2, 5), queries=6):
    return dict(x=torch.randn(bs, C, *bev_hw), x_img=torch.randn(bs * views, C, *img_hw),
                query_embed=torch.randn(bs, queries, C), bev_pos_embed=torch.randn(bev_hw[0] * bev_hw[1], C),
                rv_pos_embed=torch.randn(bs * views, *img_hw, C))


def test_memory_token_order():
    """Key h * W + w is BEV cell (h, w); key H * W + (v * h_img + i) * w_img + j is camera cell (v, i, j)."""
    inputs = _inputs()
    out, memory = _transformer().eval()(**inputs)
    assert out.shape == (2, 2, 6, C)
    assert memory.shape == (3 * 4 + 3 * 2 * 5, 2, C)
    torch.testing.assert_close(memory[1 * 4 + 2, 1], inputs['x'][1, :, 1, 2])
    camera_key = 12 + (2 * 2 + 1) * 5 + 3
    torch.testing.assert_close(memory[camera_key, 1], inputs['x_img'][1 * 3 + 2, :, 1, 3])


def test_checkpointing_keeps_the_masks_and_the_gradients():
    torch.manual_seed(0)
    plain = _transformer(with_cp=False).train()
    checkpointed = _transformer(with_cp=True).train()
    checkpointed.load_state_dict(plain.state_dict())
    inputs = _inputs()
    self_mask = torch.zeros(6, 6, dtype=torch.bool)
    self_mask[:3, 3:] = True
    cross_mask = torch.zeros(6, 12 + 30, dtype=torch.bool)
    cross_mask[:, 12:] = True  # no query may see a camera token

    results = []
    for model in (plain, checkpointed):
        model.zero_grad()
        query_embed = inputs['query_embed'].clone().requires_grad_()
        out, _ = model(**dict(inputs, query_embed=query_embed), self_attn_mask=self_mask, cross_attn_bias=cross_mask)
        out.square().sum().backward()
        results.append((out, query_embed.grad, [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
    for grad_plain, grad_cp in zip(results[0][2], results[1][2]):
        torch.testing.assert_close(grad_plain, grad_cp)

    # the cross mask really was applied in the checkpointed run: camera features do not matter
    other, _ = checkpointed(**dict(inputs, x_img=torch.randn_like(inputs['x_img'])), self_attn_mask=self_mask,
                            cross_attn_bias=cross_mask)
    torch.testing.assert_close(other, results[1][0])


def test_the_transformer_decodes_the_tokens_given():
    inputs = _inputs()
    transformer = _transformer().eval()
    assert type(transformer) is CmtTransformer
    out, memory = transformer(**dict(inputs, x_img=None, rv_pos_embed=None))
    assert out.shape == (2, 2, 6, C) and memory.shape == (12, 2, C)
    torch.testing.assert_close(memory, inputs['x'].flatten(2).permute(2, 0, 1))
    out, memory = transformer(**dict(inputs, x=None, bev_pos_embed=None))
    assert out.shape == (2, 2, 6, C) and memory.shape == (30, 2, C)
