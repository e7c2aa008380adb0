"""GPU self-check: the first command to run on a new GPU machine (see docs/gpu.md).

Examples::

    python tools/check_gpu.py                  # on the GPU: R50 and VoV shapes, every dtype
    python tools/check_gpu.py --device cpu     # tiny shapes on the CPU (seconds; run by the test suite)

Three checks, each printed as it runs; the exit status is non-zero when any
fails, and the summary names every failing case:

1. **Accuracy.** Every backend that ``apply_attention(backend='auto')`` can
   pick on the device, for no bias, the AQR global bias (``SegmentBias``), the
   local bias (``WindowBias``) and both, against ``math`` run in float64 on the
   same inputs: the output and the gradients of q, k, v, the window
   amplitudes and the segment values, in float32, float16 and bfloat16, with
   the specification's tolerances (:data:`TOLERANCES`), or twice PyTorch's
   own error where that is larger: the error of bias-free SDPA on the same
   layout and dtype (:func:`error_floor`; float32 at VoV's 56 400 keys on an
   H200: 1.0e-5 in dq, where the specification asks 1e-5). A backend that
   refuses a case (``UnsupportedAttentionError``) is reported, not failed;
   ``auto`` itself must run every case.
2. **Speed and memory.** ``tools/benchmark_attention.py`` on the same shapes,
   forward + backward: median time and peak memory of each backend as a ratio
   to bias-free SDPA (on CUDA the peak is ``torch.cuda.max_memory_allocated``).
3. **alpha.** ``AttentionBiasGenerator`` (global and local bias) builds the
   bias from random AQR weights and projections; the gradient of its learned
   ``alpha`` through ``auto`` attention against float64 ``math``.
4. **Training.** ``--steps`` training iterations (forward, backward,
   optimizer step) of the demo model (``configs/demo/cmt_aqr_synthetic_tiny.py``)
   on random batches whose number of ground-truth boxes, and so the number of
   DN queries, changes every step, asserting finite losses, that nothing is
   compiled (``auto`` never runs a compiled path), that torch never warns
   about running flex_attention eagerly, and, on CUDA, that nothing waits for
   the device (``torch.cuda.set_sync_debug_mode('error')``) except the
   regions that must (``permitted_host_sync``: voxelization, whose sizes are
   data, and the loss's Hungarian matching on the host). It also prints how
   many attention rows ``segment`` left inexact (its recomputation budget,
   ``segment_inexact_rows`` in the training log).
5. **Model benchmark** (CUDA only, with the speed check): ``tools/benchmark_model.py``'s
   paired CMT vs CMT-AQR tables, R50 and VoV shapes, inference and training step.
"""
import argparse
import contextlib
import logging
import os.path as osp
import sys
import warnings
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from projects.mmdet3d_plugin.apis.synthetic_batch import random_demo_batch  # noqa: E402
from projects.mmdet3d_plugin.attention import (AttentionBias, UnsupportedAttentionError,  # noqa: E402
                                               apply_attention)
from projects.mmdet3d_plugin.models.aqr import AttentionBiasGenerator  # noqa: E402
from tools import benchmark_attention as bench  # noqa: E402
from tools import benchmark_model  # noqa: E402

#: (forward, gradients) relative tolerances against float64 ``math`` (SPEC: 1e-5 in fp32; low precision as the
#: CPU tests, where PyTorch's own SDPA differs from the reference by about the dtype's unit roundoff)
TOLERANCES = {'float32': (1e-5, 1e-5), 'float16': (2e-3, 2e-3), 'bfloat16': (1e-2, 3e-2)}
#: backends ``auto`` can pick, per device type (dispatch.py; flash_attn only without a bias)
AUTO_CANDIDATES = {'cuda': ('auto', 'segment', 'flashbias', 'sdpa'), 'cpu': ('auto', 'segment', 'flashbias', 'sdpa')}
#: a backend may err up to this many times PyTorch's own bias-free SDPA on the same inputs (:func:`error_floor`)
FLOOR_FACTOR = 2.0
BIAS_KINDS = ('none', 'global', 'local', 'both')
EAGER_FLEX_WARNING = 'flex_attention called without torch.compile'
DEMO_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny.py'


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Check the attention backends and the training path on this GPU.')
    parser.add_argument('--device', default='cuda', help="'cuda' (default) or 'cpu' (tiny shapes)")
    parser.add_argument('--layouts', nargs='+', choices=sorted(bench.KEY_LAYOUTS), default=None,
                        help='key layouts (default: r50 vov on CUDA, quick on CPU)')
    parser.add_argument('--queries', type=int, default=None, help='queries (default 900 on CUDA, 12 on CPU)')
    parser.add_argument('--dtypes', nargs='+', choices=sorted(TOLERANCES), default=sorted(TOLERANCES))
    parser.add_argument('--steps', type=int, default=20, help='training iterations of the demo model')
    parser.add_argument('--repeats', type=int, default=5, help='timed runs per backend')
    parser.add_argument('--skip-benchmark', action='store_true')
    args = parser.parse_args(argv)
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error('no CUDA device is visible to torch; run with --device cpu for the CPU self-test')
    tiny = args.device == 'cpu'
    args.layouts = args.layouts or (['quick'] if tiny else ['r50', 'vov'])
    args.queries = args.queries or (12 if tiny else 900)
    return args


