"""Paired comparison of two algorithms on the tasks both solved.

For NeuroShard against another algorithm, per task both placed within memory: the cost ratio
r_i = cost_neuroshard / cost_other. Reported: the geometric mean of r_i, a percentile bootstrap 95%
confidence interval of it (`core.intervals.paired_interval`: scipy's bootstrap, tasks resampled with replacement, seeded), wins / ties / losses (a tie is
|r_i - 1| <= 1%), and the number of paired tasks. Valid counts are reported separately, since a task
only one algorithm solved says nothing about relative cost.
"""
from __future__ import annotations

import numpy as np

from ..core.intervals import paired_interval
from ..core.tables import format_table

TIE = 0.01


def paired(ours: dict[int, float], theirs: dict[int, float], seed: int = 0) -> dict:
    """{task: cost} of two algorithms (valid tasks only; a NaN cost is not valid) -> paired statistics."""
    tasks = sorted(set(ours) & set(theirs))
    a, b = np.array([ours[t] for t in tasks], np.float64), np.array([theirs[t] for t in tasks], np.float64)
    est = paired_interval(a, b, method="bootstrap", seed=seed)
    with np.errstate(invalid="ignore"):
        r = (a / b)[(a > 0) & (b > 0) & np.isfinite(a / b)]
    return {"n": est.n, "ratio": est.estimate, "ci_lo": est.lo, "ci_hi": est.hi,
            "wins": int((r < 1 - TIE).sum()), "ties": int((np.abs(r - 1) <= TIE).sum()),
            "losses": int((r > 1 + TIE).sum())}


def paired_table(rows: list[dict], cost_key: str, ours: str = "neuroshard") -> list[dict]:
    """Paired statistics of `ours` against every other algorithm in result rows."""
    costs: dict[str, dict[int, float]] = {}
    valid: dict[str, int] = {}
    for r in rows:
        ok = not r["oom"] and np.isfinite(r.get(cost_key, np.nan))
        valid[r["alg"]] = valid.get(r["alg"], 0) + int(ok)
        if ok:
            costs.setdefault(r["alg"], {})[int(r["task"])] = float(r[cost_key])
    if ours not in valid:
        return []
    out = []
    for alg in valid:
        if alg == ours:
            continue
        out.append({"vs": alg, **paired(costs.get(ours, {}), costs.get(alg, {})), "valid_ours": valid[ours],
                    "valid_theirs": valid[alg]})
    return out


def strongest(table: list[dict], min_tasks: int = 3) -> dict | None:
    """The best other algorithm: the one against which our paired ratio is highest (>= min_tasks pairs)."""
    cands = [t for t in table if t["n"] >= min_tasks]
    return max(cands, key=lambda t: t["ratio"]) if cands else None


def format_paired(table: list[dict], ours: str = "neuroshard") -> list[str]:
    return format_table([f"{ours} vs", "paired tasks", "geo-mean ratio", "95% CI", "wins / ties / losses",
                         "valid (ours / theirs)"],
                        [[t["vs"], t["n"], f"{t['ratio']:.3f}", f"[{t['ci_lo']:.3f}, {t['ci_hi']:.3f}]",
                          f"{t['wins']} / {t['ties']} / {t['losses']}", f"{t['valid_ours']} / {t['valid_theirs']}"]
                         for t in table], align="lrrrrr")
