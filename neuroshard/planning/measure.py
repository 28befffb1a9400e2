"""The measured-best plan (`tools/shard_tables.py --measure`, DESIGN.md §8: pre-train, calibrate, search, **verify**).

Candidates: NeuroShard's best distinct plans (`candidate_plans`, at least 3), every greedy heuristic's plan
and TorchRec's plan; identical plans are measured once under all their names. They are measured on the same
ranks in interleaved rounds (A B C ... A B C ..., each round every candidate with `warmup_iter` warm-ups and
`num_iter` timed iterations per rank, as eval.py does), on the user's ids (real with `--ids`, else
synthesised from rows, pooling and reuse histogram: `user_data.user_tables_dataset`), until the stop rule
(`stop_rule.py`) tells the best from the runner-up, the budget is spent, or racing has dropped the rest.
The chosen plan is the best by geometric mean, so it never measured worse than another candidate; when the
best cannot be told apart the result says so plainly. Every candidate's ratio to the best also gets a
bootstrap 95% interval (`core.intervals.paired_interval`, rounds as pairs).

What one round of a candidate is comes from the engine's step (`MeasureConfig.step`): the emulated devices
of the paper cost or of the step cost (`hardware.engine.EmulatedStep`, `EmulatedStepCost`), or TorchRec's own
training step (`hardware.dmp_step.DMPStep`). The step builds each candidate's item and the items of the
calibration's drift reference, and turns the reference's rounds into the machine's drift since calibrating;
this module never asks which step it is.

With a calibration, round r also measures its drift reference's item r mod G, in a shuffled place like every
plan, as one more item that is never a candidate. Every candidate then also gets its simulated cost net of
the drift (`simulated_drift_ms`), so a miss of the cost models can be told from a machine that changed speed.

The result also says where the best plan's step goes (`step_breakdown`): the share of it that is all-to-all
after its slowest device's compute, and how much a perfect balance of its shards' compute could save.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.config import (MEASURE_BUDGET_S, MEASURE_NUM_ITER, MEASURE_TOP, MEASURE_WARMUP_ITER, PAPER_COST, check_measure,
                           check_measure_engine)
from ..core.errors import check_int
from ..core.intervals import paired_interval
from ..core.tables import format_table
from ..core.costs import Cluster
from ..data.table_list import TableList
from ..data.tasks import ShardingTask
from ..hardware.dmp_step import DMPStep
from ..hardware.engine import EmulatedStep, EmulatedStepCost, EngineSettings, Job, Measured, Step, round_cost, run
from ..sharding.candidates import Candidate, candidate_plans  # noqa: F401 (candidate_plans: the API)
from ..sharding.simulator import check_cost
from ..sharding.torchrec_export import plan_spec
from .stop_rule import StopRule, look_alpha, separation
from .user_data import check_batch_divides, user_tables_dataset

# what one round of a candidate is, by --measure_engine and --cost
STEPS: dict[tuple[str, str], type[Step]] = {("emulated", "paper"): EmulatedStep, ("emulated", "step"): EmulatedStepCost,
                                            ("torchrec", "paper"): DMPStep, ("torchrec", "step"): DMPStep}
# where a calibration report keeps each step's drift reference
REFERENCE_IN: dict[type[Step], tuple[str, ...]] = {EmulatedStep: ("reference",), EmulatedStepCost: ("reference",),
                                                   DMPStep: ("measured", "dmp")}


@dataclass(frozen=True)
class MeasureConfig:
    budget_s: float = MEASURE_BUDGET_S
    warmup_iter: int = MEASURE_WARMUP_ITER
    num_iter: int = MEASURE_NUM_ITER  # timed iterations per candidate per round
    min_rounds: int = 5
    max_rounds: int = 200
    top_k: int = MEASURE_TOP     # NeuroShard candidates
    seed: int = 0
    mp_keep: float | None = None  # measure DCT-MP's compressed all-to-alls (None: uncompressed)
    race: bool = True            # drop a candidate measured slower than the best (stop_rule.py)
    engine: str = "emulated"     # "emulated": independent devices emulated; "torchrec": TorchRec's training step
    cost: str = PAPER_COST       # what the emulated engine measures: "paper" (compute + one forward and one
                                 # backward all-to-all) or "step" (per sharding group present, the input
                                 # distribution and both all-to-alls: `engine.StepPlan`), as the simulator prices it

    def check(self) -> "MeasureConfig":
        check_measure(self.budget_s, self.top_k, self.warmup_iter, self.num_iter)
        check_int("--min_rounds", self.min_rounds, 2, 10_000)
        check_int("--max_rounds", self.max_rounds, self.min_rounds, 100_000)
        check_measure_engine(self.engine, self.mp_keep)
        check_cost(self.cost)
        return self

    @property
    def step(self) -> type[Step]:
        """The engine's step: what one round of a candidate is."""
        return STEPS[(self.engine, self.cost)]


