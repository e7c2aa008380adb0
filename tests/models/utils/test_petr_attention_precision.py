"""PETRMultiheadFlashAttention's ``attention_dtype``: half precision between float32 projections on CUDA (traced
on fake CUDA), the CPU's bits unchanged, autocast left to decide, the state dict unchanged."""
import pytest
import torch
import torch.nn.functional as F
from mmcv.cnn.bricks.transformer import build_attention
from torch._subclasses.fake_tensor import FakeTensorMode

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.attention import AttentionBias, KeyGrid, SegmentBias, WindowBias
from projects.mmdet3d_plugin.attention.dispatch import apply_attention
from projects.mmdet3d_plugin.models.utils import petr_attention

E, HEADS, Q, BS = 32, 4, 6, 2
BEV, CAMERA = KeyGrid(0, 1, 4, 4), KeyGrid(16, 2, 3, 4)
K = BEV.end + CAMERA.num_cells
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def _cross_attention(**kwargs):
    return build_attention(dict(type='PETRMultiheadFlashAttention', embed_dims=E, num_heads=HEADS,
                                **kwargs)).eval()


def _inputs(device='cpu'):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(n, BS, E, generator=generator).to(device) for n in (Q, K, K)]


def _aqr_bias(kind, device):
    """A float32 AQR bias as the float32 head gives it: global (two segments) or local (BEV and camera windows)."""
    if kind == 'none':
        return None
    if kind == 'global':
        return AttentionBias(SegmentBias(torch.randn(BS, 1, Q, 2, device=device), [BEV.end, CAMERA.num_cells]), K)
    centres = [torch.zeros(BS, Q, 3, dtype=torch.long, device=device) for _ in range(2)]
    valid = [torch.ones(BS, Q, dtype=torch.bool, device=device) for _ in range(2)]
    amplitudes = [torch.randn(BS, 1, Q, device=device) for _ in range(2)]
    return AttentionBias(WindowBias([BEV, CAMERA], centres, valid, amplitudes, [3, 3]), K)


@pytest.fixture
def seen(monkeypatch):
    """The dtypes of q, k, v and of the bias parts every apply_attention call of the module gets."""
    calls = []

    def recording(q, k, v, bias=None, **kwargs):
        parts = [] if bias is None else [t.dtype for p in bias.parts for t in p.tensors() if t.is_floating_point()]
        calls.append(dict(qkv=(q.dtype, k.dtype, v.dtype), bias=parts))
        return apply_attention(q, k, v, bias, **kwargs)

    monkeypatch.setattr(petr_attention, 'apply_attention', recording)
    return calls


@pytest.mark.parametrize('kind', ['none', 'global', 'local'])
@pytest.mark.parametrize('option, expected', [(None, F16), ('auto', F16), ('float16', F16), ('bfloat16', BF16),
                                              ('float32', F32)])
def test_on_cuda_the_attention_runs_in_the_chosen_dtype_between_float32_projections(seen, kind, option, expected):
    """Default (upstream CMT): float16 q, k, v after the float32 in-projections; the bias stays float32 (each
    backend reads it in the precision its kernel needs); the module's output is float32."""
    module = _cross_attention(**({} if option is None else dict(attention_dtype=option)))
    out_proj_inputs = []
    module.attn.out_proj.register_forward_pre_hook(lambda _, args: out_proj_inputs.append(args[0].dtype))
    with FakeTensorMode(allow_non_fake_inputs=True):
        module = module.to('cuda')
        query, key, value = _inputs('cuda')
        out = module(query, key, value, attn_mask=_aqr_bias(kind, 'cuda'))
        assert (out.device.type, out.dtype, tuple(out.shape)) == ('cuda', F32, (Q, BS, E))
    assert seen == [dict(qkv=(expected, ) * 3, bias=[F32] * {'none': 0, 'global': 1, 'local': 2}[kind])]
    assert out_proj_inputs == [F32]  # back in the projections' dtype before out_proj


@pytest.mark.parametrize('kind', ['none', 'global', 'local'])
def test_on_the_cpu_nothing_changes(kind):
    """The default computes the CPU's float32 path bit for bit: the old forward (projections, attention, output
    projection, no cast) on the same weights, and ``attention_dtype='float32'``."""
    module = _cross_attention()
    query, key, value = _inputs()
    bias = _aqr_bias(kind, 'cpu')
    out = module(query, key, value, attn_mask=bias)
    attn = module.attn
    q, k, v = (attn._project(x.transpose(0, 1), i) for i, x in enumerate((query, key, value)))
    assert q.dtype == F32
    old = apply_attention(q, k, v, bias).transpose(1, 2).reshape(BS, Q, E)
    assert torch.equal(out, query + F.linear(old, attn.out_proj.weight, attn.out_proj.bias).transpose(0, 1))
    twin = _cross_attention(attention_dtype='float32')
    twin.load_state_dict(module.state_dict())
    assert torch.equal(out, twin(query, key, value, attn_mask=bias))


def test_a_named_half_dtype_runs_on_the_cpu_too(seen):
    """Asked for explicitly, the CPU computes in it too; the output comes back in float32."""
    module = _cross_attention(attention_dtype='bfloat16')
    out = module(*_inputs())
    assert out.dtype == F32 and seen == [dict(qkv=(BF16, ) * 3, bias=[])]


def test_under_autocast_nothing_is_cast(seen):
    """Autocast runs the in-projections in its own dtype and decides: the option does not fight it."""
    module = _cross_attention(attention_dtype='float16')
    with torch.autocast('cpu', dtype=BF16):
        module(*_inputs())
    assert seen == [dict(qkv=(BF16, ) * 3, bias=[])]


def test_the_option_is_validated_settable_and_not_in_the_state_dict():
    with pytest.raises(ValueError, match=r"attention_dtype must be one of \['auto', 'float16', 'bfloat16'"):
        _cross_attention(attention_dtype='fp16')
    default, named = _cross_attention(), _cross_attention(attention_dtype='bfloat16')
    assert default.attention_dtype == 'auto' and named.attention_dtype == 'bfloat16'
    assert list(default.state_dict()) == list(named.state_dict())
    default.attention_dtype = 'float32'
    assert default.attn.attention_dtype == 'float32'
    with pytest.raises(ValueError, match='attention_dtype must be one of'):
        default.attention_dtype = 'half'
