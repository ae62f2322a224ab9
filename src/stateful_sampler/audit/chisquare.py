"""Pearson's chi-square test of observed counts against target shares, without scipy.

scipy is only a dev extra, so the survival function is computed here: for k degrees of freedom,
P(X >= x) = Q(k/2, x/2), the regularised upper incomplete gamma function, by its power series
when x/2 < k/2 + 1 and by its continued fraction (modified Lentz) otherwise, the classical pair
that converges fast on each side (Numerical Recipes, 6.2). Accurate to about 1e-12 relative.
"""

from __future__ import annotations

import math

import numpy as np

_EPSILON = 1e-15
_TINY = 1e-300
_MAX_TERMS = 10_000


def chi_square(observed: np.ndarray, shares: np.ndarray) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of ``observed`` counts against target ``shares``.

    Classes with a zero target share count only if something was observed there (then p = 0);
    with fewer than two classes of positive target there is nothing to test (p = 1)."""
    total = float(observed.sum())
    expected = total * shares / shares.sum()
    possible = expected > 0
    if np.any(observed[~possible] > 0):
        return math.inf, int(np.count_nonzero(possible)) - 1, 0.0
    statistic = float(((observed[possible] - expected[possible]) ** 2 / expected[possible]).sum())
    freedom = int(np.count_nonzero(possible)) - 1
    return statistic, freedom, survival(statistic, freedom) if freedom > 0 and total > 0 else 1.0


def survival(statistic: float, freedom: int) -> float:
    """P(X >= statistic) for X chi-square distributed with ``freedom`` degrees of freedom."""
    if statistic <= 0:
        return 1.0
    return upper_gamma(freedom / 2.0, statistic / 2.0)


def upper_gamma(a: float, x: float) -> float:
    """Q(a, x) = Γ(a, x) / Γ(a) for a > 0, x >= 0."""
    if x <= 0:
        return 1.0
    if x < a + 1.0:
        return max(0.0, 1.0 - _lower_series(a, x))
    return _upper_fraction(a, x)


def _lower_series(a: float, x: float) -> float:
    """P(a, x) by its series: e^-x x^a / Γ(a+1) * Σ x^n / ((a+1)...(a+n))."""
    term = total = 1.0 / a
    denominator = a
    for _ in range(_MAX_TERMS):
        denominator += 1.0
        term *= x / denominator
        total += term
        if abs(term) < abs(total) * _EPSILON:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _upper_fraction(a: float, x: float) -> float:
    """Q(a, x) by its continued fraction, evaluated with the modified Lentz method."""
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    fraction = d
    for index in range(1, _MAX_TERMS):
        an = -index * (index - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        step = d * c
        fraction *= step
        if abs(step - 1.0) < _EPSILON:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * fraction
