"""ScaleRL's compute-curve fit on synthetic points with known parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trl_reasoning.scaling import fit_compute_curve


def sigmoid(compute, a, b, c_mid, r0):
    compute = np.asarray(compute, dtype=np.float64)
    return r0 + (a - r0) / (1 + (c_mid / compute) ** b)


@pytest.mark.parametrize(
    ("a", "b", "c_mid", "r0"), [(0.8, 1.5, 1e4, 0.1), (0.55, 0.7, 3e7, 0.2), (0.9, 3.0, 50.0, 0.0)]
)
def test_recovers_known_parameters_from_exact_points(a, b, c_mid, r0):
    compute = np.logspace(math.log10(c_mid) - 2, math.log10(c_mid) + 2, 25)
    fit = fit_compute_curve(compute, sigmoid(compute, a, b, c_mid, r0), r0=r0)
    assert fit.A == pytest.approx(a, rel=1e-5)
    assert fit.B == pytest.approx(b, rel=1e-5)
    assert fit.C_mid == pytest.approx(c_mid, rel=1e-4)
    assert fit.r_squared == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(fit.predict(compute), sigmoid(compute, a, b, c_mid, r0), atol=1e-7)


def test_noisy_points_give_close_parameters_and_a_good_fit():
    rng = np.random.default_rng(0)
    compute = np.logspace(2, 6, 40)
    reward = sigmoid(compute, 0.7, 1.2, 1e4, 0.15) + rng.normal(0, 0.01, compute.size)
    fit = fit_compute_curve(compute, reward, r0=0.15)
    assert fit.A == pytest.approx(0.7, abs=0.03)
    assert fit.B == pytest.approx(1.2, rel=0.2)
    assert fit.C_mid == pytest.approx(1e4, rel=0.3)
    assert fit.r_squared > 0.97 and fit.rmse < 0.02


def test_r0_defaults_to_the_reward_at_the_least_compute():
    compute = np.array([0.0, 10, 100, 1000, 1e4, 1e5])
    reward = np.concatenate([[0.2], sigmoid(compute[1:], 0.6, 1.0, 500.0, 0.2)])
    fit = fit_compute_curve(compute, reward)
    assert fit.R0 == 0.2 and fit.num_points == 5
    assert fit.A == pytest.approx(0.6, rel=1e-4) and fit.C_mid == pytest.approx(500.0, rel=1e-3)
    assert fit.predict([0.0])[0] == 0.2


@pytest.mark.parametrize(
    ("compute", "reward", "message"),
    [
        ([1, 2, 3], [0.1, 0.2], "same length"),
        ([0, 1, 2], [0.1, 0.2, 0.3], "at least 3 points"),
        ([1, -2, 3], [0.1, 0.2, 0.3], "compute must be >= 0"),
        ([1, 2, 3], [0.1, float("nan"), 0.3], "must be finite"),
    ],
)
def test_bad_inputs_are_named(compute, reward, message):
    with pytest.raises(ValueError, match=message):
        fit_compute_curve(compute, reward)
