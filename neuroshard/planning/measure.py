"""The measured-best plan (`tools/shard_tables.py --measure`, DESIGN.md §8: pre-train, calibrate, search, **verify**).

Candidates: NeuroShard's best distinct plans (`neuroshard_top_plans`, at least 3), every greedy
heuristic's plan and TorchRec's plan; identical plans are measured once under all their names.
They are measured on the same ranks in interleaved rounds (A B C ... A B C ..., each round every
candidate with `warmup_iter` warm-ups and `num_iter` timed iterations per rank, as eval.py does),
on the user's ids (real with `--ids`, else synthesised from rows, pooling and reuse histogram).

The candidate with the lowest geometric-mean cost over the rounds is the best, the second lowest the
runner-up. The stop rule looks at them after rounds `look_rounds` (min_rounds, then x1.5: 5, 8, 12, 18,
27, ...) and after the last round: look k gets a paired Student-t interval of the per-round log ratio at
1 - 0.05 / (k (k + 1)) (alpha spending: the levels of all looks sum to 0.05, so "told apart" holds at
95% however many looks a run makes; asking a 95% interval after every round called two equal plans told
apart 38% of the time by round 30: benchmarks/stop_rule_equal_plans.py). Rounds stop when that interval
excludes 1 (the best is told apart), when `budget_s` (from the start, process start-up included) would
be passed by one more round (the first round always runs), or at `max_rounds`. The chosen plan is the
best by geometric mean, so it never measured worse than another candidate; when the interval still
includes 1 the result says plainly that the top plans cannot be told apart. Every candidate's ratio to
the best also gets a bootstrap 95% interval (`core.stats.paired_interval`, rounds as pairs), a description of that one
comparison.

Racing (`race`, the default): at each of the stop rule's looks, a candidate whose paired interval
against the current best lies wholly above 1 is dropped from later rounds (`still_measured`: a Student-t
interval of the per-round log ratio at 1 - alpha_k / m, alpha_k the look's level and m the candidates
still measured besides the best, as irace's t-test racing does; so all drops together spend 5%). A
dropped candidate measured slower than the best, with confidence, on the rounds both ran; its cost and
intervals are from the rounds it was measured in (NaN in the rest), and the rounds that follow spend
their time on the plans that are still close (replayed on the real table sets' rounds, racing measured
for 76-100% of the time that measuring every candidate takes; README). The best and the runner-up are
always among the candidates measured in every round.

The result also says where the best plan's step goes (`step_breakdown`): the share of it that is all-to-all
after its slowest device's compute, and how much a perfect balance of its shards' compute could save. On the
real table sets here the one-hot sets' steps are 65-81% all-to-all with 0.9-2.4% to gain from balance (README), so
their top plans measure within a few per cent of each other and of TorchRec's.

With a calibration's drift `reference` (`calibrate.drift_reference`: the held-out calibration shards in
groups of one per rank, their compute and backward all-to-all as measured when calibrating), round r also
measures group r mod G, in a shuffled place like every plan, as one more plan that is never a candidate.
The machine's drift since calibrating is the geometric mean over rounds of (the group's compute now / then)
and of (its backward all-to-all now / then), each with a 95% interval over rounds (so the more rounds, the
more of the held-out shards it covers); every candidate also gets its simulated cost
with the simulated compute scaled by the first and both all-to-alls by the second
(`simulated_drift_ms`), so a miss of the cost models can be told from a machine that changed speed. In TorchRec's
engine the reference is a calibration's step-fit plans (`--calibrate_dmp`, `dmp_reference`), plan r mod G in round
r, and the drift is TorchRec's step now / then (`dmp_drift`), which scales the whole simulated step.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.config import (MEASURE_BUDGET_S, MEASURE_NUM_ITER, MEASURE_TOP, MEASURE_WARMUP_ITER, check_measure,
                           check_measure_engine)
from ..core.errors import UserError, check_int
from ..sharding.simulator import check_cost
from ..core.types import Cluster
from ..core.stats import geo_mean, paired_interval
from ..core.tables import format_table
from ..hardware.dmp_step import REBUILD_EVERY
from ..hardware.engine import Measured, round_cost
from ..sharding.candidates import Candidate, candidate_plans, simulated_parts  # noqa: F401 (the API)


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
    race: bool = True            # drop a candidate measured slower than the best (module docstring)
    engine: str = "emulated"     # "emulated": independent devices emulated; "torchrec": TorchRec's training step
    cost: str = "paper"          # what the emulated engine measures: "paper" (compute + one forward and one
                                 # backward all-to-all) or "step" (per sharding group present, the input
                                 # distribution and both all-to-alls: `engine.StepPlan`), as the simulator prices it

    def check(self) -> "MeasureConfig":
        check_measure(self.budget_s, self.top_k, self.warmup_iter, self.num_iter)
        check_int("--min_rounds", self.min_rounds, 2, 10_000)
        check_int("--max_rounds", self.max_rounds, self.min_rounds, 100_000)
        check_measure_engine(self.engine, self.mp_keep)
        check_cost(self.cost)
        return self




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


def measure_candidates(tl, cluster: Cluster, candidates: list[Candidate], hw, batch_size: int, cfg: MeasureConfig,
                       ids_path=None, log=print, reference: list[dict] | None = None,
                       dmp_reference: dict | None = None) -> dict:
    """Measure the candidates in interleaved rounds (module docstring); returns the result record. `reference`:
    the emulated engine's drift reference; `dmp_reference`: the TorchRec engine's (a calibration's step-fit plans
    and their measured steps, `measured["dmp"]`)."""
    from ..data.tasks import ShardingTask
    from ..hardware.engine import EngineSettings, Job, plan_device_tables, plan_step_item, run
    from .calibrate import user_tables_dataset

    cfg.check()
    dmp = cfg.engine == "torchrec"
    if dmp:
        from ..core.optional_deps import require_torchrec

        require_torchrec()  # one line when TorchRec is missing
        reference = dmp_reference  # the step-fit plans, measured as TorchRec steps when calibrating
    if not dmp and cfg.cost == "step" and cluster.num_devices > 1:
        from ..hardware.comm_bench import torchrec_available

        if not torchrec_available():
            raise UserError("--measure of the step cost times TorchRec's input distribution (its KJTAllToAll), and "
                            "torchrec is not installed; install it (make setup installs torchrec 1.9.2) or pass "
                            "--cost paper")
    check_batch_divides(batch_size, cluster.num_devices)
    t0 = time.time()
    P = len(candidates)
    stop = StopRule(t0 + cfg.budget_s, cfg.min_rounds, cfg.max_rounds, num_candidates=P, race=cfg.race)
    how = (" as TorchRec training steps (DistributedModelParallel)" if dmp else
           " as the step cost prices them (per sharding group the input distribution and both all-to-alls)"
           if cfg.cost == "step" else "")
    log(f"measuring {P} distinct candidate plans{how} ({', '.join('/'.join(c.names) for c in candidates)}) in "
        f"interleaved rounds of {cfg.warmup_iter} warm-up + {cfg.num_iter} timed iterations, until the best is "
        f"told apart from the runner-up (paired t interval, 95% over all the stop rule's looks) or {cfg.budget_s:g} s"
        f"{'; a candidate measured slower than the best is dropped from later rounds' if cfg.race else ''}"
        f"{'; each round also measures the calibration drift reference' if reference else ''}")
    rounds: list[np.ndarray] = []
    ref_rounds: list[np.ndarray] = []
    round_end_s: list[float] = []  # when each round's costs arrived, seconds from the start
    with tempfile.TemporaryDirectory(prefix="neuroshard-measure-") as tmp:
        ds = user_tables_dataset(tl, batch_size, cfg.seed, Path(tmp), ids_path)
        task = ShardingTask.from_dataset(ds, np.arange(tl.task.num_tables), tl.task.dims)
        if dmp:
            from ..hardware.dmp_step import TorchRecItem

            plans = [TorchRecItem.of_plan(tl, task, c.plan) for c in candidates]
        elif cfg.cost == "step":
            plans = [plan_step_item(task, c.plan) for c in candidates]
        else:
            plans = [plan_device_tables(task, c.plan) for c in candidates]
        if dmp and reference:
            ref_plans = [TorchRecItem.of_plan(tl, task, p)
                         for p in dmp_reference_plans(reference, task, cluster.num_devices)]
        else:
            ref_plans = [[[(int(task.table_ids[t]), int(d)) for t, d in dev] for dev in g["devices"]]
                         for g in reference] if reference else None

        def on_round(g, r, costs):
            if reference:
                ref_rounds.append(np.asarray(costs[P], np.float64))
                costs = costs[:P]
            rounds.append(costs)
            round_end_s.append(time.time() - t0)
            totals = [round(round_cost(c), 6) for c in costs]  # NaN: not measured (dropped)
            dropped = [c for c, t in zip(candidates, totals) if np.isnan(t) and c.round_ms and not np.isnan(c.round_ms[-1])]
            for c, t, parts in zip(candidates, totals, costs):
                c.round_ms.append(t)
                c.round_parts_ms.append(np.asarray(parts, np.float64))
            best = int(np.nanargmin(totals))
            left = int(np.isfinite(totals).sum())
            log(f"  round {r + 1}: fastest {'/'.join(candidates[best].names)} {totals[best]:.3f} ms"
                + (f"; {left} of {P} candidates measured" if left < P else "")
                + (f" (dropped after round {r}, measured slower than the best: "
                   f"{', '.join('/'.join(c.names) for c in dropped)})" if dropped else ""))

        step = None
        if dmp:  # each plan built again every round (REBUILD_EVERY), so a build's offset is not taken for the plan's
            from ..hardware.dmp_step import DMPStep as step
        engine = EngineSettings(str(ds.path), hw, batch_size, cfg.warmup_iter, cfg.num_iter, cfg.mp_keep, step=step,
                                rebuild_every=REBUILD_EVERY if dmp else 0)
        run(Job(engine, [plans], stop, ref_plans), cluster.num_devices, on_round)
    drift = None
    if reference and ref_rounds:
        drift = dmp_drift(reference, ref_rounds, cfg.seed) if dmp else machine_drift(reference, ref_rounds, cfg.seed)
    out = summarize(candidates, time.time() - t0, cfg, log, drift)
    return {**out, "round_end_s": round_end_s}


def check_batch_divides(batch: int, ndevices: int) -> None:
    """Measuring splits the cost models' batch evenly over the ranks: refuse one they do not divide."""
    if batch % ndevices:
        raise UserError(f"--measure and --calibrate split the cost models' batch of {batch} over the ranks, and "
                        f"{ndevices} do not divide it; use a --ndevices that divides {batch}, or cost models "
                        f"collected at a batch it divides")


