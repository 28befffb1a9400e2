"""A plan's stated cost and 90% interval from how the same algorithm's plans measured on training tasks (issue 63).

A search keeps the plan its cost models rate lowest, so its plans measure dearer than the models say; the ensemble
members share that error, so their spread does not show it (docs/findings.md). What does show it is the same
algorithm's plans for other tasks, measured on the same machine in the same run. For each algorithm, over its
plans for the training tasks, r = measured cost / models' cost. A new plan of that algorithm is then stated as:

- cost: the models' cost x median(r);
- `level` interval: the models' cost x [r_(k), r_(n+1-k)], the k-th smallest and k-th largest of the n ratios, with
  k = floor((n + 1)(1 - level) / 2). This is a split-conformal interval: where the tasks are exchangeable, a new
  plan's measured cost falls inside with probability (n + 1 - 2k) / (n + 1), its nominal level, at least `level`
  (n = 20, level 0.9: k = 1, the smallest and largest ratio, 19/21 = 90.5%). With 13 to 18 plans (k = 0 by that
  rule, as when a search leaves 2 of 20 training tasks unplaced) the interval is still the smallest and largest
  ratio, of nominal level (n - 1) / (n + 1), 85.7% to 89.5%, which the file and the results say. Fewer plans give
  no interval, only the stated cost.

It holds while the machine measures as it did when the ratios were measured: `eval.py --ratio_tasks` (the
pipeline's step 6) measures the training tasks' plans in the same run, spread evenly among the test tasks' plans.

The file (`plan_ratios_<N>.json`, kind `neuroshard.plan_ratios`, written by `eval.py --plan_ratios_out`) is JSON,
every field checked on reading, with the SHA-256 of the cost-model files the ratios were measured against (ratios of
other models are refused) and a digest of what it says (`core.artifacts.content_digest`): a file changed after it was
saved is refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.artifacts import content_digest, file_digest, json_real, provenance, read_json, write_json
from ..core.errors import UserError

PLAN_RATIOS_KIND = "neuroshard.plan_ratios"
STATED_BY_RATIO = "training plans' ratio"  # the results' `stated_by` of a plan stated from its algorithm's ratio
RATIO_LEVEL = 0.9
MIN_NOMINAL_LEVEL = 0.85  # the smallest and largest ratio are stated as an interval only from this nominal level
MAX_RATIO = 1e3  # measured / modelled: far beyond any model worth stating an interval for
MODULE_RULE = "neuroshard/sharding/plan_ratios.py"


@dataclass(frozen=True)
class PlanRatio:
    """One algorithm's measured / modelled cost over its training plans: `plans` of them, their median, and the
    split-conformal interval's ends (None where too few plans give one)."""
    plans: int
    median: float
    lo: float | None
    hi: float | None

    def stated_ms(self, model_ms: float) -> float:
        return model_ms * self.median

    def interval_ms(self, model_ms: float) -> tuple[float, float] | None:
        return None if self.lo is None else (model_ms * self.lo, model_ms * self.hi)

    @property
    def nominal_level(self) -> float | None:
        """The interval's nominal level, (n + 1 - 2k) / (n + 1); None without an interval."""
        return None if self.lo is None else nominal_level(self.plans)


def _k(n: int, level: float) -> int:
    k = int(math.floor((n + 1) * (1 - level) / 2 + 1e-9))
    return 1 if k == 0 and n >= 2 and (n - 1) / (n + 1) >= MIN_NOMINAL_LEVEL else k


def nominal_level(n: int, level: float = RATIO_LEVEL) -> float:
    """The chance a new plan's ratio falls in [r_(k), r_(n+1-k)] of n exchangeable ones (module docstring)."""
    return (n + 1 - 2 * _k(n, level)) / (n + 1)


def conformal_ends(ratios, level: float = RATIO_LEVEL) -> tuple[float, float] | None:
    """The k-th smallest and k-th largest of `ratios` (k: module docstring); None when k = 0."""
    r = np.sort(np.asarray(ratios, np.float64))
    k = _k(len(r), level)
    return None if k < 1 else (float(r[k - 1]), float(r[len(r) - k]))


def fit_ratios(rows, level: float = RATIO_LEVEL) -> dict[str, PlanRatio]:
    """Each algorithm's `PlanRatio` over measured result rows (`alg`, `sim_cost_ms`, `cost_ms`; plans with either
    cost missing or not positive left out)."""
    by_alg: dict[str, list[float]] = {}
    for r in rows:
        sim, meas = float(r.get("sim_cost_ms", np.nan)), float(r.get("cost_ms", np.nan))
        if np.isfinite(sim) and np.isfinite(meas) and sim > 0 and meas > 0:
            by_alg.setdefault(r["alg"], []).append(meas / sim)
    out = {}
    for alg, ratios in by_alg.items():
        ends = conformal_ends(ratios, level)
        out[alg] = PlanRatio(len(ratios), float(np.median(ratios)), *(ends or (None, None)))
    return out


