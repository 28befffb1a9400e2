"""The stop rule of `--measure`'s interleaved rounds, and its racing (planning/measure.py).

The candidate with the lowest geometric-mean cost over the rounds is the best, the second lowest the
runner-up. The stop rule looks at them after rounds `look_rounds` (min_rounds, then x1.5: 5, 8, 12, 18,
27, ...) and after the last round: look k gets a paired Student-t interval of the per-round log ratio at
1 - 0.05 / (k (k + 1)) (alpha spending: the levels of all looks sum to 0.05, so "told apart" holds at
95% however many looks a run makes, where a 95% interval asked after every round would call two equal
plans told apart far more often: docs/findings.md). Rounds stop when
that interval excludes 1 (the best is told apart), when the budget would be passed by one more round (the
first round always runs), or at `max_rounds`.

Racing: at each look, a candidate whose paired interval against the current best lies wholly above 1 is
dropped from later rounds (`still_measured`: a Student-t interval of the per-round log ratio at
1 - alpha_k / m, alpha_k the look's level and m the candidates still measured besides the best, as irace's
t-test racing does; so all drops together spend 5%). The best and the runner-up are always among the
candidates measured in every round.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..core.intervals import geo_mean, paired_interval


def look_rounds(min_rounds: int, max_rounds: int) -> list[int]:
    """The rounds after which the stop rule looks: min_rounds, then each x1.5 (rounded up), up to max_rounds."""
    out = [min_rounds]
    while out[-1] < max_rounds:
        out.append(min(max_rounds, int(np.ceil(out[-1] * 1.5))))
    return out


def look_alpha(rounds: int, min_rounds: int, max_rounds: int, final: bool = False) -> float | None:
    """The stop rule's level at `rounds`: look k of `look_rounds` gets 0.05 / (k (k + 1)); `final` (the verdict
    after the last round) is the next look when `rounds` is not a scheduled one. None: no look there."""
    looks = look_rounds(min_rounds, max_rounds)
    if rounds in looks:
        k = looks.index(rounds) + 1
    elif final:
        k = sum(r <= rounds for r in looks) + 1
    else:
        return None
    return 0.05 / (k * (k + 1))


def t_interval(ours: np.ndarray, theirs: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """Paired ratio ours/theirs over the rounds both measured: geometric mean and Student-t (1 - alpha) interval."""
    return tuple(paired_interval(ours, theirs, level=1 - alpha))[:3]


def separation(round_costs: np.ndarray, alpha: float = 0.05) -> dict:
    """Best and runner-up of [R rounds, P candidates] costs, with their paired ratio and its Student-t (1 - alpha)
    interval; separated when it lies below 1.

    A NaN cost is a round the candidate was not measured in (dropped by racing); best and runner-up are
    taken among the candidates measured in the most rounds (with racing: in every round)."""
    round_costs = np.asarray(round_costs, np.float64)
    R, P = round_costs.shape
    geo, n = geo_mean(round_costs), np.isfinite(round_costs).sum(axis=0)
    full = np.flatnonzero(n == n.max())
    order = full[np.argsort(geo[full], kind="stable")]
    best = int(order[0])
    out = {"rounds": R, "geo_mean_ms": geo, "best": best, "runner_up": None, "separated": False,
           "ratio": float("nan"), "ci_lo": float("nan"), "ci_hi": float("nan"), "level": 1 - alpha}
    if P < 2:
        out["separated"] = True
        return out
    all_dropped = len(order) < 2  # every other candidate was dropped: each measured slower than the best
    ru = int(min((i for i in range(P) if i != best), key=lambda i: (-n[i], geo[i]))) if all_dropped else int(order[1])
    out["runner_up"] = ru
    if R >= 2:
        ratio, lo, hi = t_interval(round_costs[:, best], round_costs[:, ru], alpha)
        out.update(ratio=ratio, ci_lo=lo, ci_hi=hi, separated=all_dropped or bool(hi < 1.0))
    return out


def still_measured(round_costs: np.ndarray, min_rounds: int, alpha: float = 0.05) -> np.ndarray:
    """Racing: which of the [R, P] candidates the next round measures (bool [P]).

    Those measured in the last round, less any measured slower than the best of them (lowest geometric
    mean): the paired Student-t interval of log(cost / best cost) over the rounds, at 1 - alpha / m with
    m the number of others still measured (Bonferroni), lies wholly above 0. This is the elimination test
    of irace's `t-test-bonferroni` racing; a t interval rather than the percentile bootstrap because with a
    handful of rounds the bootstrap interval excludes 1 whenever every round falls on one side (4 rounds of
    two equal plans: one time in eight)."""
    round_costs = np.asarray(round_costs, np.float64)
    R, P = round_costs.shape
    keep = np.isfinite(round_costs[-1])
    idx = np.flatnonzero(keep)
    if R < max(min_rounds, 2) or len(idx) < 2:
        return keep
    best = int(idx[int(np.argmin(np.log(round_costs[:, idx]).mean(axis=0)))])  # survivors: measured every round
    others = [int(i) for i in idx if i != best]
    for i in others:
        if t_interval(round_costs[:, i], round_costs[:, best], alpha / len(others))[1] > 1.0:
            keep[i] = False
    return keep


@dataclass
class StopRule:
    """Stop after a round when the best is separated, the budget would be passed, or at max rounds."""

    deadline: float                 # time.time() at which the budget ends
    min_rounds: int
    max_rounds: int
    num_candidates: int | None = None  # columns of round_costs that are candidates (the rest: the drift reference)
    race: bool = False              # drop candidates measured slower than the best (`still_measured`)

    def __call__(self, round_costs: np.ndarray, last_round_s: float) -> bool:
        round_costs = np.asarray(round_costs)[:, :self.num_candidates]
        R = len(round_costs)
        if R >= self.max_rounds or time.time() + last_round_s > self.deadline:
            return True
        alpha = look_alpha(R, self.min_rounds, self.max_rounds)
        return alpha is not None and separation(round_costs, alpha)["separated"]

    def active(self, round_costs: np.ndarray) -> np.ndarray:
        """bool per candidate: measure it in the next round (all measured so far, unless racing drops some at a
        look, at that look's level: drops over all looks and candidates spend 5% in all)."""
        round_costs = np.asarray(round_costs, np.float64)[:, :self.num_candidates]
        alpha = look_alpha(len(round_costs), self.min_rounds, self.max_rounds)
        if not self.race or alpha is None:
            return np.isfinite(round_costs[-1])
        return still_measured(round_costs, self.min_rounds, alpha)
