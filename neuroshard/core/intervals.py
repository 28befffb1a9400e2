"""The package's statistics: one paired-interval function, and the geometric mean over rounds.

`paired_interval(ours, theirs)`: pairs (tasks, rounds, seeds) where both are finite; on the log ratio
ours / theirs (`ratio=True`, reported back as a geometric-mean ratio) or on the difference ours - theirs
(`ratio=False`; `theirs=None`: the values themselves). The interval is scipy's: the Student-t interval
(`scipy.stats.t`, n - 1 degrees of freedom) or the percentile bootstrap (`scipy.stats.bootstrap`,
`paired=True`, pairs resampled with replacement, seeded). Every pair the same: the interval is that value; one
pair: the estimate, with no interval (NaN ends); none: NaN.

Used by the paired comparisons of the results (`experiments/paired.py`), the measurement engine's stop rule,
racing and ratio-to-best (`planning/measure.py`, `hardware/engine.py`) and the DCT benchmarks' tables
(`training/dct_results.py`).
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np

BOOTSTRAP = 10_000  # bootstrap resamples


class Interval(NamedTuple):
    estimate: float   # the mean difference, or the geometric-mean ratio
    lo: float
    hi: float
    n: int            # pairs used


def paired_interval(ours, theirs=None, *, level: float = 0.95, method: str = "t", ratio: bool = True,
                    seed: int = 0) -> Interval:
    """The paired estimate and its two-sided `level` interval (module docstring); `method` "t" or "bootstrap"."""
    a = np.asarray(ours, np.float64).ravel()
    b = np.zeros_like(a) if theirs is None else np.asarray(theirs, np.float64).ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    if ratio:
        ok &= (a > 0) & (b > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            a, b = np.log(np.where(ok, a, 1.0)), np.log(np.where(ok, b, 1.0))
    a, b = a[ok], b[ok]
    n = len(a)
    back = math.exp if ratio else float
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    m = float(np.mean(a - b))
    if n < 2:  # one pair shows no spread: no interval
        return Interval(back(m), math.nan, math.nan, n)
    if np.ptp(a - b) == 0:  # every pair the same (e.g. one plan against itself): the interval is that value
        return Interval(back(m), back(m), back(m), n)
    if method == "t":
        from scipy.stats import sem, t

        lo, hi = t.interval(level, n - 1, loc=m, scale=sem(a - b))
    elif method == "bootstrap":
        from scipy.stats import bootstrap

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = bootstrap((a, b), lambda x, y, axis: np.mean(x - y, axis=axis), paired=True, vectorized=True,
                            confidence_level=level, n_resamples=BOOTSTRAP, method="percentile",
                            random_state=np.random.default_rng(seed))
        lo, hi = res.confidence_interval
    else:
        raise ValueError(f"unknown interval method {method!r}")
    return Interval(back(m), back(float(lo)), back(float(hi)), n)


def geo_mean(values, axis: int = 0) -> np.ndarray:
    """Geometric mean along `axis` over the finite values (NaN: not measured); NaN where none is finite."""
    logs = np.log(np.asarray(values, np.float64))
    finite = np.isfinite(logs)
    n = finite.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.exp(np.where(finite, logs, 0.0).sum(axis=axis) / n)
