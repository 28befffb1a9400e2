"""Plans judged where a TorchRec user runs them: DistributedModelParallel training steps. Run by hand:

    python benchmarks/torchrec_step.py [--sets criteo_kaggle,criteo_terabyte_mlperf,criteo_multihot_mlperf_dcnv2,taobao_ad_x1_din]
        [--rounds 20] [--warmup_iter 2] [--num_iter 5] [--ndevices 4] [--max_mem 0.04] [--calibrate K]

For each cited table set of benchmarks/real_tables/ (scaled as benchmarks/real_tables.py scales it), the plans a
user gets, with the pre-trained models of models/ (uncalibrated; and calibrated with `--calibrate K`):
- `shard_tables`: `tools/shard_tables.py --alg neuroshard` (the step cost, then the plan its models rate fastest
  among NeuroShard's, TorchRec's and the heuristics'), through `planning.shard_tables.shard_tables`;
- `planner`: `NeuroShardPlanner.plan` on the set's EmbeddingBagCollection, as a TorchRec user calls it (each
  rank's `--planner_ddr_gb` of DDR, counted as TorchRec counts it), and `torchrec_as_called`: the plan the user's
  own `EmbeddingShardingPlanner` call makes with the same sharding types (table_wise, column_wise), which the
  planner compares with its own;
- `search_step` and `search_paper`: NeuroShard's search alone under the step cost and under the paper's cost;
- with `--calibrate K`, the same three with the models calibrated on K measured shards of the set's tables
  (`shard_tables --calibrate K`, the emulated engine on these ranks): `shard_tables_cal`, `planner_cal`
  (`NeuroShardPlanner(simulator=...)` with that calibration) and `search_step_cal`, and the calibrated step
  cost's Spearman beside the pre-trained one's;
- TorchRec's own planner (`torchrec`) and the four greedy heuristics;
all measured as TorchRec training steps (`hardware/dmp_step.py`: forward + backward with the fused update of
the sharded EmbeddingBagCollection, global batch B over the ranks, the same ids) in `--rounds` interleaved
rounds of every distinct plan (shuffled per round; each plan's DistributedModelParallel built again every
`--rebuild_every` rounds, since two builds of one plan differ by a few per cent), on `--ndevices` gloo ranks. Per plan: its
ratio to TorchRec's plan (paired over rounds, geometric mean, Student-t 95% interval) and the ratio of the plan
`shard_tables` hands out to it (so against each heuristic's plan), and the "measured best"
(the plan fastest over the first half of the rounds, judged on the second half only, so that picking it is not
what makes it fast). Per set: the Spearman correlation over the distinct plans of each simulated cost (step,
paper) and of the emulated engine's measured cost (`--emulated_rounds`: the engine that emulates independent
devices, one rank's compute at a time) with the DMP-measured cost: where 4 ranks share 2 cores, DMP's
compute contends and the two engines part; and the DMP cost's own split-half Spearman (the first half of the
rounds against the second): how reproducible the measured order of plans within a few per cent is; and, since a
rank correlation also counts plans the measurement cannot order, the pairs of plans the rounds tell apart
(`common.resolved_pairs`: a paired 95% interval excluding 1) and how many of them each simulated cost
orders as measured. With `--calibrate_dmp P` (default 16), P random plans of the set
(`planning.step_fit.sample_user_plans`) are measured in the same interleaved rounds, the step cost is fitted to
them (scale and per-step overhead, `fit_step`, as `shard_tables --calibrate --calibrate_dmp` fits it), and
the fitted step cost is judged on the user's plans, none of which the fit saw; the step cost's Spearman over
the random plans, whose costs spread wider, is reported beside it. Writes results/torchrec_step.{csv,md}
(per plan), results/torchrec_step_rounds.csv (every plan's step time in every round, random plans included, so
that any pair's interval can be worked out later) and results/torchrec_step_sets.csv (per set), each with its
.meta.json, after every set. A rerun with
the same settings and code skips the sets those files already hold (Ctrl-C loses at most the set being measured);
`--fresh` measures every set again.
"""
from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from common import (SETS as SCALES, check_sets, resolved_pairs, scaled_table_list,  # noqa: E402  (sets, row scales)
                    table_list_ebc)
