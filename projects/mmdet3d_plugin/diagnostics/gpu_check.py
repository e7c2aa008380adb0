"""GPU self-check (``tools/check_gpu.py``): the first thing to run on a new GPU machine.

Checks, each printed as it runs (:func:`run_gpu_checks`); a check that raises
is reported with its traceback and recorded as failed, and the others still
run; :func:`failure_summary` names every failure:

1. **Accuracy** (:func:`check_accuracy`): every backend ``auto`` can pick on
   the device, and those of :data:`EXTRA_BACKENDS`, for no bias, the global,
   the local and both biases, against float64 ``math``: output and gradients
   in float32, float16 and bfloat16, within :data:`TOLERANCES` or twice
   bias-free SDPA's own error where larger (:func:`error_floor`). A refused
   case is reported, not failed; ``auto`` must run every case. Local biases
   also run the slot formulations of :data:`EXTRA_SLOT_FORMULATIONS`.
2. **alpha** (:func:`check_alpha_gradients`): the gradient of
   ``AttentionBiasGenerator``'s learned ``alpha`` through ``auto`` attention
   against float64 ``math``, with the same kind of floor.
3. **Training** (:func:`.training_check.check_training`): the demo model's
   real training iteration (cross-attention in ``attention_dtype``), on CUDA
   with every host synchronisation outside the permitted regions an error.
4. **Speed and memory** (unless ``skip_benchmark``): :mod:`.attention_benchmark`
   on the same shapes, forward + backward, as ratios to bias-free SDPA.
5. **Model benchmark** (CUDA only, with the speed check): the paired CMT vs
   CMT-AQR tables of :mod:`.model_benchmark`, R50 and VoV shapes.
"""
import contextlib
import traceback
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch

from ..attention import AttentionBias, UnsupportedAttentionError, apply_attention
from ..attention.slots.window_slots import default_formulation, formulation_override
from ..attention.triton_device import triton_not_supported_reasons
from ..models.aqr import AttentionBiasGenerator
from .attention_benchmark import BenchmarkOptions, run_attention_benchmark
from .attention_benchmark_tables import benchmark_report
from .attention_cases import KEY_LAYOUTS, build_bias_factors, build_inputs, make_bias
from .model_benchmark import ModelBenchmarkOptions, run_model_benchmark
from .model_benchmark_tables import markdown_tables
from .training_check import check_training

#: (forward, gradients) relative tolerances against float64 ``math`` (SPEC: 1e-5 in fp32; low precision as the
#: CPU tests, where PyTorch's own SDPA differs from the reference by about the dtype's unit roundoff)
TOLERANCES = {'float32': (1e-5, 1e-5), 'float16': (2e-3, 2e-3), 'bfloat16': (1e-2, 3e-2)}
#: backends ``auto`` can pick, per device type (dispatch.py; flash_attn only without a bias)
AUTO_CANDIDATES = {'cuda': ('auto', 'segment', 'flashbias', 'sdpa'), 'cpu': ('auto', 'segment', 'flashbias', 'sdpa')}
#: a backend may err up to this many times PyTorch's own bias-free SDPA on the same inputs (:func:`error_floor`)
FLOOR_FACTOR = 2.0
BIAS_KINDS = ('none', 'global', 'local', 'both')
#: window slot formulations checked besides the device's default, as ``segment`` rows of the local biases
#: (``attention/slots/window_slots.py``; 'triton' where the triton package is installed)
EXTRA_SLOT_FORMULATIONS = {'cuda': ('gather', 'triton'), 'cpu': ('sparse', 'gather')}
#: backends checked besides :data:`AUTO_CANDIDATES`, per device type, where they can run
EXTRA_BACKENDS = {'cuda': ('tiled_bias', )}


@dataclass
class GpuCheckOptions:
    """What ``tools/check_gpu.py`` checks.

    Attributes:
        device (str): ``cuda``, or ``cpu`` (tiny shapes).
        layouts (list[str]): keys of ``KEY_LAYOUTS`` (r50 vov on CUDA, quick on the CPU).
        queries (int): queries of the attention cases (900 on CUDA, 12 on the CPU).
        dtypes (list[str]): keys of :data:`TOLERANCES`.
        steps (int): training iterations of the demo model.
        repeats (int): timed runs per backend.
        skip_benchmark (bool): no speed and memory tables.
        attention_dtype (str, optional): the cross-attention's precision in the training check and the model
            benchmark (default: the configs', ``'auto'``: float16 on CUDA).
    """

    device: str
    layouts: List[str]
    queries: int
    dtypes: List[str] = field(default_factory=lambda: sorted(TOLERANCES))
    steps: int = 20
    repeats: int = 5
    skip_benchmark: bool = False
    attention_dtype: Optional[str] = None


