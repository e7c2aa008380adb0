"""The local-window attention (LAM) equals attention with a dense window mask and the gathered formulation."""
import pytest
import torch

from projects.mmdet3d_plugin.attention.bias.window_cells import window_offsets, window_token_index
from projects.mmdet3d_plugin.models.aqr.local_window import LocalWindowAttention

BEV_HW, CAM = (6, 7), (2, 4, 5)  # BEV rows x cols; camera views x rows x cols


def _dense_window_mask(pts_bev, pers, visible, lidar_window, camera_window):
    """[bs, Q, K] True where key k lies in the query's LiDAR or camera window (reference)."""
    (bev_h, bev_w), (views, cam_h, cam_w) = BEV_HW, CAM
    k_bev = torch.arange(bev_h * bev_w)
    bev_y, bev_x = k_bev // bev_w, k_bev % bev_w
    in_bev = ((bev_y - pts_bev[..., 0:1]).abs() <= lidar_window // 2) & \
             ((bev_x - pts_bev[..., 1:2]).abs() <= lidar_window // 2)
    k_cam = torch.arange(views * cam_h * cam_w)
    cam_v, cam_y, cam_x = k_cam // (cam_h * cam_w), (k_cam % (cam_h * cam_w)) // cam_w, k_cam % cam_w
    in_cam = (cam_v == pers[..., 0:1]) & ((cam_y - pers[..., 1:2]).abs() <= camera_window // 2) & \
             ((cam_x - pers[..., 2:3]).abs() <= camera_window // 2) & visible[..., None]
    return torch.cat([in_bev, in_cam], dim=-1)


def _dense_attention(module, query, key, value, mask):
    """Plain multi-head attention over all keys with a boolean mask (True = attend)."""
    bs, num_query, dims = query.shape
    heads = module.num_heads
    q = module.q_proj(query).reshape(bs, num_query, heads, -1).transpose(1, 2)
    k = module.k_proj(key).reshape(bs, key.shape[1], heads, -1).transpose(1, 2)
    v = module.v_proj(value).reshape(bs, key.shape[1], heads, -1).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1]**0.5
    scores = scores.masked_fill(~mask[:, None], float('-inf'))
    probs = torch.nan_to_num(scores.softmax(-1), nan=0.0)
    out = (probs @ v).transpose(1, 2).reshape(bs, num_query, dims)
    return module.out_proj(out)


def _random_queries(bs, num_query):
    (bev_h, bev_w), (views, cam_h, cam_w) = BEV_HW, CAM
    pts_bev = torch.stack([torch.randint(0, bev_h, (bs, num_query)), torch.randint(0, bev_w, (bs, num_query))], -1)
    pers = torch.stack([torch.randint(0, views, (bs, num_query)), torch.randint(0, cam_h, (bs, num_query)),
                        torch.randint(0, cam_w, (bs, num_query))], -1)
    visible = torch.rand(bs, num_query) > 0.3
    visible[0, 0] = False
    pers = torch.where(visible[..., None], pers, torch.full_like(pers, -1))
    return pts_bev, pers, visible


def _window_index(pts_bev, pers, visible, lidar_window, camera_window):
    bev_index, bev_valid = window_token_index(pts_bev, BEV_HW, window_offsets(lidar_window))
    cam_index, cam_valid = window_token_index(pers[..., 1:], CAM[1:], window_offsets(camera_window),
                                              center_valid=visible, plane=pers[..., 0].clamp(min=0))
    num_bev = BEV_HW[0] * BEV_HW[1]
    return torch.cat([bev_index, cam_index + num_bev], -1), torch.cat([bev_valid, cam_valid], -1)


@pytest.mark.parametrize('lidar_window,camera_window', [(3, 3), (5, 3), (1, 5)])
def test_gathered_window_attention_equals_dense_mask_reference(lidar_window, camera_window):
    bs, num_query, dims = 2, 12, 16
    pts_bev, pers, visible = _random_queries(bs, num_query)
    num_keys = BEV_HW[0] * BEV_HW[1] + CAM[0] * CAM[1] * CAM[2]
    module = LocalWindowAttention(dims, num_heads=4).eval()
    query = torch.randn(bs, num_query, dims, requires_grad=True)
    key, value = torch.randn(bs, num_keys, dims), torch.randn(bs, num_keys, dims)
    index, valid = _window_index(pts_bev, pers, visible, lidar_window, camera_window)

    key.requires_grad_(True)
    value.requires_grad_(True)
    out = module(query, key, value, index, valid)
    ref = _dense_attention(module, query, key, value,
                           _dense_window_mask(pts_bev, pers, visible, lidar_window, camera_window))
    assert torch.allclose(out, ref, atol=1e-5)
    inputs = [query, key, value] + list(module.parameters())
    grads = torch.autograd.grad(out.square().sum(), inputs)
    grads_ref = torch.autograd.grad(ref.square().sum(), inputs)
    for grad, grad_ref in zip(grads, grads_ref):
        assert torch.allclose(grad, grad_ref, atol=1e-5)
    # the gathered windows hold exactly the keys of the dense mask
    assert valid.sum().item() == _dense_window_mask(pts_bev, pers, visible, lidar_window, camera_window).sum().item()


def test_query_without_valid_token_is_finite():
    module = LocalWindowAttention(8, num_heads=2).eval()
    query, memory = torch.randn(1, 3, 8), torch.randn(1, 5, 8)
    index = torch.zeros(1, 3, 4, dtype=torch.long)
    valid = torch.zeros(1, 3, 4, dtype=torch.bool)
    valid[0, 1, :2] = True
    out = module(query, memory, memory, index, valid)
    assert torch.isfinite(out).all()
    assert torch.allclose(out[0, 0], module.out_proj.bias) and torch.allclose(out[0, 2], module.out_proj.bias)
    assert not torch.allclose(out[0, 1], module.out_proj.bias)


def _gathered_attention(module, query, key, value, index, valid):
    """The window attention through gathered ``[bs, Q, L, C]`` copies of the window tokens, with the module's
    attention dropout drawn on ``[bs, Q, heads, L]`` probabilities (the formulation before issue 24)."""
    bs, num_query, dims = query.shape
    heads = module.num_heads

    def gathered(tokens):
        flat = index.reshape(bs, -1, 1).expand(-1, -1, dims)
        return tokens.gather(1, flat).reshape(bs, num_query, -1, heads, dims // heads)

    q = module.q_proj(query).reshape(bs, num_query, heads, -1)
    scores = torch.einsum('bqhd,bqlhd->bqhl', q, gathered(module.k_proj(key))) * (dims // heads)**-0.5
    scores = scores.masked_fill(~valid[:, :, None], float('-inf')).masked_fill(~valid.any(-1)[..., None, None], 0.0)
    probs = module.attn_drop(scores.softmax(-1) * valid[:, :, None])
    out = torch.einsum('bqhl,bqlhd->bqhd', probs, gathered(module.v_proj(value)))
    return module.out_proj(out.reshape(bs, num_query, dims))


def test_dropout_in_training_equals_the_gathered_formulation_with_the_same_random_numbers():
    """Training mode with attention dropout: same outputs and gradients (q, k, v, weights) as gathering the
    window tokens and dropping out their probabilities, from the same random state."""
    bs, num_query, dims = 2, 10, 16
    pts_bev, pers, visible = _random_queries(bs, num_query)
    num_keys = BEV_HW[0] * BEV_HW[1] + CAM[0] * CAM[1] * CAM[2]
    module = LocalWindowAttention(dims, num_heads=4, attn_drop=0.3).train()
    query = torch.randn(bs, num_query, dims, requires_grad=True)
    key, value = (torch.randn(bs, num_keys, dims, requires_grad=True) for _ in range(2))
    index, valid = _window_index(pts_bev, pers, visible, 5, 3)
    inputs = [query, key, value] + list(module.parameters())
    torch.manual_seed(7)
    out = module(query, key, value, index, valid)
    grads = torch.autograd.grad(out.square().sum(), inputs)
    torch.manual_seed(7)
    ref = _gathered_attention(module, query, key, value, index, valid)
    grads_ref = torch.autograd.grad(ref.square().sum(), inputs)
    assert torch.allclose(out, ref, atol=1e-6)
    for grad, grad_ref in zip(grads, grads_ref):
        assert torch.allclose(grad, grad_ref, atol=1e-5)
    torch.manual_seed(8)
    assert not torch.allclose(module(query, key, value, index, valid), out), 'dropout did not act'


def test_heads_must_divide_the_channels():
    with pytest.raises(ValueError, match='divisible'):
        LocalWindowAttention(10, num_heads=3)