def _case(layout: str, num_queries: int, bias: str, dtype: str, device: str, backend: str) -> dict:
    return dict(layout=layout, queries=num_queries, batch=2, heads=8 if layout != 'quick' else 2,
                head_dim=32 if layout != 'quick' else 8, bias=bias, window_size=15 if layout != 'quick' else 5,
                seed=0, device=device, dtype=dtype, backend=backend, **{'pass': 'fwdbwd'})


def _inputs(case: dict) -> Tuple[List[torch.Tensor], Optional[AttentionBias], torch.Tensor]:
    """q, k, v, the bias (global, local, both or none) and grad_out of a case; all leaves require grad."""
    if case['bias'] == 'none':
        inputs = bench.build_inputs(dict(case, bias='global'))
        return inputs['leaves'][:3], None, inputs['grad_out']
    kinds = ('global', 'local') if case['bias'] == 'both' else (case['bias'], )
    parts = []
    inputs = None
    for kind in kinds:
        inputs = bench.build_inputs(dict(case, bias=kind)) if inputs is None else inputs
        generator = torch.Generator().manual_seed(case['seed'])
        factors = bench.build_bias_factors(dict(case, bias=kind), generator)
        parts += bench.make_bias(dict(case, bias=kind), factors, case['device'], True).parts
    bias = AttentionBias(parts, inputs['k'].size(2))
    return inputs['leaves'][:3], bias, inputs['grad_out']


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def check_accuracy_case(case: dict, floor: float = 0.0) -> Tuple[str, float]:
    """One backend on one case against float64 math: ('ok' | 'refused: ...' | 'FAILED: ...', worst error).

    An error passes up to the dtype's tolerance or ``FLOOR_FACTOR * floor``, whichever is larger.
    """
    qkv, bias, grad_out = _inputs(case)
    bias_leaves = [t for part in bias.parts for t in part.tensors() if t.requires_grad] if bias is not None else []
    leaves = qkv + bias_leaves
    try:
        out = apply_attention(*qkv, bias, backend=case['backend'])
    except UnsupportedAttentionError as error:
        if case['backend'] == 'auto':
            return f'FAILED: auto refused ({error})', float('nan')
        return 'refused: ' + '; '.join(error.reasons), float('nan')
    grads = torch.autograd.grad(out, leaves, grad_out, allow_unused=True)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref_bias = bias.to(dtype=torch.float64) if bias is not None else None
    if ref_bias is not None:  # rebuild on the float64 leaves so that their gradients come back
        ref_bias = _rebind(bias, ref_leaves[3:])
    ref = apply_attention(*ref_leaves[:3], ref_bias, backend='math')
    ref_grads = torch.autograd.grad(ref, ref_leaves, grad_out.double(), allow_unused=True)
    forward_tol, grad_tol = (max(tol, FLOOR_FACTOR * floor) for tol in TOLERANCES[case['dtype']])
    errors = {'out': _relative_error(out, ref)}
    names = ['dq', 'dk', 'dv'] + [f'd{type(p).__name__}[{i}]' for i, p in enumerate(bias_leaves)]
    for name, grad, ref_grad in zip(names, grads, ref_grads):
        errors[name] = _relative_error(grad, ref_grad) if grad is not None else float('inf')
    bad = [f'{name} {err:.1e}' for name, err in errors.items()
           if not err <= (forward_tol if name == 'out' else grad_tol)]
    worst = max(errors.values())
    return ('FAILED: ' + ', '.join(bad), worst) if bad else ('ok', worst)