def drift_reference_of(step: type[Step], calibration: dict | None):
    """The drift reference `step` measures from a calibration report (None without one)."""
    found = calibration
    for key in REFERENCE_IN[step]:
        found = (found or {}).get(key)
    return found or None


def measure_candidates(tl: TableList, cluster: Cluster, candidates: list[Candidate], hw, batch_size: int,
                       cfg: MeasureConfig, ids_path=None, log=print, calibration: dict | None = None) -> dict:
    """Measure the candidates in interleaved rounds (module docstring); returns the result record. `calibration`:
    the report of the calibration the simulated costs come from, whose drift reference every round measures."""
    cfg.check()
    step = cfg.step
    step.check_available(cluster.num_devices)
    check_batch_divides(batch_size, cluster.num_devices)
    reference = drift_reference_of(step, calibration)
    t0 = time.time()
    stop = StopRule(t0 + cfg.budget_s, cfg.min_rounds, cfg.max_rounds, num_candidates=len(candidates), race=cfg.race)
    log_start(candidates, cfg, bool(reference), log)
    rounds = RoundLog(candidates, bool(reference), t0, log)
    with tempfile.TemporaryDirectory(prefix="neuroshard-measure-") as tmp:
        ds = user_tables_dataset(tl, batch_size, cfg.seed, Path(tmp), ids_path)
        task = ShardingTask.from_dataset(ds, np.arange(tl.task.num_tables), tl.task.dims)

        def spec_of(plan):
            return plan_spec(tl.names, tl.rows, tl.task.dims, plan)

        items = [step.item(task, c.plan, spec_of(c.plan)) for c in candidates]
        ref_items = step.reference_items(reference, task, cluster.num_devices, spec_of) if reference else None
        # a step that builds per plan builds again every `rebuild_every` rounds, so a build's offset is not the plan's
        engine = EngineSettings(str(ds.path), hw, batch_size, cfg.warmup_iter, cfg.num_iter, cfg.mp_keep, step=step,
                                rebuild_every=step.rebuild_every)
        run(Job(engine, [items], stop, ref_items), cluster.num_devices, rounds.on_round)
    drift = step.drift(reference, rounds.reference, cfg.seed) if reference and rounds.reference else None
    out = summarize(candidates, time.time() - t0, cfg, log, drift)
    return {**out, "round_end_s": rounds.end_s}


def log_start(candidates: list[Candidate], cfg: MeasureConfig, reference: bool, log) -> None:
    """The line that opens a measurement: what is measured, how, and until when."""
    log(f"measuring {len(candidates)} distinct candidate plans{cfg.step.describes} "
        f"({', '.join('/'.join(c.names) for c in candidates)}) in "
        f"interleaved rounds of {cfg.warmup_iter} warm-up + {cfg.num_iter} timed iterations, until the best is "
        f"told apart from the runner-up (paired t interval, 95% over all the stop rule's looks) or {cfg.budget_s:g} s"
        f"{'; a candidate measured slower than the best is dropped from later rounds' if cfg.race else ''}"
        f"{'; each round also measures the calibration drift reference' if reference else ''}")


