"""ScaleRL's compute curve: fit a saturating sigmoid to reward-vs-compute points (no TRL import).

``R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)`` with ``A`` the asymptotic reward, ``B`` the scaling exponent
(compute efficiency) and ``C_mid`` the compute at which half of the gain ``A - R0`` is reached. ``R0`` is the reward
before training. Source: ScaleRL, "The Art of Scaling Reinforcement Learning Compute for LLMs", arXiv 2510.13786.

The least-squares fit uses ``scipy.optimize.curve_fit`` when scipy is installed (the ``scaling`` extra) and a small
Levenberg-Marquardt of its own otherwise; both start from the same grid of points and both report the parameters'
standard errors as ``curve_fit`` does (``s^2 (J^T J)^-1`` at the optimum, ``s^2`` the residual variance). ``a_max``
bounds ``A`` (a pass rate's asymptote cannot pass 1): the optimiser then works on the logit of ``A``'s place between
``R0`` and ``a_max``, so both fits hold the bound; the standard errors stay those of the unbounded model at the optimum.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ComputeCurveFit:
    """A fitted compute curve and its goodness of fit on the points it was fitted to."""

    A: float
    B: float
    C_mid: float
    R0: float
    r_squared: float
    rmse: float
    num_points: int
    #: Standard errors of A, B and C_mid (NaN with 3 points: no residual degrees of freedom).
    A_stderr: float = math.nan
    B_stderr: float = math.nan
    C_mid_stderr: float = math.nan
    #: "scipy.optimize.curve_fit" or "levenberg_marquardt" (the built-in fallback).
    method: str = "levenberg_marquardt"

    def predict(self, compute: Sequence[float] | np.ndarray) -> np.ndarray:
        """``R(C)`` at each compute value (``R0`` at ``C = 0``)."""
        return _curve(np.asarray(compute, dtype=np.float64), self.A, self.B, self.C_mid, self.R0)


def _curve(compute: np.ndarray, a: float, b: float, c_mid: float, r0: float) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):
        ratio = np.exp(b * (math.log(c_mid) - np.log(np.where(compute > 0, compute, np.nan))))
    value = r0 + (a - r0) / (1.0 + ratio)
    return np.where(compute > 0, value, r0)


#: |log B| beyond this is a step function for any compute grid; bounding it keeps exp() finite while a fit wanders
_LOG_B_BOUND = 50.0


def _asymptote(theta_a: float, r0: float, a_max: float | None) -> float:
    """``A`` from its fitted coordinate: itself, or with ``a_max`` a logistic map onto ``(r0, a_max)`` (the optimiser
    works unconstrained; the bound holds by construction)."""
    if a_max is None:
        return theta_a
    return r0 + (a_max - r0) / (1.0 + math.exp(-min(max(theta_a, -700.0), 700.0)))


def _params(theta: np.ndarray, r0: float, a_max: float | None) -> tuple[float, float, float]:
    """``(A, B, log C_mid)`` from the optimiser's coordinates ``(A or its logit, log B, log C_mid)``."""
    theta_a, log_b, log_c_mid = theta
    return _asymptote(theta_a, r0, a_max), math.exp(min(max(log_b, -_LOG_B_BOUND), _LOG_B_BOUND)), log_c_mid


def _residuals(
    theta: np.ndarray, log_c: np.ndarray, reward: np.ndarray, r0: float, a_max: float | None = None
) -> np.ndarray:
    a, b, log_c_mid = _params(theta, r0, a_max)
    exponent = np.clip(b * (log_c_mid - log_c), -700.0, 700.0)
    return r0 + (a - r0) / (1.0 + np.exp(exponent)) - reward


def _central_jacobian(function, params: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """``d function / d params`` by central differences, one column per parameter (three here: cheap and robust)."""
    columns = []
    for j, step in enumerate(steps):
        up, down = params.copy(), params.copy()
        up[j] += step
        down[j] -= step
        columns.append((function(up) - function(down)) / (2 * step))
    return np.stack(columns, axis=1)


def _levenberg_marquardt(theta, log_c, reward, r0, a_max=None, iterations=500):
    damping = 1e-3
    residual = _residuals(theta, log_c, reward, r0, a_max)
    cost = float(residual @ residual)
    for _ in range(iterations):
        steps = 1e-6 * np.maximum(1.0, np.abs(theta))
        jacobian = _central_jacobian(lambda t: _residuals(t, log_c, reward, r0, a_max), theta, steps)
        normal = jacobian.T @ jacobian
        gradient = jacobian.T @ residual
        improved = False
        while damping < 1e12:
            delta = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient)
            candidate = theta + delta
            candidate_residual = _residuals(candidate, log_c, reward, r0, a_max)
            candidate_cost = float(candidate_residual @ candidate_residual)
            if candidate_cost < cost:
                theta, residual, damping, improved = candidate, candidate_residual, max(damping / 3, 1e-12), True
                converged = cost - candidate_cost < 1e-15 * max(cost, 1e-300)
                cost = candidate_cost
                break
            damping *= 4
        if not improved or converged:
            break
    return theta, cost