def _rebind(bias: AttentionBias, leaves: List[torch.Tensor]) -> AttentionBias:
    """The same bias with its differentiable tensors replaced by ``leaves`` (in :meth:`tensors` order)."""
    parts, it = [], iter(leaves)
    for part in bias.parts:
        part = part.to(dtype=torch.float64)
        for name in ('values', 'amplitude'):
            value = getattr(part, name, None)
            if isinstance(value, torch.Tensor):
                setattr(part, name, next(it))
            elif isinstance(value, tuple):
                setattr(part, name, tuple(next(it) for _ in value))
        parts.append(part)
    return AttentionBias(parts, bias.num_keys)


def error_floor(layout: str, num_queries: int, dtype: str, device: str) -> float:
    """The worst relative error of PyTorch's own bias-free SDPA against float64 on a layout and dtype."""
    return check_accuracy_case(_case(layout, num_queries, 'none', dtype, device, 'sdpa'))[1]


def check_accuracy(args: argparse.Namespace) -> List[str]:
    failures = []
    print('| layout | dtype | bias | backend | result | worst relative error |\n|---|---|---|---|---|---|')
    for layout in args.layouts:
        for dtype in args.dtypes:
            floor = error_floor(layout, args.queries, dtype, args.device)
            print(f'| {layout} | {dtype} | | PyTorch SDPA without bias (floor) | tolerance max({TOLERANCES[dtype]}, '
                  f'{FLOOR_FACTOR} x {floor:.1e}) | {floor:.1e} |', flush=True)
            for kind in BIAS_KINDS:
                for backend in AUTO_CANDIDATES[torch.device(args.device).type]:
                    case = _case(layout, args.queries, kind, dtype, args.device, backend)
                    try:
                        result, worst = check_accuracy_case(case, floor)
                    except Exception as error:  # a crash is a failure of this case; go on with the others
                        result, worst = f'FAILED: {type(error).__name__}: {error}', float('nan')
                    print(f'| {layout} | {dtype} | {kind} | {backend} | {result} | {worst:.1e} |', flush=True)
                    if result.startswith('FAILED'):
                        failures.append(f'accuracy {layout} {dtype} {kind} {backend}: {result}')
    return failures


def check_alpha_gradients(args: argparse.Namespace) -> List[str]:
    """The gradient of ``AttentionBiasGenerator``'s ``alpha`` through ``auto`` vs float64 ``math``, per bias kind."""
    failures = []
    layout = args.layouts[0]
    (bev_h, bev_w), (views, cam_h, cam_w) = bench.KEY_LAYOUTS[layout]
    num_keys = bev_h * bev_w + views * cam_h * cam_w
    for local in (False, True):
        case = _case(layout, args.queries, 'global', 'float32', args.device, 'auto')
        generator = torch.Generator().manual_seed(1)
        bs, num_queries, heads, head_dim = case['batch'], case['queries'], case['heads'], case['head_dim']
        weights = torch.rand(2, bs, num_queries, generator=generator)
        projection = dict(
            pts_bev=torch.stack([torch.randint(0, bev_h, (bs, num_queries), generator=generator),
                                 torch.randint(0, bev_w, (bs, num_queries), generator=generator)], -1),
            pts_pers_idx=torch.stack([torch.randint(0, views, (bs, num_queries), generator=generator),
                                      torch.randint(0, cam_h, (bs, num_queries), generator=generator),
                                      torch.randint(0, cam_w, (bs, num_queries), generator=generator)], -1),
            visible=torch.rand(bs, num_queries, generator=generator) > 0.2)
        qkv = [torch.randn(bs, heads, n, head_dim, generator=generator) for n in (num_queries, num_keys, num_keys)]
        grad_out = torch.randn(bs, heads, num_queries, head_dim, generator=generator)
        grads = {}
        for name, dtype, backend in (('auto', torch.float32, 'auto'), ('math', torch.float64, 'math')):
            bias_generator = AttentionBiasGenerator(window_size=case['window_size'], bias_scale=2.0,
                                                    use_local_bias=local).to(args.device, dtype)
            bias = bias_generator(*(w.to(args.device, dtype) for w in weights),
                                  {key: value.to(args.device) for key, value in projection.items()},
                                  (bev_h, bev_w), (views, cam_h, cam_w))
            out = apply_attention(*(t.to(args.device, dtype) for t in qkv), bias, backend=backend)
            grads[name] = torch.autograd.grad(out, bias_generator.bias_scale, grad_out.to(args.device, dtype))[0]
        error = _relative_error(grads['auto'], grads['math'])
        kind = 'local' if local else 'global'
        ok = error <= TOLERANCES['float32'][1]
        print(f'alpha gradient, {kind} bias, float32 auto vs float64 math: relative error {error:.1e} '
              f'{"ok" if ok else "FAILED"}')
        if not ok:
            failures.append(f'alpha gradient {kind}: relative error {error:.1e}')
    return failures


