"""experiments/lie_probe.py: balanced accuracy, the probe and its fitting, the step-0 decision rule."""
import math

import numpy as np
import pytest
import torch

from projects.mmdet3d_plugin.experiments.lie_probe import (MIN_GHOST_GAIN, ProbeSpec, balanced_accuracy, build_probe,
                                                           fit_probe, split_groups, step0_decision)


def test_balanced_accuracy_is_the_mean_of_the_two_class_rates():
    target = np.array([True, True, False, False, False, False])
    predicted = np.array([True, False, False, False, False, True])
    # TPR 1/2, TNR 3/4
    assert balanced_accuracy(predicted, target) == pytest.approx(0.625)
    assert balanced_accuracy(np.ones(6, bool), target) == pytest.approx(0.5)  # all positive: chance
    assert balanced_accuracy(target, target) == 1.0
    assert math.isnan(balanced_accuracy(np.ones(3, bool), np.zeros(3, bool)))
    with pytest.raises(ValueError):
        balanced_accuracy(np.ones(3, bool), np.ones(4, bool))


def test_decision_rule_needs_a_gain_of_010_on_ghost_queries():
    assert MIN_GHOST_GAIN == 0.10
    assert step0_decision(0.60, 0.70) == (True, pytest.approx(0.10))
    go, gain = step0_decision(0.60, 0.69)
    assert not go and gain == pytest.approx(0.09)
    assert step0_decision(0.70, 0.60)[0] is False
    assert step0_decision(0.60, float('nan'))[0] is False


def test_the_probes_of_a_spec_have_the_same_size_for_any_inputs():
    mlp = build_probe(10, ProbeSpec(family='mlp', hidden=7))
    assert [tuple(p.shape) for p in mlp.parameters()] == [(7, 10), (7, ), (1, 7), (1, )]
    assert [tuple(p.shape) for p in build_probe(10, ProbeSpec(family='logistic')).parameters()] == [(1, 10), (1, )]
    with pytest.raises(ValueError, match='family'):
        ProbeSpec(family='forest')


def test_held_out_rows_are_whole_groups():
    groups = np.repeat(np.arange(10), 5)
    held = split_groups(groups, 0.2, seed=0)
    assert held.sum() == 10 and len(np.unique(groups[held])) == 2
    assert not set(groups[held]) & set(groups[~held])
    with pytest.raises(ValueError, match='2 groups'):
        split_groups(np.zeros(4), 0.2, 0)


@pytest.mark.parametrize('family', ['logistic', 'mlp'])
def test_a_probe_learns_a_rare_separable_target_and_ignores_the_scale_of_its_inputs(family):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(3000, 4))
    features[:, 1] *= 1000.0  # standardised away
    features[:, 3] = 5.0  # a constant input
    target = features[:, 0] > 1.5  # ~7 % positives: the class-balanced loss must still find them
    groups = np.repeat(np.arange(60), 50)
    probe = fit_probe(features, target, groups, ProbeSpec(family=family, hidden=8, epochs=15, batch_size=256, lr=1e-2))
    assert 1 <= probe.epoch <= 15 and probe.holdout_accuracy > 0.9
    test = rng.normal(size=(2000, 4))
    test[:, 3] = 5.0
    assert balanced_accuracy(probe.predict(test), test[:, 0] > 1.5) > 0.9
    assert torch.all(probe.scale > 0)


def test_a_target_without_positives_cannot_be_fitted():
    with pytest.raises(ValueError, match='positives'):
        fit_probe(np.zeros((20, 2)), np.zeros(20, bool), np.repeat(np.arange(4), 5), ProbeSpec())
