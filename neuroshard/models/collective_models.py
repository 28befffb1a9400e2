"""Costs of the collectives TorchRec's row-wise and data-parallel groups run (step 4c: `train_comm_cost_model.py
--collectives`), learned from collectives samples measured on the ranks (`collect_comm_cost_data.py --collectives`,
`hardware.comm_bench.Collectives`).

In these groups every rank moves the same amount: a row-wise group's reduce-scatter of pooled partial sums and the
all-gather of their gradients move the group's dim sum w (the same on every rank: each holds a row block of every
row-wise table), and a data-parallel group's all-reduce the gradient floats its ring sends (`simulator.comm_widths`).
So each collective's cost is a function of one width w (floats per sample of the global batch), fitted as a latency
and a cost per width, `ms = latency_ms + ms_per_width x w`, by least squares on relative error (a sample of 2 ms
counts as much as one of 200 ms). The fit uses 4 of every 5 samples; the fifth are held out and their median absolute
relative error is recorded beside the fit (`held_out_mape`). A linear fit extrapolates as the ring algorithms scale;
an MLP on one input would not.

The file is JSON (`comm_<N>_collectives.json`, kind `neuroshard.collective_costs`), read back with every field
checked: reading it runs no code.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.artifacts import json_real, read_json, write_json
from ..core.errors import UserError
from ..hardware.comm_bench import COLLECTIVES

COLLECTIVE_KIND = "neuroshard.collective_costs"
MAX_LATENCY_MS = 1e5     # far beyond any collective's fixed cost
MAX_MS_PER_WIDTH = 1e3   # ms per float per sample of the batch: far beyond any network's
LOAD_FIX = ("make it again with collect_comm_cost_data.py --collectives && train_comm_cost_model.py --collectives, "
            "or delete it (the step cost then prices these collectives by the all-to-all models)")


@dataclass(frozen=True)
class CollectiveCost:
    """One collective's fitted cost: `latency_ms + ms_per_width x w` for a width w > 0, nothing for w = 0."""

    latency_ms: float
    ms_per_width: float
    held_out_mape: float | None = None  # the fit's median absolute relative error on the held-out samples

    def predict_np(self, widths) -> np.ndarray:
        w = np.asarray(widths, np.float64)
        return np.where(w > 0, self.latency_ms + self.ms_per_width * w, 0.0)


@dataclass(frozen=True)
class CollectiveModels:
    """The three collectives' costs for `num_devices` ranks at global batch `batch_size` (`COLLECTIVES`)."""

    num_devices: int
    batch_size: int
    costs: dict[str, CollectiveCost]
    meta: dict

    def predict_np(self, name: str, widths) -> np.ndarray:
        return self.costs[name].predict_np(widths)

    def to_json(self) -> dict:
        return {"kind": COLLECTIVE_KIND, "num_devices": self.num_devices, "batch_size": self.batch_size,
                "collectives": {k: {"latency_ms": c.latency_ms, "ms_per_width": c.ms_per_width,
                                    "held_out_mape": c.held_out_mape} for k, c in self.costs.items()},
                "meta": self.meta}

    def save(self, path) -> Path:
        return write_json(path, self.to_json())

    @classmethod
    def load(cls, path) -> "CollectiveModels":
        """The costs in a `comm_<N>_collectives.json`, every field checked (`from_json`)."""
        return cls.from_json(read_json(path, "collectives cost file", "collectives cost file", LOAD_FIX), str(path))

    @classmethod
    def from_json(cls, obj, where: str, fix: str = LOAD_FIX) -> "CollectiveModels":
        """`to_json`'s inverse; anything else is one line naming `where` and ending with `fix`."""
        def bad(what: str) -> UserError:
            return UserError(f"{where}: {what}; {fix}")

        if not isinstance(obj, dict) or obj.get("kind") != COLLECTIVE_KIND:
            raise bad(f"not a collectives cost file (kind {COLLECTIVE_KIND!r} expected)")
        N, B = obj.get("num_devices"), obj.get("batch_size")
        for name, v, lo in (("num_devices", N, 2), ("batch_size", B, 1)):
            if not (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= 1 << 24):
                raise bad(f"{name} must be a whole number from {lo}, got {repr(v)[:40]}")
        got, meta = obj.get("collectives"), obj.get("meta")
        if not isinstance(got, dict) or sorted(got) != sorted(COLLECTIVES):
            raise bad(f"collectives must hold exactly {', '.join(COLLECTIVES)}")
        if not isinstance(meta, dict):
            raise bad("meta must be an object")
        if meta.get("batch_size", B) != B:  # the batch the other models are checked against is meta's
            raise bad(f"batch_size {B} but meta.batch_size {str(meta.get('batch_size'))[:40]}")
        costs = {}
        for name in COLLECTIVES:
            c = got[name]
            if not isinstance(c, dict):
                raise bad(f"{name} must be an object")
            a, b, m = c.get("latency_ms"), c.get("ms_per_width"), c.get("held_out_mape")
            for field, v, top in (("latency_ms", a, MAX_LATENCY_MS), ("ms_per_width", b, MAX_MS_PER_WIDTH)):
                if not json_real(v) or not 0 <= v <= top:
                    raise bad(f"{name}'s {field} must be a number from 0 to {top:g}, got {repr(v)[:40]}")
            if m is not None and (not json_real(m) or m < 0):
                raise bad(f"{name}'s held_out_mape must be a number from 0 or null, got {repr(m)[:40]}")
            costs[name] = CollectiveCost(float(a), float(b), None if m is None else float(m))
        return cls(N, B, costs, meta)


def fit_collective(widths, ms) -> CollectiveCost:
    """`ms = latency + ms_per_width x w` by least squares on relative error, on 4 of every 5 samples (both
    coefficients kept >= 0), with its median absolute relative error on the fifth."""
    w, y = np.asarray(widths, np.float64), np.asarray(ms, np.float64)
    held = np.arange(len(w)) % 5 == 4
    fit = relative_fit(w[~held], y[~held])
    pred = fit.predict_np(w[held])
    mape = float(np.median(np.abs(pred - y[held]) / y[held])) if held.any() else None
    return CollectiveCost(fit.latency_ms, fit.ms_per_width, mape)


def relative_fit(w: np.ndarray, y: np.ndarray) -> CollectiveCost:
    """`ms = latency + ms_per_width x w` by least squares on relative error, both coefficients kept >= 0."""
    X = np.stack([np.ones_like(w), w], axis=1) / y[:, None]
    (a, b), *_ = np.linalg.lstsq(X, np.ones_like(y), rcond=None)
    if a < 0:  # no fixed part: through the origin
        a, b = 0.0, float(np.sum(w / y) / np.sum((w / y) ** 2))
    elif b < 0:  # no part growing with width: a constant
        a, b = float(np.sum(1 / y) / np.sum(1 / y ** 2)), 0.0
    return CollectiveCost(float(a), float(b))