class RoundLog:
    """Each round as rank 0 emits it: the candidates' costs kept on them, the reference's apart, one line."""

    def __init__(self, candidates: list[Candidate], reference: bool, t0: float, log):
        self.candidates, self.has_reference, self.t0, self.log = candidates, reference, t0, log
        self.reference: list[np.ndarray] = []  # the drift reference's parts, per round
        self.end_s: list[float] = []           # when each round's costs arrived, seconds from the start

    def on_round(self, g: int, r: int, costs) -> None:
        P = len(self.candidates)
        if self.has_reference:
            self.reference.append(np.asarray(costs[P], np.float64))
            costs = costs[:P]
        self.end_s.append(time.time() - self.t0)
        totals = [round(round_cost(c), 6) for c in costs]  # NaN: not measured (dropped)
        dropped = [c for c, t in zip(self.candidates, totals)
                   if np.isnan(t) and c.round_ms and not np.isnan(c.round_ms[-1])]
        for c, t, parts in zip(self.candidates, totals, costs):
            c.round_ms.append(t)
            c.round_parts_ms.append(np.asarray(parts, np.float64))
        best = int(np.nanargmin(totals))
        left = int(np.isfinite(totals).sum())
        self.log(f"  round {r + 1}: fastest {'/'.join(self.candidates[best].names)} {totals[best]:.3f} ms"
                 + (f"; {left} of {P} candidates measured" if left < P else "")
                 + (f" (dropped after round {r}, measured slower than the best: "
                    f"{', '.join('/'.join(c.names) for c in dropped)})" if dropped else ""))


def simulated_drift_ms(c: Candidate, drift: dict | None) -> float | None:
    """A candidate's simulated cost corrected for the machine's drift: TorchRec's engine scales the whole
    simulated step (with its step fit) by the step drift; the emulated engine scales the parts
    (`drift_corrected_ms`). None without a drift or a simulated cost."""
    if not drift:
        return None
    if "step" in drift:
        return None if c.simulated_ms is None else c.simulated_ms * drift["step"]["ratio"]
    return None if c.simulated_parts_ms is None else drift_corrected_ms(c.simulated_parts_ms, drift)


def reported_parts(simulated_parts_ms):
    """A candidate's simulated per-device parts as the record gives them: None where a part is below 0 (a model
    extrapolating; the device totals that rank the plans are above 0, `Cost.check`), so no negative cost is
    written."""
    if simulated_parts_ms is None or np.min(simulated_parts_ms) < 0:
        return None
    return simulated_parts_ms


def drift_corrected_ms(simulated_parts_ms, drift: dict) -> float:
    """A simulated plan's cost with compute scaled by the compute drift and both all-to-alls by the comm drift."""
    s = np.asarray(simulated_parts_ms, np.float64)
    return float((s[:, 0] * drift["compute"]["ratio"] + s[:, 1:].sum(axis=1) * drift["comm"]["ratio"]).max())


def step_breakdown(parts_ms) -> dict | None:
    """Where a measured plan's step goes, from its per-device [compute, fw, bw] ms (None without parts).

    step_ms: the slowest device's compute + forward + backward all-to-all (the plan's cost); comm_share: the
    part of the step that is not the slowest device's compute (the all-to-alls after it, and the waits);
    balance_headroom: (the slowest device's compute - the devices' mean compute) / step_ms, what a plan that
    spread these same shards' compute perfectly evenly would save if its all-to-alls cost the same. A sharding
    plan can move compute between devices; it cannot remove the all-to-alls, so when comm_share is high and
    balance_headroom is small, no plan of these tables is much faster than this one on this hardware."""
    if parts_ms is None:
        return None
    p = np.asarray(parts_ms, np.float64)
    if p.ndim != 2 or p.shape[1] != 3 or not np.isfinite(p).all() or not p[:, 1:].any():
        return None  # (no all-to-all parts: TorchRec's step is measured whole)
    step = float(p.sum(axis=1).max())
    compute = p[:, 0]
    return {"step_ms": step, "compute_max_ms": float(compute.max()), "compute_mean_ms": float(compute.mean()),
            "comm_share": float(1.0 - compute.max() / step) if step > 0 else float("nan"),
            "balance_headroom": float((compute.max() - compute.mean()) / step) if step > 0 else float("nan")}