from neuroshard.core.artifacts import (OutputLock, check_output_dir, check_output_file, source_digest,  # noqa: E402
                                       write_results)
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import (DEFAULT_CALIBRATE_COMM, CostModelFiles, SearchParams, ShardTablesConfig,  # noqa: E402
                                    check_calibrate, flag)
from neuroshard.core.errors import UserError, check_float, check_int  # noqa: E402
from neuroshard.core.file_names import RESULTS_DIR  # noqa: E402
from neuroshard.core.intervals import geo_mean, paired_interval  # noqa: E402
from neuroshard.core.tables import format_table  # noqa: E402
from neuroshard.core.costs import Cluster  # noqa: E402
from neuroshard.hardware.dmp_step import REBUILD_EVERY  # noqa: E402
from neuroshard.training.dct_results import read_results, runs_done  # noqa: E402


@dataclass
class TorchRecStepConfig:
    """Plans measured as TorchRec training steps (benchmarks/torchrec_step.py)."""

    sets: tuple[str, ...] = flag(tuple(SCALES), "table sets of benchmarks/real_tables/, comma-separated",
                                 parse="str_list")
    ndevices: int = flag(4, "gloo ranks (the models of models/ must be for this many)")
    max_mem: float = flag(0.04, "GB of fp32 weights per rank (every plan but the planner's)")
    planner_ddr_gb: float = flag(1.0, "DDR per rank of NeuroShardPlanner's Topology, which counts it as TorchRec "
                                      "does (weights, buffers, its storage reservation)")
    rounds: int = flag(20, "interleaved rounds of every plan")
    warmup_iter: int = flag(2, "warm-up steps per plan per round")
    num_iter: int = flag(5, "timed steps per plan per round (their median)")
    rebuild_every: int = flag(REBUILD_EVERY, "build each plan's DistributedModelParallel again every this many "
                                             "rounds (0: once)")
    emulated_rounds: int = flag(5, "rounds of the same plans in the emulated engine (independent devices), to set "
                                   "beside the DMP steps; 0: skip")
    calibrate: int = flag(0, "K: also the plans made with the models calibrated on K measured shards of each set "
                             "(shard_tables --calibrate K, NeuroShardPlanner with that calibration); 0: skip")
    calibrate_dmp: int = flag(16, "random plans measured beside the user's plans, to fit the step cost to DMP steps "
                                  "and judge the fit on the user's plans; 0: skip")
    out_dir: str = flag(RESULTS_DIR)
    fresh: bool = flag(False, "measure every set again (drops the sets the results files already hold)")

    def settings(self) -> dict:
        """What every row records and a resumed run must match (besides the code)."""
        return {k: getattr(self, k) for k in ("ndevices", "max_mem", "rounds", "warmup_iter", "num_iter",
                                              "rebuild_every", "emulated_rounds", "calibrate", "calibrate_dmp")}

    def check(self) -> "TorchRecStepConfig":
        check_sets(self.sets)
        check_int("--rounds", self.rounds, 4, 10_000)
        check_int("--warmup_iter", self.warmup_iter, 0, 1000)
        check_int("--num_iter", self.num_iter, 1, 1000)
        check_int("--emulated_rounds", self.emulated_rounds, 0, 10_000)
        check_int("--rebuild_every", self.rebuild_every, 0, 10_000)
        if self.calibrate:
            check_calibrate(self.calibrate, DEFAULT_CALIBRATE_COMM)
        if self.calibrate_dmp:
            check_int("--calibrate_dmp", self.calibrate_dmp, 2, 1000)
        Cluster(self.ndevices, self.max_mem).need_peers()
        check_float("--planner_ddr_gb", self.planner_ddr_gb, 2**-10, 1024.0)
        return self


def main(argv=None) -> None:
    C = TorchRecStepConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    check_output_dir(a.out_dir, "--out_dir")
    with OutputLock([("--out_dir", Path(a.out_dir) / "torchrec_step.md")]):
        run(a)


