"""The small types that flow between the pipeline's stages.

- `Cluster`: the devices a plan is for (count and memory per device, GB).
- `Cost`: per-device compute, forward and backward all-to-all costs (ms) of one plan, simulated or
  measured alike; the plan's cost is the slowest device's total (times a `StepFit`'s scale, plus its overhead).
- `StepFit`: the step cost fitted to TorchRec training steps measured on the user's ranks (scale and a fixed
  per-step overhead, ms), made by `--calibrate_dmp`.
- `MEM_TOL_GB`: the one tolerance every memory check uses.
- `check_max_mem_gb`: the one range check of `--max_mem` (GB per device), up to `MAX_DEVICE_MEM_GB`.
- `implausible_ms`: the one check of a cost (ms) before it is printed or written as a result: finite, not
  negative (positive where asked) and at most `MAX_PLAUSIBLE_MS`; `Cost.check` raises `ImplausibleCost` for a
  predicted plan cost that fails it, and each surface (shard_tables, NeuroShardPlanner) words the line.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import UserError, check_float, check_int

MEM_TOL_GB = 1e-9
MAX_DEVICE_MEM_GB = 1e6  # a petabyte per device: beyond any device, and still a whole number of bytes (TorchRec)
MAX_PLAUSIBLE_MS = 1e6  # 1,000 s for one batch on one device: beyond any step this project measures or predicts
MIN_STEP_SCALE, MAX_STEP_SCALE = 1e-3, 1e3  # a StepFit's scale: measured steps within 1000x of the models
COST_DECIMALS = 6  # costs are rounded to 1 ns so that equal sums compare equal whatever the order


def round_ms(x):
    return np.round(x, COST_DECIMALS)


def implausible_ms(values, positive: bool = False) -> str | None:
    """Why these costs (ms, any shape) cannot be true, in a few words, or None when they can: each finite, not
    negative (with `positive`: above 0) and at most MAX_PLAUSIBLE_MS."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        return "no costs"
    if not np.isfinite(v).all():
        return f"{v[~np.isfinite(v)][0]} ms"
    low = v.min()
    if low < 0 or (positive and low == 0):
        return f"{low:g} ms, not above 0" if positive else f"{low:g} ms, a negative cost"
    if v.max() > MAX_PLAUSIBLE_MS:
        return f"{v.max():g} ms, more than {MAX_PLAUSIBLE_MS:g} ms"
    return None


class ImplausibleCost(UserError):
    """A predicted cost that cannot be true (`Cost.check`), raised where it is found. The caller that knows which
    models predicted it and how to fix them words the one line (`line`); uncaught, the line says the same in
    general words."""

    def __init__(self, part: str, why: str, plan: str = "this plan"):
        self.part, self.why, self.plan = part, why, plan
        super().__init__(self.line("the cost models", "retrain them on more cost data or calibrate them to these "
                                                      "tables"))

    def line(self, models: str, fix: str) -> str:
        return f"{models} predict a {self.part} cost that cannot be true ({self.why}) for {self.plan}; {fix}"


def check_max_mem_gb(value) -> float:
    """`--max_mem` (GB per device) as a float in (0, MAX_DEVICE_MEM_GB], else a `UserError` naming the flag."""
    return check_float("--max_mem", value, 0.0, MAX_DEVICE_MEM_GB, lo_open=True)


@dataclass(frozen=True)
class Cluster:
    num_devices: int
    max_mem_gb: float

    def __post_init__(self):
        check_int("--ndevices", self.num_devices, 1, 4096)
        check_max_mem_gb(self.max_mem_gb)

    def fits(self, mem_gb) -> np.ndarray | bool:
        """Whether memory use (GB, any shape) is within a device's capacity."""
        return np.asarray(mem_gb) <= self.max_mem_gb + MEM_TOL_GB

    def need_peers(self) -> "Cluster":
        if self.num_devices < 2:
            raise UserError("--ndevices must be >= 2 (an all-to-all needs peers)")
        return self


@dataclass(frozen=True)
class StepFit:
    """A simulated step cost fitted to measured TorchRec training steps (`DistributedModelParallel`):
    step_ms = scale x (the slowest device's compute + all-to-alls) + overhead_ms. scale: how much longer the
    measured step's compute and collectives take than the models' (ranks sharing cores, TorchRec's kernels);
    overhead_ms: what every step pays whatever the plan (the sharded module's forward and backward outside the
    lookups and collectives, the optimizer's fused update's fixed part). Made by `planning.calibrate` with
    `--calibrate_dmp P`; checked on load, so a damaged file cannot make plans free or negative."""

    scale: float
    overhead_ms: float

    def __post_init__(self):
        for name, v, lo, hi in (("scale", self.scale, MIN_STEP_SCALE, MAX_STEP_SCALE),
                                ("overhead_ms", self.overhead_ms, 0.0, MAX_PLAUSIBLE_MS)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:  # nan fails too
                raise UserError(f"a step fit's {name} must be a number from {lo:g} to {hi:g}, got {v!r}")

    def apply(self, ms):
        """Simulated step costs (ms, any shape) -> the fitted ones."""
        return ms * self.scale + self.overhead_ms

    def to_dict(self) -> dict:
        return {"scale": float(self.scale), "overhead_ms": float(self.overhead_ms)}


@dataclass
class Cost:
    """Per-device costs of one plan (ms). `per_device_ms` = compute + bw + fw, through `step_fit` when the
    plan's cost is a fitted step cost; `cost_ms` its max. The parts stay the models' own predictions."""

    compute_ms: np.ndarray
    fw_ms: np.ndarray
    bw_ms: np.ndarray
    step_fit: StepFit | None = None

    def implausible(self, negative_parts: bool = False) -> tuple[str, str] | None:
        """(part, why) of the first part that cannot be true (`implausible_ms`): compute, the forward and backward
        all-to-alls, then each device's total, which must be above 0; None when all can be. With
        `negative_parts`, a part below zero passes and the total is not checked (a simulator's raw prediction)."""
        for part, values in (("compute", self.compute_ms), ("forward all-to-all", self.fw_ms),
                             ("backward all-to-all", self.bw_ms)):
            why = implausible_ms(np.abs(values) if negative_parts else values)
            if why:
                return part, why
        why = None if negative_parts else implausible_ms(self.per_device_ms, positive=True)
        return ("total", why) if why else None

    def check(self, plan: str = "this plan", negative_parts: bool = False) -> "Cost":
        """This cost, or `ImplausibleCost` naming its first part that cannot be true (`implausible`) and `plan`.
        With `negative_parts` (a candidate's raw prediction, compared but not handed out), a part may dip below 0;
        each device's total must still be above 0."""
        found = self.implausible(negative_parts)
        total = implausible_ms(self.per_device_ms, positive=True) if negative_parts and not found else None
        found = found or (("total", total) if total else None)
        if found:
            raise ImplausibleCost(*found, plan)
        return self

    @property
    def per_device_ms(self) -> np.ndarray:
        parts = np.asarray(self.compute_ms) + np.asarray(self.bw_ms) + np.asarray(self.fw_ms)
        return parts if self.step_fit is None else self.step_fit.apply(parts)

    @property
    def cost_ms(self) -> float:
        return float(round_ms(self.per_device_ms.max()))

    @property
    def critical_device(self) -> int:
        return int(np.argmax(self.per_device_ms))