@dataclass(frozen=True)
class PlanRatios:
    """The ratios of every algorithm measured, for `num_devices` ranks, against the cost-model files whose SHA-256
    are `model_digests` (in the order `EvalConfig.models.paths` lists them)."""
    num_devices: int
    level: float
    model_digests: tuple[str, ...]
    ratios: dict[str, PlanRatio]

    @classmethod
    def fit(cls, rows, num_devices: int, model_paths, level: float = RATIO_LEVEL) -> "PlanRatios":
        return cls(num_devices, level, tuple(file_digest(p) for p in model_paths), fit_ratios(rows, level))

    def save(self, path, **made_with) -> Path:
        content = {"num_devices": self.num_devices, "level": self.level, "model_digests": list(self.model_digests),
                   "ratios": {a: {"plans": r.plans, "median": r.median, "lo": r.lo, "hi": r.hi}
                              for a, r in self.ratios.items()}}
        return write_json(path, {"kind": PLAN_RATIOS_KIND, **content, "digest": _digest(content),
                                 "provenance": provenance(**made_with)})

    @classmethod
    def load(cls, path, num_devices: int, model_paths, fix: str) -> "PlanRatios":
        """The ratios in `path`, every field checked, for `num_devices` ranks and the models in `model_paths`;
        anything else is one line naming the file and ending with `fix`."""
        obj = read_json(path, "plan ratios file", "plan ratios file", fix)

        def bad(what: str) -> UserError:
            return UserError(f"{path}: {what}; {fix}")

        if not isinstance(obj, dict) or obj.get("kind") != PLAN_RATIOS_KIND:
            raise bad(f"not a plan ratios file (kind {PLAN_RATIOS_KIND!r} expected)")
        N, level, digests, got = obj.get("num_devices"), obj.get("level"), obj.get("model_digests"), obj.get("ratios")
        if not _whole(N) or N != num_devices:
            raise bad(f"made for {_shown(N)} devices, not {num_devices}")
        if not json_real(level) or level != RATIO_LEVEL:
            raise bad(f"level must be {RATIO_LEVEL} (the results state 90% intervals), got {_shown(level)}")
        if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
            raise bad("model_digests must be a list of strings")
        if digests != [file_digest(p) for p in model_paths]:
            raise bad(f"measured against other cost models than {', '.join(map(str, model_paths))}")
        if not isinstance(got, dict) or not got:
            raise bad("ratios must be an object naming at least one algorithm")
        ratios = {}
        for alg, r in got.items():
            who = f"algorithm {alg[:40]!r}:"
            if not isinstance(r, dict):
                raise bad(f"{who} its ratio must be an object")
            n, med, lo, hi = r.get("plans"), r.get("median"), r.get("lo"), r.get("hi")
            if not _whole(n) or n < 1:
                raise bad(f"{who} plans must be a whole number from 1, got {_shown(n)}")
            for name, v in (("median", med), ("lo", lo), ("hi", hi)):
                if not (v is None and name != "median") and not (json_real(v) and 0 < v <= MAX_RATIO):
                    raise bad(f"{who} {name} must be a number above 0 and at most {MAX_RATIO:g}"
                              + ("" if name == "median" else " or null") + f", got {_shown(v)}")
            if (lo is None) != (hi is None) or (lo is not None and not lo <= med <= hi):
                raise bad(f"{who} lo <= median <= hi does not hold (or only one end is null)")
            if (lo is None) != (_k(n, RATIO_LEVEL) < 1):
                raise bad(f"{who} {n} plans give " + ("no interval, but lo and hi are set" if lo is not None else
                                                      "an interval, but lo and hi are null")
                          + f" (at least 13 give one: {MODULE_RULE})")
            ratios[alg] = PlanRatio(n, float(med), None if lo is None else float(lo), None if hi is None else float(hi))
        if obj.get("digest") != _digest(obj):  # every field well-formed, but changed after it was saved
            raise bad("changed after it was saved, or written before ratio files had a digest (what it holds does "
                      "not match its digest)")
        return cls(N, float(level), tuple(digests), ratios)


CONTENT = ("num_devices", "level", "model_digests", "ratios")  # what a ratio file's digest covers


def _digest(content: dict) -> str:
    return content_digest({k: content.get(k) for k in CONTENT})


def _shown(v) -> str:
    """A value as a line shows it: strings quoted (so "18" does not read as the number 18), at most 40 characters."""
    return (repr(v) if isinstance(v, str) else str(v))[:40]


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1 << 24
