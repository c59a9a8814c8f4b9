"""Repeat statistics for the summary tables and figures, standard library only (no scipy in the pipeline image).

- `mean_ci(values)`: mean and 95% confidence interval with Student's t on n-1 degrees of freedom.
  n = 1 gives the mean and a NaN half-width (no interval from one repeat); n = 0 gives NaN everywhere.
- `welch(a, b)`: Welch's unequal-variance t-test (two-sided p-value).
- `compare(a, b)`: whether two strategies' repeats of one metric are distinguishable: Welch p < alpha, with the
  CI overlap reported next to it (non-overlapping 95% CIs imply a difference; overlapping ones do not imply none).

The t distribution comes from the regularised incomplete beta function (continued fraction, Lentz's method),
inverted by bisection: exact to ~1e-10, which is far below anything a table prints.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

CONFIDENCE = 0.95
ALPHA = 0.05


# ---------------------------------------------------------------- Student t distribution
def _beta_continued_fraction(a: float, b: float, x: float, iterations: int = 300, eps: float = 1e-15) -> float:
    """Continued fraction of the incomplete beta function, evaluated with the modified Lentz method."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, iterations + 1):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < eps:
            break
    return result


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_sf(t: float, dof: float) -> float:
    """Upper tail P(T > t) of Student's t with `dof` (may be fractional) degrees of freedom."""
    tail = 0.5 * regularized_beta(dof / 2.0, 0.5, dof / (dof + t * t))
    return tail if t >= 0 else 1.0 - tail


@lru_cache(maxsize=1024)
def t_quantile(q: float, dof: float) -> float:
    """The q-quantile of Student's t, e.g. t_quantile(0.975, 4) = 2.7764."""
    if not 0.0 < q < 1.0 or not dof > 0:
        raise ValueError(f"t_quantile needs 0 < q < 1 and dof > 0, got q={q}, dof={dof}")
    if q < 0.5:
        return -t_quantile(1.0 - q, dof)
    target = 1.0 - q
    lo, hi = 0.0, 1.0
    while t_sf(hi, dof) > target:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_sf(mid, dof) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# ---------------------------------------------------------------- mean and confidence interval
@dataclass(frozen=True)
class MeanCI:
    """Mean of the finite values, the half-width of the confidence interval, and the interval itself."""

    n: int
    mean: float
    sd: float
    half_width: float
    confidence: float = CONFIDENCE

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def within(diff, tol: float) -> bool:
    """A difference within a tolerance, inclusively: one equal to the tolerance passes whatever the float rounding
    (verify's tolerances, the zero0-vs-ddp consistency check)."""
    return diff is not None and abs(diff) <= tol * (1 + 1e-9) + 1e-12


def finite(values: Iterable) -> list[float]:
    """The values that are real numbers (None, NaN, inf and non-numbers dropped)."""
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return out


def mean_ci(values: Iterable, confidence: float = CONFIDENCE) -> MeanCI:
    """Mean ± t_{(1+c)/2, n-1} · s/√n over the finite values; half-width NaN when n < 2."""
    xs = finite(values)
    n = len(xs)
    if n == 0:
        return MeanCI(0, math.nan, math.nan, math.nan, confidence)
    mean = statistics.fmean(xs)
    if n == 1:
        return MeanCI(1, mean, math.nan, math.nan, confidence)
    sd = statistics.stdev(xs)
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * sd / math.sqrt(n)
    return MeanCI(n, mean, sd, half, confidence)


# ---------------------------------------------------------------- two-sample comparison
@dataclass(frozen=True)
class Welch:
    t: float
    dof: float
    p: float


def welch(a: Iterable, b: Iterable) -> Welch:
    """Welch's two-sided t-test; NaN when either side has fewer than two values."""
    xa, xb = finite(a), finite(b)
    if len(xa) < 2 or len(xb) < 2:
        return Welch(math.nan, math.nan, math.nan)
    va, vb = statistics.variance(xa) / len(xa), statistics.variance(xb) / len(xb)
    diff = statistics.fmean(xa) - statistics.fmean(xb)
    if va + vb == 0.0:  # both sides constant: identical or certainly different
        return Welch(0.0 if diff == 0 else math.copysign(math.inf, diff), math.nan, 1.0 if diff == 0 else 0.0)
    t = diff / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (len(xa) - 1) + vb ** 2 / (len(xb) - 1))
    return Welch(t, dof, min(1.0, 2.0 * t_sf(abs(t), dof)))


def ci_overlap(a: MeanCI, b: MeanCI) -> bool | None:
    """Whether two confidence intervals overlap; None when either has no interval."""
    if not (math.isfinite(a.half_width) and math.isfinite(b.half_width)):
        return None
    return a.low <= b.high and b.low <= a.high


@dataclass(frozen=True)
class Comparison:
    """`distinguishable` is None when it cannot be tested (fewer than two repeats on a side)."""

    distinguishable: bool | None
    p: float
    ci_overlap: bool | None
    a: MeanCI
    b: MeanCI


def compare(a: Iterable, b: Iterable, alpha: float = ALPHA) -> Comparison:
    """Are the two samples distinguishable? Welch p < alpha says yes; p >= alpha says no."""
    xa, xb = finite(a), finite(b)
    ca, cb = mean_ci(xa, 1.0 - alpha), mean_ci(xb, 1.0 - alpha)
    test = welch(xa, xb)
    verdict = None if math.isnan(test.p) else bool(test.p < alpha)
    return Comparison(verdict, test.p, ci_overlap(ca, cb), ca, cb)