def user_plans(name: str, a: TorchRecStepConfig, tmp: Path):
    """The table list, {plan name: Placement} a user gets for set `name` (module docstring), the pre-trained
    simulator, the batch, and with `--calibrate` the calibrated simulator (step cost; else None)."""
    from neuroshard.data.table_list import load_table_list
    from neuroshard.planning.shard_tables import shard_tables
    from neuroshard.sharding.candidates import candidate_plans
    from neuroshard.sharding.search import neuroshard_search
    from neuroshard.sharding.simulator import Simulator

    path = scaled_table_list(name, SCALES[name], tmp / f"{name}.json")
    tl = load_table_list(path, a.max_mem)
    cluster = Cluster(a.ndevices, a.max_mem)
    missing = [str(f) for f in CostModelFiles().paths(a.ndevices) if not f.exists()]
    if missing:  # the user's path reads the pre-trained models of models/ in the folder it runs in
        raise UserError(f"cost models not found: {', '.join(missing)}; run `make reproduce` in the repository "
                        f"root (it makes them for 4 ranks) and run this benchmark there")
    sim = Simulator.from_files(CostModelFiles(), a.ndevices, None, required=True)
    batch = int(sim.compute.meta.get("batch_size") or 4096)
    search = SearchParams()
    with contextlib.redirect_stdout(io.StringIO()):  # its plan report: the benchmark prints its own tables
        written = shard_tables(ShardTablesConfig(tables=str(path), ndevices=a.ndevices, max_mem=a.max_mem,
                                                 out=str(tmp / f"{name}.plan.json")))["plan"]
    planned = planner_plan(tl, a)
    plans = {"shard_tables": written,
             "planner": planned.plan,
             "search_step": neuroshard_search(sim.with_cost("step"), tl.task, cluster, search),
             "search_paper": neuroshard_search(sim.with_cost("paper"), tl.task, cluster, search)}
    if planned.incumbent is not None:  # the user's own EmbeddingShardingPlanner call, as the planner compared it
        plans["torchrec_as_called"] = planned.incumbent
    for c in candidate_plans(tl.task, cluster, sim, search, batch, 0):
        for n in c.names:
            plans[n] = c.plan
    calibrated = None
    if a.calibrate:  # the user's path with --calibrate K: measured shards of these tables on these ranks
        print(f"{name}: calibrating the models on {a.calibrate} measured shards")
        with contextlib.redirect_stdout(io.StringIO()):
            made = shard_tables(ShardTablesConfig(tables=str(path), ndevices=a.ndevices, max_mem=a.max_mem,
                                                  calibrate=a.calibrate, out=str(tmp / f"{name}.cal.plan.json")))
        calibrated = made["simulator"].with_cost("step")
        plans.update(shard_tables_cal=made["plan"], planner_cal=planner_plan(tl, a, calibrated).plan,
                     search_step_cal=neuroshard_search(calibrated, tl.task, cluster, search))
    return tl, plans, sim, batch, calibrated