def _case(layout: str, num_queries: int, bias: str, dtype: str, device: str, backend: str) -> dict:
    return dict(layout=layout, queries=num_queries, batch=2, heads=8 if layout != 'quick' else 2,
                head_dim=32 if layout != 'quick' else 8, bias=bias, window_size=15 if layout != 'quick' else 5,
                seed=0, device=device, dtype=dtype, backend=backend, **{'pass': 'fwdbwd'})


def _inputs(case: dict) -> Tuple[List[torch.Tensor], Optional[AttentionBias], torch.Tensor]:
    """q, k, v, the bias (global, local, both or none) and grad_out of a case; all leaves require grad."""
    if case['bias'] == 'none':
        inputs = build_inputs(dict(case, bias='global'))
        return inputs['leaves'][:3], None, inputs['grad_out']
    kinds = ('global', 'local') if case['bias'] == 'both' else (case['bias'], )
    parts = []
    inputs = None
    for kind in kinds:
        inputs = build_inputs(dict(case, bias=kind)) if inputs is None else inputs
        generator = torch.Generator().manual_seed(case['seed'])
        factors = build_bias_factors(dict(case, bias=kind), generator)
        parts += make_bias(dict(case, bias=kind), factors, case['device'], True).parts
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


def check_accuracy(options: GpuCheckOptions) -> List[str]:
    """Every (layout, dtype, bias, backend) case of :func:`check_accuracy_case`, a table row each; the failures."""
    failures = []
    print('| layout | dtype | bias | backend | result | worst relative error |\n|---|---|---|---|---|---|')
    for layout in options.layouts:
        for dtype in options.dtypes:
            floor = error_floor(layout, options.queries, dtype, options.device)
            print(f'| {layout} | {dtype} | | PyTorch SDPA without bias (floor) | tolerance max({TOLERANCES[dtype]}, '
                  f'{FLOOR_FACTOR} x {floor:.1e}) | {floor:.1e} |', flush=True)
            for kind in BIAS_KINDS:
                for backend, formulation in _accuracy_rows(options.device, kind):
                    label = backend if formulation is None else f'{backend} ({formulation} window slots)'
                    case = _case(layout, options.queries, kind, dtype, options.device, backend)
                    try:
                        with (contextlib.nullcontext() if formulation is None
                              else formulation_override(options.device, formulation)):
                            result, worst = check_accuracy_case(case, floor)
                    except Exception as error:  # a crash is a failure of this case; go on with the others
                        print(traceback.format_exc(), flush=True)
                        result, worst = f'FAILED: {type(error).__name__}: {error}', float('nan')
                    print(f'| {layout} | {dtype} | {kind} | {label} | {result} | {worst:.1e} |', flush=True)
                    if result.startswith('FAILED'):
                        failures.append(f'accuracy {layout} {dtype} {kind} {label}: {result}')
    return failures


def _accuracy_rows(device: str, kind: str) -> List[Tuple[str, Optional[str]]]:
    """(backend, window slot formulation or None for the default) of the accuracy table's rows of a bias kind."""
    device_type = torch.device(device).type
    rows = [(backend, None) for backend in AUTO_CANDIDATES[device_type] + EXTRA_BACKENDS.get(device_type, ())]
    if kind in ('local', 'both'):
        extra = [name for name in EXTRA_SLOT_FORMULATIONS.get(device_type, ())
                 if name != default_formulation(device_type)
                 and (name != 'triton' or not triton_not_supported_reasons(device_type, 'the slot kernels'))]
        rows += [('segment', name) for name in extra]
    return rows


