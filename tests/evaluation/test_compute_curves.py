"""ScaleRL's compute-curve fit on synthetic points with known parameters."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from trl_reasoning.evaluation.compute_curves import fit_compute_curve

HAS_SCIPY = importlib.util.find_spec("scipy") is not None


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


def _noisy(seed: int, n: int = 40, noise: float = 0.01):
    rng = np.random.default_rng(seed)
    compute = np.logspace(2, 6, n)
    return compute, sigmoid(compute, 0.7, 1.2, 1e4, 0.15) + rng.normal(0, noise, compute.size)


def test_scipy_and_the_built_in_fit_agree():
    pytest.importorskip("scipy")
    compute, reward = _noisy(0)
    with_scipy = fit_compute_curve(compute, reward, r0=0.15, use_scipy=True)
    built_in = fit_compute_curve(compute, reward, r0=0.15, use_scipy=False)
    assert with_scipy.method == "scipy.optimize.curve_fit" and built_in.method == "levenberg_marquardt"
    for name in ("A", "B", "C_mid", "A_stderr", "B_stderr", "C_mid_stderr", "rmse"):
        assert getattr(with_scipy, name) == pytest.approx(getattr(built_in, name), rel=1e-4), name
    assert fit_compute_curve(compute, reward, r0=0.15).method == "scipy.optimize.curve_fit"  # the default


def test_standard_errors_match_curve_fit_in_the_natural_parameters():
    """An independent computation: scipy's own covariance for (A, B, C_mid), fitted directly in those parameters."""
    pytest.importorskip("scipy")
    from scipy.optimize import curve_fit

    compute, reward = _noisy(1)
    fit = fit_compute_curve(compute, reward, r0=0.15, use_scipy=False)
    params, covariance = curve_fit(
        lambda c, a, b, c_mid: sigmoid(c, a, b, c_mid, 0.15), compute, reward, p0=[fit.A, fit.B, fit.C_mid]
    )
    np.testing.assert_allclose(params, [fit.A, fit.B, fit.C_mid], rtol=1e-5)
    np.testing.assert_allclose(np.sqrt(np.diag(covariance)), [fit.A_stderr, fit.B_stderr, fit.C_mid_stderr], rtol=1e-3)


def test_standard_errors_describe_the_spread_of_refits():
    """Refit on 60 noise draws: the spread of the fitted A and B is what one fit's standard error says it is."""
    fits = [fit_compute_curve(*_noisy(seed, noise=0.02), r0=0.15, use_scipy=False) for seed in range(60)]
    for name in ("A", "B"):
        spread = np.std([getattr(f, name) for f in fits], ddof=1)
        reported = np.median([getattr(f, f"{name}_stderr") for f in fits])
        assert 0.7 < spread / reported < 1.4, (name, spread, reported)


def test_standard_errors_need_more_points_than_parameters_and_scipy_can_be_required(monkeypatch):
    compute = np.array([10.0, 100.0, 1000.0])
    fit = fit_compute_curve(compute, sigmoid(compute, 0.6, 1.0, 100.0, 0.1), r0=0.1)
    assert math.isnan(fit.A_stderr) and math.isnan(fit.B_stderr) and math.isnan(fit.C_mid_stderr)
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "scipy" else object())
    with pytest.raises(ImportError, match='use_scipy=True needs scipy: pip install "trl-reasoning\\[scaling\\]"'):
        fit_compute_curve(compute, [0.1, 0.3, 0.5], use_scipy=True)
    assert fit_compute_curve(*_noisy(0), r0=0.15).method == "levenberg_marquardt"


# The training reward of a real run (SmolLM2-135M, 16 completions a step) against its generated tokens: still rising
# at the end, so A is not identified by the points.
RISING_TO_THE_END = (
    [254, 482, 725, 970, 1206, 1456, 1712, 1963, 2219, 2467, 2702, 2952, 3184, 3427, 3656, 3897, 4073],
    [
        0.125,
        0.1875,
        0.0,
        0.1875,
        0.25,
        0.0625,
        0.0,
        0.125,
        0.125,
        0.125,
        0.25,
        0.4375,
        0.4375,
        0.375,
        0.375,
        0.6875,
        0.875,
    ],
)


@pytest.mark.parametrize(
    "use_scipy", [False, pytest.param(True, marks=pytest.mark.skipif(not HAS_SCIPY, reason="scipy"))]
)
def test_an_unsaturated_noisy_curve_fits_without_overflow_and_a_max_bounds_a(use_scipy):
    # a steep exponent once overflowed math.exp in the built-in fit's line search
    free = fit_compute_curve(*RISING_TO_THE_END, use_scipy=use_scipy)
    assert math.isfinite(free.A) and free.A > 1.0  # an asymptote above any reachable reward: the data allow it
    bounded = fit_compute_curve(*RISING_TO_THE_END, use_scipy=use_scipy, a_max=1.0)
    assert free.R0 < bounded.A <= 1.0
    assert math.isfinite(bounded.B) and math.isfinite(bounded.C_mid) and bounded.r_squared > 0.7


@pytest.mark.parametrize(("a", "b", "c_mid", "r0"), [(0.8, 1.5, 1e4, 0.1), (0.3, 2.0, 200.0, 0.0)])
def test_a_max_above_the_true_asymptote_recovers_it(a, b, c_mid, r0):
    compute = np.logspace(math.log10(c_mid) - 2, math.log10(c_mid) + 2, 25)
    fit = fit_compute_curve(compute, sigmoid(compute, a, b, c_mid, r0), r0=r0, a_max=1.0)
    assert fit.A == pytest.approx(a, rel=1e-4)
    assert fit.B == pytest.approx(b, rel=1e-4)
    assert fit.C_mid == pytest.approx(c_mid, rel=1e-3)


@pytest.mark.parametrize("a_max", [0.1, 0.05, float("nan"), float("inf")])
def test_a_max_must_lie_above_r0(a_max):
    compute = [10.0, 100.0, 1000.0, 1e4]
    with pytest.raises(ValueError, match="a_max must be a finite number above r0 = 0.1"):
        fit_compute_curve(compute, [0.1, 0.2, 0.4, 0.5], a_max=a_max)
