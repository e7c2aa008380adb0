"""Synthetic attention calls at CMT-AQR's real shapes: the cases ``tools/benchmark_attention.py`` times and
``tools/check_gpu.py`` checks.

A case is a JSON-friendly dict: ``layout`` (a key of :data:`KEY_LAYOUTS`),
``queries``, ``batch``, ``heads``, ``head_dim``, ``bias`` (``global``: a
:class:`SegmentBias` over the BEV and camera keys; ``local``: a
:class:`WindowBias` on the BEV and camera grids), ``window_size``, ``seed``,
``device``, ``dtype`` (a key of :data:`DTYPES`), ``backend`` (an
``apply_attention`` backend, :data:`BASELINE` or
:data:`SEGMENT_WITH_RECOMPUTE`) and ``pass`` (``fwd`` or ``fwdbwd``)::

    case = dict(layout='quick', queries=12, batch=2, heads=2, head_dim=8, bias='local', window_size=5, seed=0,
                device='cpu', dtype='float32', backend='segment', **{'pass': 'fwdbwd'})
    inputs = build_inputs(case)
    run_case(case, inputs)
"""
import gc
from typing import Optional

import torch
import torch.nn.functional as F

from ..attention import AttentionBias, KeyGrid, SegmentBias, WindowBias, apply_attention, dispatch
from ..attention.backends.segment.exact_rows import ExactRowBudget, recompute_rows
from .process_memory import peak_rss_mib

#: (BEV rows, BEV cols), (camera views, rows, cols) of each key layout
KEY_LAYOUTS = {
    'r50': ((128, 128), (6, 20, 50)),  # voxel 0.1, 800x320 images: K = 22 384
    'vov': ((180, 180), (6, 40, 100)),  # voxel 0.075, 1600x640 images: K = 56 400
    'demo': ((32, 32), (6, 6, 12)),  # configs/demo: pillars 0.4 m / 4, 192x96 images / 16: K = 1 456
    'quick': ((12, 16), (2, 6, 10)),  # tools/check_gpu.py --device cpu: K = 312
}
#: the reference every backend's time is divided by: ``F.scaled_dot_product_attention`` without a mask
BASELINE = 'bias-free SDPA'
#: ``segment`` plus the work of its accelerator branch's exact recomputation at the default budget
#: (``ExactRowBudget().budget(Q, heads, K)`` queries per sample, every one replaced): what a GPU pays per call,
#: timed and measured here on any device
SEGMENT_WITH_RECOMPUTE = 'segment+recompute'
DTYPES = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}


def num_keys(layout: str) -> int:
    """Keys K of a layout: its BEV cells and camera cells."""
    (bev_h, bev_w), (views, cam_h, cam_w) = KEY_LAYOUTS[layout]
    return bev_h * bev_w + views * cam_h * cam_w


def build_bias_factors(case: dict, generator: torch.Generator) -> dict:
    """Random AQR-like bias factors: weights in [0, 1] mapped to ``(w - 0.5) * 2``, projections, visibility.

    Returns:
        dict: ``lidar_bias``, ``camera_bias`` ``[bs, Q]``; ``bev_centres``
        ``[bs, Q, 3]`` (0, y, x); ``camera_centres`` ``[bs, Q, 3]`` (view, y,
        x); ``visible`` ``[bs, Q]`` (90 % True).
    """
    (bev_h, bev_w), (views, cam_h, cam_w) = KEY_LAYOUTS[case['layout']]
    bs, num_queries = case['batch'], case['queries']
    lidar_bias, camera_bias = ((torch.rand(2, bs, num_queries, generator=generator) - 0.5) * 2).unbind(0)

    def cells(*sizes):
        return torch.stack([torch.randint(0, s, (bs, num_queries), generator=generator) for s in sizes], -1)

    return dict(
        lidar_bias=lidar_bias, camera_bias=camera_bias,
        bev_centres=torch.cat([torch.zeros(bs, num_queries, 1, dtype=torch.long), cells(bev_h, bev_w)], -1),
        camera_centres=cells(views, cam_h, cam_w),
        visible=torch.rand(bs, num_queries, generator=generator) > 0.1)