@contextlib.contextmanager
def host_syncs_are_errors(device: str) -> Iterator[None]:
    """On CUDA, make every host synchronisation outside ``permitted_host_sync`` blocks raise (sync-debug mode)."""
    if device != 'cuda':
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode('error')
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def check_training(args: argparse.Namespace) -> List[str]:
    """``--steps`` training iterations of the demo model, DN query count changing: no compile, no eager flex, on
    CUDA no host synchronisation outside the permitted regions (voxelization, the loss's Hungarian matching)."""
    from mmcv import Config
    from mmdet3d.models import build_model
    from torch._dynamo.utils import counters

    cfg = Config.fromfile(osp.join(REPO_ROOT, DEMO_CONFIG))
    logging.getLogger('mmcv').setLevel(logging.WARNING)  # init_weights lists every parameter at INFO
    torch.manual_seed(0)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    model.to(args.device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    counters.clear()
    failures, box_counts, losses = [], [], []
    inexact_rows = 0.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for step in range(args.steps):
            num_boxes = (1 + step % 7, 1 + (3 * step) % 5)  # the DN queries follow the largest count
            box_counts.append(max(num_boxes))
            batch = random_demo_batch(cfg, num_boxes, args.device, generator)
            try:
                with host_syncs_are_errors(args.device):
                    log_vars = model(return_loss=True, **batch)
                    loss = sum(value for name, value in log_vars.items() if 'loss' in name)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            except RuntimeError as error:
                if 'synchroniz' not in str(error):
                    raise
                failures.append(f'training: a host synchronisation outside the permitted regions (step {step}): '
                                f'{error}')
                break
            losses.append(float(loss))
            inexact_rows += float(log_vars.get('segment_inexact_rows', 0.0))
    graphs = counters['stats']['unique_graphs']
    eager_flex = [str(w.message) for w in caught if EAGER_FLEX_WARNING in str(w.message)
                  or 'materializes' in str(w.message)]
    print(f'demo model training: {args.steps} iterations, ground-truth boxes per batch {sorted(set(box_counts))} '
          f'(DN query count changes), loss {losses[0]:.3f} -> {losses[-1]:.3f}, {graphs} compiled graphs, '
          f'{len(eager_flex)} eager-flex warnings, {inexact_rows:.0f} attention rows left inexact by segment\'s '
          f'recomputation budget, host synchronisations {"errors" if args.device == "cuda" else "not checked (CPU)"}')
    if not losses or not all(torch.isfinite(torch.tensor(losses))):
        failures.append(f'training: non-finite loss {losses}')
    if graphs:
        failures.append(f'training: {graphs} graphs compiled (auto must not run a compiled path)')
    if eager_flex:
        failures.append(f'training: eager flex_attention ran: {eager_flex[0]}')
    return failures


def run_benchmark(args: argparse.Namespace) -> Dict:
    argv = ['--device', args.device, '--layouts', *args.layouts, '--queries', str(args.queries), '--batch-sizes',
            '1', '--passes', 'fwdbwd', '--no-construction', '--repeats', str(args.repeats), '--dtype',
            'float16' if args.device == 'cuda' else 'float32', '--memory', 'cuda' if args.device == 'cuda' else 'none']
    if args.layouts == ['quick']:
        argv += ['--heads', '2', '--head-dim', '8', '--window-size', '5']
    return bench.main(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    device_name = torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'
    print(f'# check_gpu: torch {torch.__version__}, device {device_name}, layouts {args.layouts}, '
          f'Q {args.queries}')
    failures = check_accuracy(args)
    failures += check_alpha_gradients(args)
    failures += check_training(args)
    if not args.skip_benchmark:
        run_benchmark(args)
        if args.device == 'cuda':  # CMT vs CMT-AQR, R50 and VoV shapes, inference and training step
            benchmark_model.main(['--device', 'cuda'])
    if failures:
        print(f'\ncheck_gpu FAILED ({len(failures)} cases):')
        for failure in failures:
            print('  ' + failure)
        return 1
    print('\ncheck_gpu passed')
    return 0


if __name__ == '__main__':
    sys.exit(main())