def _curve_fit(theta0, log_c, reward, r0, a_max=None):
    """``scipy.optimize.curve_fit`` from ``theta0`` (same parametrisation as ``_residuals``); ``None`` if it fails."""
    from scipy.optimize import OptimizeWarning, curve_fit

    def model(x, a, log_b, log_c_mid):
        return _residuals(np.array([a, log_b, log_c_mid]), x, np.zeros_like(x), r0, a_max)

    try:
        with warnings.catch_warnings():  # its covariance is not used (see _standard_errors): an exact fit warns
            warnings.simplefilter("ignore", OptimizeWarning)
            theta, _ = curve_fit(model, log_c, reward, p0=theta0, method="lm", maxfev=5000)
    except (RuntimeError, ValueError):  # no convergence from this start: the other starts remain
        return None
    residual = _residuals(theta, log_c, reward, r0, a_max)
    return theta, float(residual @ residual)


def _standard_errors(a: float, b: float, c_mid: float, r0: float, compute, reward, cost: float) -> tuple:
    """Standard errors of (A, B, C_mid) as ``curve_fit`` reports them: ``sqrt(diag(s^2 (J^T J)^-1))`` with J the
    Jacobian of the model in (A, B, C_mid) at the optimum (central differences) and ``s^2 = cost / (n - 3)``."""
    n = compute.size
    if n <= 3:
        return (math.nan,) * 3
    params = np.array([a, b, c_mid])
    steps = 1e-6 * np.maximum(np.abs(params), 1e-12)
    jacobian = _central_jacobian(lambda p: _curve(compute, *p, r0), params, steps)
    try:
        covariance = np.linalg.inv(jacobian.T @ jacobian) * (cost / (n - 3))
    except np.linalg.LinAlgError:
        return (math.nan,) * 3
    return tuple(float(math.sqrt(v)) if v >= 0 else math.nan for v in np.diag(covariance))


def _checked_points(compute, reward) -> tuple[np.ndarray, np.ndarray]:
    """``compute`` and ``reward`` as float64 arrays, checked to be 1-D of one length, finite, compute ``>= 0``."""
    compute = np.asarray(compute, dtype=np.float64)
    reward = np.asarray(reward, dtype=np.float64)
    if compute.shape != reward.shape or compute.ndim != 1:
        raise ValueError(f"compute and reward must be 1-D of the same length, got {compute.shape} and {reward.shape}.")
    if not (np.isfinite(compute).all() and np.isfinite(reward).all()):
        raise ValueError("compute and reward must be finite.")
    if (compute < 0).any():
        raise ValueError("compute must be >= 0.")
    return compute, reward


def _asymptote_starts(points: np.ndarray, r0: float, a_max: float | None) -> tuple[float, ...]:
    """Three starting values of A's coordinate: the best point, half the points' span above it, and ``r0`` plus
    twice the best point's gain; with ``a_max``, the logits of 0.5, 0.8 and 0.95 of the way from ``r0`` to
    ``a_max``."""
    if a_max is None:
        span = points.max() - points.min()
        return (points.max(), points.max() + 0.5 * span, r0 + 2 * (points.max() - r0))
    return tuple(math.log(f / (1.0 - f)) for f in (0.5, 0.8, 0.95))