def make_bias(case: dict, factors: dict, device, requires_grad: bool) -> AttentionBias:
    """The structured global or local AQR bias of a case (factors from :func:`build_bias_factors`)."""
    (bev_h, bev_w), (views, cam_h, cam_w) = KEY_LAYOUTS[case['layout']]
    num_bev = bev_h * bev_w
    if case['bias'] == 'global':
        values = torch.stack([factors['lidar_bias'], factors['camera_bias']], -1)[:, None].to(device)
        return AttentionBias(SegmentBias(values.requires_grad_(requires_grad), (num_bev, views * cam_h * cam_w)),
                             num_keys(case['layout']))
    bs, num_queries = factors['visible'].shape
    grids = [KeyGrid(0, 1, bev_h, bev_w), KeyGrid(num_bev, views, cam_h, cam_w)]
    amplitudes = [factors[name][:, None].to(device).requires_grad_(requires_grad)
                  for name in ('lidar_bias', 'camera_bias')]
    valid = [torch.ones(bs, num_queries, dtype=torch.bool, device=device), factors['visible'].to(device)]
    return AttentionBias(WindowBias(grids, [factors['bev_centres'].to(device), factors['camera_centres'].to(device)],
                                    valid, amplitudes, case['window_size']), num_keys(case['layout']))


def build_inputs(case: dict) -> dict:
    """q, k, v ``[bs, heads, Q or K, head_dim]``, the bias, the tensors gradients are taken for (``leaves``:
    q, k, v and, but for :data:`BASELINE`, the bias's) and ``grad_out`` ``[bs, heads, Q, head_dim]``.

    q, k and v are laid out as the attention modules pass them: split-head views of ``[bs, L, heads, head_dim]``
    tensors (``PETRMultiheadFlashAttention`` projects ``[bs, L, C]`` and splits the heads with a transpose).
    """
    generator = torch.Generator().manual_seed(case['seed'])
    device, dtype = torch.device(case['device']), DTYPES[case['dtype']]
    needs_grad = case['pass'] == 'fwdbwd'
    bs, heads, dim = case['batch'], case['heads'], case['head_dim']
    keys = num_keys(case['layout'])
    q, k, v = (torch.randn(bs, n, heads, dim, generator=generator).to(device, dtype).transpose(1, 2)
               .requires_grad_(needs_grad) for n in (case['queries'], keys, keys))
    bias = make_bias(case, build_bias_factors(case, generator), device, needs_grad)
    leaves = [q, k, v]
    if case['backend'] != BASELINE:
        leaves += [t for part in bias.parts for t in part.tensors() if t.requires_grad]
    grad_out = torch.randn(q.shape, generator=generator).to(device, dtype)
    return dict(q=q, k=k, v=v, bias=bias, leaves=leaves, grad_out=grad_out)


def run_case(case: dict, inputs: dict) -> None:
    """One forward (and, for ``fwdbwd``, backward) call of the case's backend on ``inputs``."""
    if case['backend'] == BASELINE:
        out = F.scaled_dot_product_attention(inputs['q'], inputs['k'], inputs['v'])
    elif case['backend'] == SEGMENT_WITH_RECOMPUTE:
        out = apply_attention(inputs['q'], inputs['k'], inputs['v'], inputs['bias'], backend='segment')
        bs, num_queries = out.size(0), out.size(2)
        budget = ExactRowBudget().budget(num_queries, out.size(1), inputs['k'].size(2))
        call = dispatch._make_call(inputs['q'], inputs['k'], inputs['v'], inputs['bias'], None, 0.0, None)
        out, _ = recompute_rows(call, out, torch.zeros(bs, num_queries, device=out.device), 1.0, budget)
    else:
        out = apply_attention(inputs['q'], inputs['k'], inputs['v'], inputs['bias'], backend=case['backend'])
    if case['pass'] == 'fwdbwd':
        torch.autograd.grad(out, inputs['leaves'], inputs['grad_out'])
    if case['device'].startswith('cuda'):
        torch.cuda.synchronize()


def measure_peak_memory(case: dict) -> Optional[float]:
    """Peak memory (MiB) one call needs beyond its inputs, measured in this process after one warm-up call.

    On CUDA ``torch.cuda.max_memory_allocated`` minus the memory allocated
    before the call; on the CPU :func:`~.process_memory.peak_rss_mib` (run it
    in a fresh process: :func:`~.process_memory.memory_in_subprocess`).
    """
    inputs = build_inputs(case)
    run_case(case, inputs)
    gc.collect()
    if case['device'].startswith('cuda'):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run_case(case, inputs)
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    return peak_rss_mib(lambda: run_case(case, inputs))
