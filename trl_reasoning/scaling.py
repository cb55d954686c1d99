"""ScaleRL's compute curve: fit a saturating sigmoid to reward-vs-compute points (no TRL import).

``R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)`` with ``A`` the asymptotic reward, ``B`` the scaling exponent
(compute efficiency) and ``C_mid`` the compute at which half of the gain ``A - R0`` is reached. ``R0`` is the reward
before training. Source: ScaleRL, "The Art of Scaling Reinforcement Learning Compute for LLMs", arXiv 2510.13786.
"""

from __future__ import annotations

import math
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

    def predict(self, compute: Sequence[float] | np.ndarray) -> np.ndarray:
        """``R(C)`` at each compute value (``R0`` at ``C = 0``)."""
        return _curve(np.asarray(compute, dtype=np.float64), self.A, self.B, self.C_mid, self.R0)


def _curve(compute: np.ndarray, a: float, b: float, c_mid: float, r0: float) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):
        ratio = np.exp(b * (math.log(c_mid) - np.log(np.where(compute > 0, compute, np.nan))))
    value = r0 + (a - r0) / (1.0 + ratio)
    return np.where(compute > 0, value, r0)


def _residuals(theta: np.ndarray, log_c: np.ndarray, reward: np.ndarray, r0: float) -> np.ndarray:
    a, log_b, log_c_mid = theta
    exponent = np.clip(math.exp(log_b) * (log_c_mid - log_c), -700.0, 700.0)
    return r0 + (a - r0) / (1.0 + np.exp(exponent)) - reward


def _levenberg_marquardt(theta, log_c, reward, r0, iterations=500):
    damping = 1e-3
    residual = _residuals(theta, log_c, reward, r0)
    cost = float(residual @ residual)
    for _ in range(iterations):
        jacobian = np.empty((log_c.size, theta.size))
        for j in range(theta.size):  # central differences: three parameters, cheap and robust
            step = 1e-6 * max(1.0, abs(theta[j]))
            up, down = theta.copy(), theta.copy()
            up[j] += step
            down[j] -= step
            jacobian[:, j] = (_residuals(up, log_c, reward, r0) - _residuals(down, log_c, reward, r0)) / (2 * step)
        normal = jacobian.T @ jacobian
        gradient = jacobian.T @ residual
        improved = False
        while damping < 1e12:
            delta = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient)
            candidate = theta + delta
            candidate_residual = _residuals(candidate, log_c, reward, r0)
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


def fit_compute_curve(
    compute: Sequence[float] | np.ndarray,
    reward: Sequence[float] | np.ndarray,
    r0: float | None = None,
) -> ComputeCurveFit:
    """Fit ScaleRL's sigmoid ``R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)`` by least squares.

    Args:
        compute: compute at each point (any unit, e.g. generated + trained tokens), ``>= 0``.
        reward: the reward (or accuracy) measured at each point.
        r0: the reward before training. ``None`` takes the reward of the point with the least compute.

    Returns:
        A [`ComputeCurveFit`] with ``A``, ``B``, ``C_mid``, ``R0``, the coefficient of determination ``r_squared`` and
        the root-mean-square error, over the points with ``compute > 0``.

    Raises:
        ValueError: lengths differ, fewer than 3 points with positive compute, negative or non-finite values.
    """
    compute = np.asarray(compute, dtype=np.float64)
    reward = np.asarray(reward, dtype=np.float64)
    if compute.shape != reward.shape or compute.ndim != 1:
        raise ValueError(f"compute and reward must be 1-D of the same length, got {compute.shape} and {reward.shape}.")
    if not (np.isfinite(compute).all() and np.isfinite(reward).all()):
        raise ValueError("compute and reward must be finite.")
    if (compute < 0).any():
        raise ValueError("compute must be >= 0.")
    if r0 is None:
        r0 = float(reward[np.argmin(compute)])
    fitted = compute > 0
    if fitted.sum() < 3:
        raise ValueError(f"Need at least 3 points with compute > 0 to fit A, B and C_mid, got {int(fitted.sum())}.")
    log_c, points = np.log(compute[fitted]), reward[fitted]

    best_theta, best_cost = None, math.inf
    span = points.max() - points.min()
    for a0 in (points.max(), points.max() + 0.5 * span, r0 + 2 * (points.max() - r0)):
        for b0 in (0.5, 1.0, 2.0):
            for q in (0.25, 0.5, 0.75):
                theta0 = np.array([a0, math.log(b0), float(np.quantile(log_c, q))])
                theta, cost = _levenberg_marquardt(theta0, log_c, points, r0)
                if cost < best_cost:
                    best_theta, best_cost = theta, cost
    a, log_b, log_c_mid = best_theta
    total = float(((points - points.mean()) ** 2).sum())
    return ComputeCurveFit(
        A=float(a),
        B=float(math.exp(log_b)),
        C_mid=float(math.exp(log_c_mid)),
        R0=float(r0),
        r_squared=1.0 - best_cost / total if total > 0 else float("nan"),
        rmse=math.sqrt(best_cost / points.size),
        num_points=int(points.size),
    )