def _best_fit_over_starts(
    log_c: np.ndarray, points: np.ndarray, r0: float, use_scipy: bool, a_max: float | None = None
) -> tuple:
    """The lowest-cost ``(theta, cost)`` of the fits from a grid of 27 starting points (A, B, C_mid quantiles);
    ``(None, inf)`` when none converged."""
    best_theta, best_cost = None, math.inf
    for a0 in _asymptote_starts(points, r0, a_max):
        for b0 in (0.5, 1.0, 2.0):
            for q in (0.25, 0.5, 0.75):
                theta0 = np.array([a0, math.log(b0), float(np.quantile(log_c, q))])
                fitted_here = (_curve_fit if use_scipy else _levenberg_marquardt)(theta0, log_c, points, r0, a_max)
                if fitted_here is None:
                    continue
                theta, cost = fitted_here
                if cost < best_cost:
                    best_theta, best_cost = theta, cost
    return best_theta, best_cost


def _fitted_curve(
    theta: np.ndarray,
    cost: float,
    r0: float,
    a_max: float | None,
    compute: np.ndarray,
    points: np.ndarray,
    method: str,
) -> ComputeCurveFit:
    """The [`ComputeCurveFit`] of the optimiser's best ``theta`` over the fitted points (compute > 0)."""
    a, b, log_c_mid = _params(theta, r0, a_max)
    c_mid = math.exp(min(log_c_mid, 700.0))
    a_se, b_se, c_mid_se = _standard_errors(a, b, c_mid, r0, compute, points, cost)
    total = float(((points - points.mean()) ** 2).sum())
    return ComputeCurveFit(
        A=a,
        B=b,
        C_mid=c_mid,
        R0=r0,
        r_squared=1.0 - cost / total if total > 0 else float("nan"),
        rmse=math.sqrt(cost / points.size),
        num_points=int(points.size),
        A_stderr=a_se,
        B_stderr=b_se,
        C_mid_stderr=c_mid_se,
        method=method,
    )


def fit_compute_curve(
    compute: Sequence[float] | np.ndarray,
    reward: Sequence[float] | np.ndarray,
    r0: float | None = None,
    use_scipy: bool | None = None,
    a_max: float | None = None,
) -> ComputeCurveFit:
    """Fit ScaleRL's sigmoid ``R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)`` by least squares.

    Args:
        compute: compute at each point (any unit, e.g. generated + trained tokens), ``>= 0``.
        reward: the reward (or accuracy) measured at each point.
        r0: the reward before training. ``None`` takes the reward of the point with the least compute.
        use_scipy: ``None`` fits with ``scipy.optimize.curve_fit`` when scipy is installed, else with the built-in
            Levenberg-Marquardt; ``True`` requires scipy, ``False`` uses the built-in fit.
        a_max: an upper bound on ``A`` (``1.0`` for a pass rate or a binary reward), above ``r0``. A curve far from
            saturation leaves ``A`` unidentified, and an unbounded fit can put it anywhere above the data; ScaleRL
            fits pass rates, whose asymptote cannot exceed 1. ``None`` leaves ``A`` free.

    Returns:
        A [`ComputeCurveFit`] with ``A``, ``B``, ``C_mid``, their standard errors, ``R0``, the coefficient of
        determination ``r_squared`` and the root-mean-square error, over the points with ``compute > 0``.

    Raises:
        ValueError: lengths differ, fewer than 3 points with positive compute, negative or non-finite values,
            ``a_max`` not above ``r0``.
        ImportError: ``use_scipy=True`` without scipy.
    """
    scipy_installed = importlib.util.find_spec("scipy") is not None
    if use_scipy and not scipy_installed:
        raise ImportError('use_scipy=True needs scipy: pip install "trl-reasoning[scaling]".')
    use_scipy = scipy_installed if use_scipy is None else use_scipy
    compute, reward = _checked_points(compute, reward)
    if r0 is None:
        r0 = float(reward[np.argmin(compute)])
    fitted = compute > 0
    if fitted.sum() < 3:
        raise ValueError(f"Need at least 3 points with compute > 0 to fit A, B and C_mid, got {int(fitted.sum())}.")
    if a_max is not None and not (math.isfinite(a_max) and a_max > r0):
        raise ValueError(f"a_max must be a finite number above r0 = {r0:g}, got {a_max!r}.")
    log_c, points = np.log(compute[fitted]), reward[fitted]
    best_theta, best_cost = _best_fit_over_starts(log_c, points, r0, use_scipy, a_max)
    if best_theta is None:
        raise ValueError("The compute curve did not converge from any starting point.")
    method = "scipy.optimize.curve_fit" if use_scipy else "levenberg_marquardt"
    return _fitted_curve(best_theta, best_cost, float(r0), a_max, compute[fitted], points, method)