def planner_plan(tl, a: TorchRecStepConfig, simulator=None):
    """`NeuroShardPlanner.plan` of the set's EmbeddingBagCollection (one feature per table, the tables' pooling
    factors and the sharding types table_wise and column_wise as constraints, each rank's DDR = --planner_ddr_gb,
    counted as TorchRec counts it; benchmarks/all_types_step.py compares every type): its `PlannerResult`
    (the Placement it chose, and TorchRec's plan of the same sharding types it compared); with `simulator`, planned
    with those (calibrated) models instead of the files in models/."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints, Topology

    from neuroshard import NeuroShardPlanner

    ebc = table_list_ebc(tl)
    constraints = {n: ParameterConstraints(pooling_factors=[float(p)], sharding_types=["table_wise", "column_wise"])
                   for n, p in zip(tl.names, tl.task.pooling_factors)}  # the types the other plans here use
    p = NeuroShardPlanner(Topology(world_size=a.ndevices, compute_device="cpu",
                                   ddr_cap=int(a.planner_ddr_gb * 2**30)),
                          constraints=constraints, debug=False, simulator=simulator)
    p.plan(ebc, [EmbeddingBagCollectionSharder()])
    if p.last_result.plan is None:
        raise UserError(f"NeuroShardPlanner handed out TorchRec's plan unchanged (no table-wise/column-wise plan fits "
                        f"{a.planner_ddr_gb:g} GB of DDR a rank); raise --planner_ddr_gb")
    return p.last_result


def measure(tl, plans: dict, a: TorchRecStepConfig, batch: int, tmp: Path):
    """{plan key: [R] DMP round costs (ms)}, the distinct plans' names, and {plan key: emulated-engine cost (ms)}
    (`--emulated_rounds` rounds; empty with 0)."""
    from neuroshard.data.tasks import ShardingTask
    from neuroshard.hardware.backends import resolve_hardware
    from neuroshard.hardware.dmp_step import DMPStep
    from neuroshard.hardware.engine import EngineSettings, measure_fixed, plan_device_tables
    from neuroshard.planning.user_data import user_tables_dataset
    from neuroshard.sharding.torchrec_export import plan_spec
    from neuroshard.sharding.search import plan_key

    distinct: dict = {}
    for n, p in plans.items():
        distinct.setdefault(plan_key(p), []).append(n)
    keys = list(distinct)
    first = {k: plans[distinct[k][0]] for k in keys}
    ds = user_tables_dataset(tl, batch, 0, tmp, None)
    task = ShardingTask.from_dataset(ds, np.arange(tl.task.num_tables), tl.task.dims)
    items = [DMPStep.item(task, first[k], plan_spec(tl.names, tl.rows, tl.task.dims, first[k])) for k in keys]
    hw = resolve_hardware("cpu", "auto")
    settings = EngineSettings(str(ds.path), hw, batch, a.warmup_iter, a.num_iter, step=DMPStep,
                              rebuild_every=a.rebuild_every)
    res = measure_fixed(settings, items, a.ndevices, a.rounds)
    emulated = {}
    if a.emulated_rounds:  # the user's plans (not the step fit's random ones)
        users = [k for k in keys if not all(n.startswith(RANDOM) for n in distinct[k])]
        emu = measure_fixed(EngineSettings(str(ds.path), hw, batch, a.warmup_iter, a.num_iter),
                            [plan_device_tables(task, first[k]) for k in users], a.ndevices, a.emulated_rounds)
        emulated = {k: m.cost_ms for k, m in zip(users, emu)}
    return {k: m.round_ms for k, m in zip(keys, res)}, distinct, emulated


RANDOM = "random"  # the name prefix of the fit's random plans


def run(a: TorchRecStepConfig) -> None:
    from neuroshard.planning.step_fit import fit_step, sample_user_plans
    from neuroshard.sharding.search import plan_key

    rows, sets, times = finished_sets(a)
    made = {**a.settings(), "code": source_digest()}  # recorded in every row, checked on resuming
    measured = False
    for name in a.sets:
        if any(s["set"] == name for s in sets):
            print(f"{name}: measured already ({Path(a.out_dir) / SETS_CSV}); --fresh measures it again")
            continue
        t0 = time.perf_counter()
        measured = True
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            tl, plans, sim, batch, calibrated = user_plans(name, a, tmp)
            print(f"\n=== {name}: {len(tl.names)} tables, {len(set(map(plan_key, plans.values())))} distinct plans "
                  f"(and {a.calibrate_dmp} random plans for the step fit), {a.rounds} rounds on {a.ndevices} ranks")
            for i, p in enumerate(sample_user_plans(tl.task, Cluster(a.ndevices, a.max_mem), a.calibrate_dmp, 0)):
                plans[f"{RANDOM}{i}"] = p
            rounds, distinct, emulated = measure(tl, plans, a, batch, tmp)
        # the fit's random plans (the user's plans among them, if one was drawn, count as the user's): judged apart
        fit_keys = [k for k, ns in distinct.items() if all(n.startswith(RANDOM) for n in ns)]
        times += [{"set": name, "plan": "/".join(ns), "round": i, "dmp_ms": float(ms)}
                  for k, ns in distinct.items() for i, ms in enumerate(rounds[k])]  # every plan's rounds, kept
        fit_plans = [plans[distinct[k][0]] for k in fit_keys]
        fit_ms = [float(geo_mean(rounds.pop(k))) for k in fit_keys]
        distinct = {k: [n for n in ns if not n.startswith(RANDOM)] for k, ns in distinct.items() if k in rounds}
        R = a.rounds
        half = R // 2
        tr = rounds[plan_key(plans["torchrec"])]
        geo_first = {k: float(geo_mean(v[:half])) for k, v in rounds.items()}
        best_key = min(geo_first, key=geo_first.get)
        step_sim, paper_sim = sim.with_cost("step"), sim.with_cost("paper")
        sim_step = {k: step_sim.plan_cost(tl.task, plans[ns[0]]).cost_ms for k, ns in distinct.items()}
        sim_paper = {k: paper_sim.plan_cost(tl.task, plans[ns[0]]).cost_ms for k, ns in distinct.items()}
        sim_cal = {k: calibrated.plan_cost(tl.task, plans[ns[0]]).cost_ms if calibrated else np.nan
                   for k, ns in distinct.items()}
        meas = {k: float(geo_mean(v)) for k, v in rounds.items()}
        ks = list(rounds)
        fitted = {k: np.nan for k in ks}
        fit_cols = {"fit_scale": np.nan, "fit_overhead_ms": np.nan, "fit_mape": np.nan, "fit_ratio_min": np.nan,
                    "fit_ratio_max": np.nan}
        fit_sim = [step_sim.plan_cost(tl.task, p).cost_ms for p in fit_plans]
        if fit_plans:
            fit = fit_step(fit_sim, fit_ms)
            fitted = {k: sim_step[k] * fit.scale + fit.overhead_ms for k in ks}
            ratio = np.array([fitted[k] / meas[k] for k in ks])
            fit_cols = {"fit_scale": fit.scale, "fit_overhead_ms": fit.overhead_ms,
                        "fit_mape": float(np.mean(np.abs(ratio - 1))), "fit_ratio_min": float(ratio.min()),
                        "fit_ratio_max": float(ratio.max())}
        rho_step = float(spearmanr([sim_step[k] for k in ks], [meas[k] for k in ks])[0])
        rho_paper = float(spearmanr([sim_paper[k] for k in ks], [meas[k] for k in ks])[0])
        rho_cal = float(spearmanr([sim_cal[k] for k in ks], [meas[k] for k in ks])[0]) if calibrated else np.nan
        rho_emulated = float(spearmanr([emulated[k] for k in ks], [meas[k] for k in ks])[0]) if emulated else np.nan
        # the random plans spread wider than the user's: how the step cost ranks plans whose costs differ
        rho_random = float(spearmanr(fit_sim, fit_ms)[0]) if len(fit_plans) > 2 else np.nan
        # the DMP measurement against itself (first half of the rounds against the second): how reproducible the
        # measured order of the user's plans is, which lie within a few per cent of each other
        rho_split = float(spearmanr([geo_first[k] for k in ks], [float(geo_mean(rounds[k][half:])) for k in ks])[0])
        # a rank correlation counts plans the measurement cannot order: the pairs it does order, and how many of
        # them each cost orders the same way
        told, step_agrees, paper_agrees = resolved_pairs(rounds, sim_step, sim_paper)
        handed = rounds[plan_key(plans["shard_tables"])]  # the plan shard_tables hands out
        for k in ks:
            st, sh = paired_interval(rounds[k], tr), paired_interval(handed, rounds[k])
            rows.append({"set": name, "plan": "/".join(distinct[k]), "column_split": bool(plans[distinct[k][0]].splits),
                         "dmp_ms": meas[k], "emulated_ms": emulated.get(k, np.nan), "sim_step_ms": sim_step[k], "sim_paper_ms": sim_paper[k],
                         "sim_cal_step_ms": sim_cal[k],
                         "sim_meas_step": sim_step[k] / meas[k], "sim_fit_ms": fitted[k],
                         "sim_meas_fit": fitted[k] / meas[k], "vs_torchrec": st.estimate,
                         "vs_torchrec_lo": st.lo, "vs_torchrec_hi": st.hi, "handed_vs": sh.estimate,
                         "handed_vs_lo": sh.lo, "handed_vs_hi": sh.hi, **made})
        held = paired_interval(rounds[best_key][half:], tr[half:])
        vs_called = {}
        if "torchrec_as_called" in plans:  # issue 64: the planner against the user's own TorchRec call, same types
            pc = paired_interval(rounds[plan_key(plans["planner"])], rounds[plan_key(plans["torchrec_as_called"])])
            vs_called = {"planner_vs_as_called": pc.estimate, "planner_vs_as_called_lo": pc.lo,
                         "planner_vs_as_called_hi": pc.hi}
        sets.append({"set": name, **vs_called, "measured_best": "/".join(distinct[best_key]), "best_vs_torchrec": held.estimate,
                     "best_vs_torchrec_lo": held.lo, "best_vs_torchrec_hi": held.hi, "held_out_rounds": R - half,
                     "spearman_step": rho_step, "spearman_paper": rho_paper, "spearman_emulated": rho_emulated, "spearman_step_cal": rho_cal, "spearman_split_half": rho_split,
                     "spearman_step_random": rho_random, "distinct_plans": len(ks), "resolved_pairs": told,
                     "step_agrees_resolved": step_agrees, "paper_agrees_resolved": paper_agrees,
                     "fit_plans": len(fit_plans), **fit_cols,
                     "seconds": time.perf_counter() - t0, **made})
        print(sets[-1])
        write(rows, sets, times, a)  # after every set: an interrupted run keeps the sets it finished
    if sets and not measured:  # every set finished before: report them
        write(rows, sets, times, a)


SETS_CSV, PLANS_CSV, ROUNDS_CSV = "torchrec_step_sets.csv", "torchrec_step.csv", "torchrec_step_rounds.csv"
PAIR_COUNTS = ("distinct_plans", "resolved_pairs", "step_agrees_resolved", "paper_agrees_resolved")  # the counts the pairs sentence needs


def finished_sets(a: TorchRecStepConfig) -> tuple[list[dict], list[dict], list[dict]]:
    """(plan rows, set rows, per-round rows) of the sets the results files already hold, made with these
    settings and this code (refused in one line otherwise); none with --fresh. The sets CSV is written last,
    so a set counts as finished only once the plans file holds it too (a rounds file older runs did not
    write is not required)."""
    out = Path(a.out_dir)
    check_output_file(out / PLANS_CSV, "--out_dir:")
    check_output_file(out / ROUNDS_CSV, "--out_dir:")
    done = runs_done(out / SETS_CSV, a.fresh, a.settings(), ("set",))
    if a.fresh:
        (out / PLANS_CSV).unlink(missing_ok=True)
        (out / ROUNDS_CSV).unlink(missing_ok=True)
    if not done:
        return [], [], []
    names = {name for (name,) in done}
    sets = [r for r in read_results(out / SETS_CSV, ("set", "measured_best")).to_dict("records") if r["set"] in names]
    plans = out / PLANS_CSV
    rows = read_results(plans, ("set", "plan", "vs_torchrec")).to_dict("records") if plans.is_file() else []
    rows = [r for r in rows if r["set"] in names]
    missing = names - {r["set"] for r in rows}
    if missing:
        raise UserError(f"{plans} lacks the plans of set {sorted(missing)[0]!r} that {out / SETS_CSV} holds; "
                        "pass --fresh to measure every set again")
    rounds_csv = out / ROUNDS_CSV
    times = read_results(rounds_csv, ("set", "plan", "round", "dmp_ms")).to_dict("records") if rounds_csv.is_file() else []
    return rows, sets, [r for r in times if r["set"] in names]


def write(rows: list[dict], sets: list[dict], times: list[dict], a: TorchRecStepConfig) -> None:
    def finite(r, key) -> bool:  # the cell holds a number (rows a column postdates, or a skipped figure, hold NaN)
        return np.isfinite(float(r.get(key, np.nan)))

    def ci(r, key):
        return f"{r[key]:.3f} [{r[key + '_lo']:.3f}, {r[key + '_hi']:.3f}]"

    lines = [f"# Plans measured as TorchRec training steps ({a.ndevices} gloo ranks, {a.rounds} interleaved rounds, "
             f"{a.warmup_iter} warm-up + {a.num_iter} timed steps per plan per round)", "",
             "Ratio of each plan's DMP step time to TorchRec's own plan's, and of the plan `shard_tables` hands out to "
             "each plan's (paired over rounds, 95% interval).", ""]
    for s in sets:
        mine = [r for r in rows if r["set"] == s["set"]]
        lines += [f"## {s['set']}", "",
                  *format_table(["plan", "column split", "DMP ms", "emulated engine ms", "sim step ms", "sim paper ms",
                                 "fitted step ms", "vs TorchRec in DMP [95% CI]",
                                 "plan handed out vs this plan [95% CI]"],
                                [[r["plan"], "yes" if r["column_split"] else "no", f"{r['dmp_ms']:.2f}",
                                  f"{r['emulated_ms']:.2f}", f"{r['sim_step_ms']:.3f}", f"{r['sim_paper_ms']:.3f}",
                                  f"{r.get('sim_fit_ms', float('nan')):.2f}", ci(r, "vs_torchrec"),
                                  ci(r, "handed_vs") if finite(r, "handed_vs") else "-"]
                                 for r in sorted(mine, key=lambda r: r["dmp_ms"])], style="markdown"), "",
                  f"Measured best (chosen on the first {a.rounds - s['held_out_rounds']} rounds): {s['measured_best']}, "
                  f"{ci(s, 'best_vs_torchrec')} of TorchRec's on the {s['held_out_rounds']} held-out rounds. Spearman over "
                  f"the {s['distinct_plans']} plans against the DMP-measured cost: simulated step cost "
                  f"{s['spearman_step']:.2f}, simulated paper cost {s['spearman_paper']:.2f}, emulated engine "
                  f"{s['spearman_emulated']:.2f}; the DMP cost of the first half of the rounds against the second's "
                  f"{s.get('spearman_split_half', float('nan')):.2f} (how reproducible the measured order is)"
                  + ("." if not finite(s, "spearman_step_cal") else
                     f"; the step cost of the calibrated models (--calibrate) {float(s['spearman_step_cal']):.2f}."),
                  *([] if not finite(s, "planner_vs_as_called") else [
                      "", f"NeuroShardPlanner's plan against the plan the user's own EmbeddingShardingPlanner call makes "
                      f"with the same sharding types (torchrec_as_called): {ci(s, 'planner_vs_as_called')}."]),
                  *([] if not all(finite(s, k) for k in PAIR_COUNTS) else [
                      "", f"Pairs of plans the DMP rounds tell apart (paired 95% interval of their ratio excluding 1): "
                      f"{int(s['resolved_pairs'])} of {int(s['distinct_plans']) * (int(s['distinct_plans']) - 1) // 2}; the "
                      f"simulated step cost orders {int(s['step_agrees_resolved'])} of them as measured, the paper cost "
                      f"{int(s['paper_agrees_resolved'])}."]),
                  *([] if not s.get("fit_plans") else [
                      "", f"Step cost fitted to {s['fit_plans']} random plans measured in the same rounds: DMP step = "
                      f"{s['fit_scale']:.3f} x sim step + {s['fit_overhead_ms']:.2f} ms; on the user's plans (none "
                      f"of them in the fit) fitted/measured {s['fit_ratio_min']:.2f}-{s['fit_ratio_max']:.2f}, mean absolute "
                      f"error {100 * s['fit_mape']:.1f}%. Spearman of the simulated step cost over the random plans: "
                      f"{s.get('spearman_step_random', float('nan')):.2f}."]), ""]
    out = Path(a.out_dir)
    write_results(out / PLANS_CSV, rows, markdown="\n".join(lines), config=a.__dict__)
    if times:  # per plan and round, so that any pair's interval can be worked out later
        write_results(out / ROUNDS_CSV, times, config=a.__dict__)
    write_results(out / SETS_CSV, sets, config=a.__dict__)  # last: it marks the sets finished
    print("\n".join(lines))


if __name__ == "__main__":
    run_main(main)