def summarize(candidates: list[Candidate], elapsed_s: float, cfg: MeasureConfig, log=print,
              drift: dict | None = None) -> dict:
    """Best candidate, intervals against it, and the verdict, from the candidates' round costs."""
    R = min(len(c.round_ms) for c in candidates)
    costs = np.array([c.round_ms[:R] for c in candidates]).T  # [R, P]
    sep = separation(costs, look_alpha(R, cfg.min_rounds, cfg.max_rounds, final=True))
    best = sep["best"]
    rows = [candidate_row(c, costs[:, i], costs[:, best], R, cfg.seed, drift) for i, c in enumerate(candidates)]
    verdict = verdict_line(candidates, sep, R, elapsed_s, cfg.budget_s)
    log_drift(drift, log)
    log("\n" + "\n".join(format_candidates(rows)))
    log(verdict)
    names = "/".join(candidates[best].names)
    step = step_breakdown(rows[best]["measured_parts_ms"])
    if step is not None:
        log(f"where {names}'s step goes: {100 * step['comm_share']:.0f}% of it is all-to-all after its slowest "
            f"device's compute; its devices compute {step['compute_mean_ms']:.2f} ms on average and "
            f"{step['compute_max_ms']:.2f} ms at most, so balancing its shards' compute perfectly would save at most "
            f"{100 * step['balance_headroom']:.1f}% of the step if the all-to-alls cost the same")
    return {"best": candidates[best].names, "best_index": best, "separated": sep["separated"], "rounds": R,
            "ratio_to_runner_up": sep["ratio"], "ci_lo": sep["ci_lo"], "ci_hi": sep["ci_hi"],
            "ci_level": sep["level"], "verdict": verdict,
            "elapsed_s": elapsed_s, "budget_s": cfg.budget_s, "race": cfg.race, "engine": cfg.engine,
            "measured_cost": cfg.step.measured_cost,
            "rebuild_every": cfg.step.rebuild_every or None, "candidates": rows, "drift": drift,
            "step": step}


def candidate_row(c: Candidate, costs: np.ndarray, best_costs: np.ndarray, R: int, seed: int,
                  drift: dict | None) -> dict:
    """One candidate's record: its measured cost with its interval over rounds, its rounds, its parts, its
    simulated cost (and net of the drift) and its paired ratio to the best."""
    st = paired_interval(costs, best_costs, method="bootstrap", seed=seed) if R >= 2 else None
    m = Measured(costs, c.round_parts_ms[:R])
    parts = m.parts_ms.tolist() if len(c.round_parts_ms) >= R and m.parts_ms is not None else None
    measured = np.isfinite(costs)
    return {"names": c.names, "measured_ms": m.cost_ms, "measured_ci_ms": list(m.interval()),
            "rounds": int(measured.sum()),
            "median_round_ms": float(np.median(costs[measured])),
            "round_ms": [float(x) if ok else None for x, ok in zip(costs, measured)],
            "measured_parts_ms": parts, "simulated_parts_ms": reported_parts(c.simulated_parts_ms),
            "simulated_ms": c.simulated_ms,
            "predicted_90_ms": None if c.predicted_interval_ms is None else list(c.predicted_interval_ms),
            "simulated_drift_ms": simulated_drift_ms(c, drift),
            "ratio_to_best": st.estimate if st else float("nan"), "ci_lo": st.lo if st else float("nan"),
            "ci_hi": st.hi if st else float("nan")}