def machine_drift(reference: list[dict], ref_rounds: list[np.ndarray], seed: int = 0) -> dict:
    """How much slower (> 1) or faster the reference measured in the rounds than when calibrating: per round
    (group r mod G) the geometric mean over ranks of compute now / then and of backward all-to-all now / then;
    the geometric mean over rounds with a bootstrap 95% interval (rounds resampled)."""
    out = {"rounds": len(ref_rounds), "groups": len(reference)}
    for name, col, key in (("compute", 0, "compute_ms"), ("comm", 2, "bw_ms")):
        per_round = np.array([np.exp(np.log(np.asarray(parts)[:, col] / np.asarray(reference[r % len(reference)][key],
                                                                                  np.float64)).mean())
                              for r, parts in enumerate(ref_rounds)])
        st = paired_interval(per_round, np.ones_like(per_round), method="bootstrap", seed=seed)
        out[name] = {"ratio": st.estimate, "ci_lo": st.lo, "ci_hi": st.hi}
    return out


def dmp_reference_plans(reference: dict, task, num_devices: int) -> list:
    """The step-fit plans a calibration measured as TorchRec steps (`measured["dmp"]`), as `Placement`s of `task`
    on `num_devices` ranks; plans that are not these tables' or steps that cannot be true are a damaged calibration
    (one line, before anything is measured)."""
    from ..core.types import implausible_ms
    from ..sharding.plan import Placement

    try:
        plans = [Placement.from_dict(d, task.dims, num_devices) for d in reference["plans"]]
        step_ms = reference["step_ms"]
        why = implausible_ms(np.asarray(step_ms, np.float64), positive=True) if len(step_ms) == len(plans) > 0 \
            else "one measured step per plan"
    except (TypeError, KeyError, ValueError) as e:  # PlanError is a ValueError
        why = str(e)
    if why:
        raise UserError(f"the calibration's TorchRec-step plans are damaged ({why}); calibrate again "
                        "(--calibrate K --calibrate_dmp)")
    return plans


