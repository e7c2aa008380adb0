"""A small probe of per-query lie targets, its balanced accuracy, and the decision rule (does disagreement add?).

The probe is a logistic regression or a one-hidden-layer MLP on standardised features, trained with a
class-balanced binary cross-entropy (positives weighted by negatives / positives, so 0.5 is the balanced
threshold) and AdamW. A share of the training samples (whole samples: their queries are not independent) is held
out to pick the epoch with the best balanced accuracy; the fitted probe is then scored on another split.
The same :class:`ProbeSpec` fits both feature sets, so (a) and (b) differ only in what they read.

Decision (:func:`step0_decision`): the design goes on only if probe (b) beats probe (a) by at least
:data:`MIN_GHOST_GAIN` balanced accuracy on the ghost queries.
"""
import copy
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor, nn

#: The gain in balanced accuracy on ghost queries that (b) needs over (a) for the design to go on.
MIN_GHOST_GAIN = 0.10
PROBE_FAMILIES = ('logistic', 'mlp')


@dataclass(frozen=True)
class ProbeSpec:
    """How a probe is built and fitted.

    Attributes:
        family (str): ``'logistic'`` or ``'mlp'`` (:data:`PROBE_FAMILIES`).
        hidden (int): the MLP's hidden units.
        epochs (int): passes over the fitting rows.
        batch_size (int): rows per step.
        lr (float): AdamW's learning rate.
        weight_decay (float): AdamW's weight decay.
        holdout (float): share of the training groups (samples) held out to pick the epoch.
        seed (int): seeds the initialisation, the batches and the held-out groups.
    """

    family: str = 'mlp'
    hidden: int = 64
    epochs: int = 30
    batch_size: int = 1024
    lr: float = 1e-3
    weight_decay: float = 1e-2
    holdout: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.family not in PROBE_FAMILIES:
            raise ValueError(f'family must be one of {PROBE_FAMILIES}, got {self.family!r}')
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f'holdout must be in (0, 1), got {self.holdout}')


def balanced_accuracy(predicted: np.ndarray, target: np.ndarray) -> float:
    """The mean of the true positive rate and the true negative rate of boolean ``[n]`` predictions; NaN where
    ``target`` lacks positives or negatives."""
    predicted, target = np.asarray(predicted, dtype=bool), np.asarray(target, dtype=bool)
    if predicted.shape != target.shape:
        raise ValueError(f'{predicted.shape} predictions for {target.shape} targets')
    positives, negatives = target.sum(), (~target).sum()
    if positives == 0 or negatives == 0:
        return math.nan
    return 0.5 * ((predicted & target).sum() / positives + (~predicted & ~target).sum() / negatives)


def build_probe(features: int, spec: ProbeSpec) -> nn.Module:
    """The probe of ``spec`` on ``features`` inputs, one logit out."""
    if spec.family == 'logistic':
        return nn.Linear(features, 1)
    return nn.Sequential(nn.Linear(features, spec.hidden), nn.ReLU(), nn.Linear(spec.hidden, 1))


@dataclass
class FittedProbe:
    """A probe with its standardisation.

    Attributes:
        mean (Tensor): ``[D]`` the fitting rows' feature means.
        scale (Tensor): ``[D]`` their standard deviations (1 where a feature is constant).
        module (nn.Module): the probe.
        epoch (int): the epoch kept (best held-out balanced accuracy), from 1.
        holdout_accuracy (float): its held-out balanced accuracy.
    """

    mean: Tensor
    scale: Tensor
    module: nn.Module
    epoch: int
    holdout_accuracy: float

    @torch.no_grad()
    def predict(self, features: np.ndarray, batch_size: int = 65536) -> np.ndarray:
        """``[n]`` bool: the logit of ``features [n, D]`` is positive."""
        logits = [self.module((torch.as_tensor(chunk, dtype=torch.float32) - self.mean) / self.scale)[:, 0]
                  for chunk in np.array_split(features, max(1, math.ceil(len(features) / batch_size)))]
        return torch.cat(logits).numpy() > 0


def split_groups(groups: np.ndarray, holdout: float, seed: int) -> np.ndarray:
    """``[n]`` bool: the rows whose group falls in the held-out share (at least one group, never all)."""
    unique = np.unique(groups)
    if len(unique) < 2:
        raise ValueError(f'the probe needs at least 2 groups (samples) to hold some out, got {len(unique)}')
    count = min(len(unique) - 1, max(1, round(holdout * len(unique))))
    held = np.random.default_rng(seed).permutation(unique)[:count]
    return np.isin(groups, held)


def fit_probe(features: np.ndarray, target: np.ndarray, groups: np.ndarray, spec: ProbeSpec) -> FittedProbe:
    """Fit a probe of ``target`` on ``features`` (see the module docstring).

    Args:
        features (np.ndarray): ``[n, D]`` float.
        target (np.ndarray): ``[n]`` bool.
        groups (np.ndarray): ``[n]`` the sample of each row; whole samples are held out.
        spec (ProbeSpec): the probe and its fitting.

    Returns:
        FittedProbe: at the epoch with the best held-out balanced accuracy.
    """
    if features.ndim != 2 or target.shape != features.shape[:1] or groups.shape != target.shape:
        raise ValueError(f'features [n, D], target [n] and groups [n] expected, got {features.shape}, '
                         f'{target.shape} and {groups.shape}')
    held = split_groups(groups, spec.holdout, spec.seed)
    fit_x = torch.as_tensor(features[~held], dtype=torch.float32)
    fit_y = torch.as_tensor(target[~held], dtype=torch.float32)
    positives = float(fit_y.sum())
    if positives == 0 or positives == len(fit_y):
        raise ValueError(f'the fitting rows hold {positives:.0f} positives of {len(fit_y)}: a probe needs both')
    mean, scale = fit_x.mean(dim=0), fit_x.std(dim=0)
    scale = torch.where(scale > 1e-6, scale, torch.ones_like(scale))
    fit_x = (fit_x - mean) / scale
    generator = torch.Generator().manual_seed(spec.seed)
    torch.manual_seed(spec.seed)
    module = build_probe(features.shape[1], spec)
    optimizer = torch.optim.AdamW(module.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor((len(fit_y) - positives) / positives))
    best: Optional[Tuple[float, int, dict]] = None
    for epoch in range(1, spec.epochs + 1):
        module.train()
        for batch in torch.randperm(len(fit_y), generator=generator).split(spec.batch_size):
            optimizer.zero_grad()
            loss_fn(module(fit_x[batch])[:, 0], fit_y[batch]).backward()
            optimizer.step()
        module.eval()
        probe = FittedProbe(mean, scale, module, epoch, math.nan)
        accuracy = balanced_accuracy(probe.predict(features[held]), target[held])
        if best is None or (not math.isnan(accuracy) and (math.isnan(best[0]) or accuracy > best[0])):
            best = (accuracy, epoch, copy.deepcopy(module.state_dict()))
    module.load_state_dict(best[2])
    module.eval()
    return FittedProbe(mean, scale, module, best[1], best[0])


def step0_decision(router_ghost: float, disagreement_ghost: float,
                   min_gain: float = MIN_GHOST_GAIN) -> Tuple[bool, float]:
    """Issue 68's step 0: go on only if probe (b) beats probe (a) by ``min_gain`` balanced accuracy on ghost
    queries. Returns ``(go, gain)``; a NaN accuracy never goes on."""
    gain = disagreement_ghost - router_ghost
    return bool(gain >= min_gain - 1e-12), gain