def verdict_line(candidates: list[Candidate], sep: dict, R: int, elapsed_s: float, budget_s: float) -> str:
    """What the rounds decided: the only candidate, the best told apart from the runner-up, or a tie."""
    names = "/".join(candidates[sep["best"]].names)
    level = f"{100 * sep['level']:.4g}%"
    if sep["runner_up"] is None:
        return f"{names} is the only candidate"
    runner_up = "/".join(candidates[sep["runner_up"]].names)
    if sep["separated"]:
        return (f"{names} is the measured best: {100 * (1 - sep['ratio']):.1f}% faster than the runner-up "
                f"{runner_up} (paired {level} interval of the ratio "
                f"[{sep['ci_lo']:.3f}, {sep['ci_hi']:.3f}], {R} rounds; 95% over all the stop rule's looks)")
    return (f"the top plans cannot be told apart: {names} measured lowest, but its ratio to the runner-up "
            f"{runner_up} is {sep['ratio']:.3f} with a paired {level} "
            f"interval [{sep['ci_lo']:.3f}, {sep['ci_hi']:.3f}] (95% over all the stop rule's looks) that "
            f"includes 1 after {R} rounds "
            f"({elapsed_s:.0f} s of a {budget_s:g} s budget); {names} is written as it never measured worse")


def log_drift(drift: dict | None, log) -> None:
    """The machine's drift since calibrating, as the drift reference measured it (nothing without one)."""
    if drift and "step" in drift:
        d = drift["step"]
        log(f"\nmachine drift since calibrating (the step-fit plans, one measured in every round): TorchRec's step "
            f"x{d['ratio']:.2f} [{d['ci_lo']:.2f}, {d['ci_hi']:.2f}]; the drift-corrected sim/meas scales the "
            "simulated step by it")
    elif drift:
        c, m = drift["compute"], drift["comm"]
        log(f"\nmachine drift since calibrating (the reference, measured in every round): compute x{c['ratio']:.2f} "
            f"[{c['ci_lo']:.2f}, {c['ci_hi']:.2f}], all-to-all x{m['ratio']:.2f} [{m['ci_lo']:.2f}, {m['ci_hi']:.2f}]"
            f"; the drift-corrected sim/meas scales the simulated parts by them")


def format_candidates(rows: list[dict]) -> list[str]:
    """The candidates as a text table, the best measured first (those measured in every round before those
    dropped earlier)."""
    drift = any(r.get("simulated_drift_ms") is not None for r in rows)
    spread = any(r.get("predicted_90_ms") is not None for r in rows)
    R = max((r.get("rounds", 0) for r in rows), default=0)
    cells = []
    for r in sorted(rows, key=lambda r: (-r.get("rounds", 0), r["measured_ms"])):
        sim, meas, d, pi = r["simulated_ms"], r["measured_ms"], r.get("simulated_drift_ms"), r.get("predicted_90_ms")
        cells.append(["/".join(r["names"])[:34], f"{meas:.3f}", "-" if sim is None else f"{sim:.3f}",
                      *(["-" if pi is None else f"[{pi[0]:.3f}, {pi[1]:.3f}]"] if spread else []),
                      "-" if sim is None else f"{sim / meas:.2f}",
                      *(["-" if sim is None or d is None else f"{d / meas:.2f}"] if drift else []),
                      f"{r['ratio_to_best']:.3f} [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]"
                      + (f"  (dropped after {r['rounds']} rounds)" if r.get("rounds", R) < R else "")])
    header = ["candidate", "measured ms", "simulated ms", *(["predicted 90%"] if spread else []), "sim/meas",
              *(["drift-corrected"] if drift else []), "ratio to best [95% CI]"]
    return format_table(header, cells, style="text", align="lrr" + "r" * spread + "r" + "r" * drift + "l")