def dmp_drift(reference: dict, ref_rounds: list[np.ndarray], seed: int = 0) -> dict:
    """How much slower (> 1) or faster TorchRec's step measured in the rounds than when calibrating: per round the
    step-fit plan measured in it (plan r mod G) now / then; the geometric mean over rounds with a bootstrap 95%
    interval. Also stored as the compute and the comm drift, the keys an emulated engine's drift record has."""
    then = np.asarray(reference["step_ms"], np.float64)
    per_round = np.array([round_cost(parts) / then[r % len(then)] for r, parts in enumerate(ref_rounds)])
    st = paired_interval(per_round, np.ones_like(per_round), method="bootstrap", seed=seed)
    ratio = {"ratio": st.estimate, "ci_lo": st.lo, "ci_hi": st.hi}
    return {"rounds": len(ref_rounds), "groups": len(then), "step": ratio, "compute": ratio, "comm": ratio}


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
    rows = []
    for i, c in enumerate(candidates):
        st = paired_interval(costs[:, i], costs[:, best], method="bootstrap", seed=cfg.seed) if R >= 2 else None
        m = Measured(costs[:, i], c.round_parts_ms[:R])
        parts = m.parts_ms.tolist() if len(c.round_parts_ms) >= R and m.parts_ms is not None else None
        measured = np.isfinite(costs[:, i])
        rows.append({"names": c.names, "measured_ms": m.cost_ms, "measured_ci_ms": list(m.interval()),
                     "rounds": int(measured.sum()),
                     "median_round_ms": float(np.median(costs[measured, i])),
                     "round_ms": [float(x) if ok else None for x, ok in zip(costs[:, i], measured)],
                     "measured_parts_ms": parts, "simulated_parts_ms": reported_parts(c.simulated_parts_ms),
                     "simulated_ms": c.simulated_ms,
                     "simulated_drift_ms": simulated_drift_ms(c, drift),
                     "ratio_to_best": st.estimate if st else float("nan"), "ci_lo": st.lo if st else float("nan"),
                     "ci_hi": st.hi if st else float("nan")})
    names = "/".join(candidates[best].names)
    level = f"{100 * sep['level']:.4g}%"
    if sep["runner_up"] is None:
        verdict = f"{names} is the only candidate"
    elif sep["separated"]:
        verdict = (f"{names} is the measured best: {100 * (1 - sep['ratio']):.1f}% faster than the runner-up "
                   f"{'/'.join(candidates[sep['runner_up']].names)} (paired {level} interval of the ratio "
                   f"[{sep['ci_lo']:.3f}, {sep['ci_hi']:.3f}], {R} rounds; 95% over all the stop rule's looks)")
    else:
        verdict = (f"the top plans cannot be told apart: {names} measured lowest, but its ratio to the runner-up "
                   f"{'/'.join(candidates[sep['runner_up']].names)} is {sep['ratio']:.3f} with a paired {level} "
                   f"interval [{sep['ci_lo']:.3f}, {sep['ci_hi']:.3f}] (95% over all the stop rule's looks) that "
                   f"includes 1 after {R} rounds "
                   f"({elapsed_s:.0f} s of a {cfg.budget_s:g} s budget); {names} is written as it never measured worse")
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
    log("\n" + "\n".join(format_candidates(rows)))
    log(verdict)
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
            "measured_cost": "step" if cfg.engine == "torchrec" else cfg.cost,
            "rebuild_every": REBUILD_EVERY if cfg.engine == "torchrec" else None, "candidates": rows, "drift": drift,
            "step": step}


def format_candidates(rows: list[dict]) -> list[str]:
    """The candidates as a text table, the best measured first (those measured in every round before those
    dropped earlier)."""
    drift = any(r.get("simulated_drift_ms") is not None for r in rows)
    R = max((r.get("rounds", 0) for r in rows), default=0)
    cells = []
    for r in sorted(rows, key=lambda r: (-r.get("rounds", 0), r["measured_ms"])):
        sim, meas, d = r["simulated_ms"], r["measured_ms"], r.get("simulated_drift_ms")
        cells.append(["/".join(r["names"])[:34], f"{meas:.3f}", "-" if sim is None else f"{sim:.3f}",
                      "-" if sim is None else f"{sim / meas:.2f}",
                      *(["-" if sim is None or d is None else f"{d / meas:.2f}"] if drift else []),
                      f"{r['ratio_to_best']:.3f} [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]"
                      + (f"  (dropped after {r['rounds']} rounds)" if r.get("rounds", R) < R else "")])
    header = ["candidate", "measured ms", "simulated ms", "sim/meas", *(["drift-corrected"] if drift else []),
              "ratio to best [95% CI]"]
    return format_table(header, cells, style="text", align="lrrr" + "r" * drift + "l")