def check_alpha_gradients(options: GpuCheckOptions) -> List[str]:
    """The gradient of ``AttentionBiasGenerator``'s ``alpha`` through ``auto`` vs float64 ``math``, per bias kind.

    ``alpha``'s gradient is one number summed over every query, head and key
    (bs x heads x Q x K terms): its float32 rounding alone can reach the
    specification's tolerance. As in :func:`check_accuracy`,
    the tolerance is the specification's or :data:`FLOOR_FACTOR` times
    PyTorch's own error on the same sum: float32 ``math`` against float64.
    """
    failures = []
    layout = options.layouts[0]
    (bev_h, bev_w), (views, cam_h, cam_w) = KEY_LAYOUTS[layout]
    num_keys = bev_h * bev_w + views * cam_h * cam_w
    for local in (False, True):
        case = _case(layout, options.queries, 'global', 'float32', options.device, 'auto')
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
        for name, dtype, backend in (('auto', torch.float32, 'auto'), ('math float32', torch.float32, 'math'),
                                     ('math', torch.float64, 'math')):
            bias_generator = AttentionBiasGenerator(window_size=case['window_size'], bias_scale=2.0,
                                                    use_local_bias=local).to(options.device, dtype)
            bias = bias_generator(*(w.to(options.device, dtype) for w in weights),
                                  {key: value.to(options.device) for key, value in projection.items()},
                                  (bev_h, bev_w), (views, cam_h, cam_w))
            out = apply_attention(*(t.to(options.device, dtype) for t in qkv), bias, backend=backend)
            grads[name] = torch.autograd.grad(out, bias_generator.bias_scale, grad_out.to(options.device, dtype))[0]
        error = _relative_error(grads['auto'], grads['math'])
        floor = _relative_error(grads['math float32'], grads['math'])
        kind = 'local' if local else 'global'
        ok = error <= max(TOLERANCES['float32'][1], FLOOR_FACTOR * floor)
        print(f'alpha gradient, {kind} bias, float32 auto vs float64 math: relative error {error:.1e} (float32 '
              f'math: {floor:.1e}; tolerance max({TOLERANCES["float32"][1]:.0e}, {FLOOR_FACTOR} x {floor:.1e})) '
              f'{"ok" if ok else "FAILED"}')
        if not ok:
            failures.append(f'alpha gradient {kind}: relative error {error:.1e}')
    return failures


def run_benchmark(options: GpuCheckOptions) -> List[str]:
    """The attention benchmark on the check's shapes, forward + backward, printed; no failures of its own."""
    cuda = options.device == 'cuda'
    dims = dict(heads=2, head_dim=8, window_size=5) if options.layouts == ['quick'] else {}
    result = run_attention_benchmark(BenchmarkOptions(
        device=options.device, layouts=list(options.layouts), queries=[options.queries], batch_sizes=[1],
        passes=['fwdbwd'], no_construction=True, repeats=options.repeats, dtype='float16' if cuda else 'float32',
        memory='cuda' if cuda else 'none', **dims))
    print()
    print(benchmark_report(result))
    return []


def run_model_benchmarks(options: GpuCheckOptions) -> List[str]:
    """CMT vs CMT-AQR, R50 and VoV shapes, inference and training step, on the check's device, printed."""
    report = run_model_benchmark(ModelBenchmarkOptions(device=options.device, attention_dtype=options.attention_dtype))
    print('\n' + markdown_tables(report['results']))
    return []


def run_check(name: str, check: Callable[[], List[str]]) -> List[str]:
    """``check()``'s failures; if it raises, its traceback is printed and the exception is its failure."""
    try:
        return check()
    except Exception as error:  # report it and go on with the other checks
        print(f'{name} check raised:\n{traceback.format_exc()}', flush=True)
        return [f'{name}: {type(error).__name__}: {error}']


def run_gpu_checks(options: GpuCheckOptions) -> List[str]:
    """Every check of the module doc, in order; the failures of all of them."""
    checks = [('accuracy', check_accuracy), ('alpha gradient', check_alpha_gradients),
              ('training', lambda o: check_training(o.device, o.steps, o.attention_dtype))]
    if not options.skip_benchmark:
        checks.append(('attention benchmark', run_benchmark))
        if options.device == 'cuda':
            checks.append(('model benchmark', run_model_benchmarks))
    failures = []
    for name, check in checks:
        failures += run_check(name, lambda: check(options))
    return failures


def failure_summary(failures: List[str]) -> Tuple[str, int]:
    """The closing lines and the exit status: ``check_gpu passed`` and 0, or every failure and 1."""
    if not failures:
        return '\ncheck_gpu passed', 0
    return '\n'.join([f'\ncheck_gpu FAILED ({len(failures)} cases):'] + ['  ' + failure for failure in failures]), 1
