"""Real table sets through the user path: pre-train -> calibrate -> search -> verify (DESIGN.md §8). Run by hand:

    python benchmarks/real_tables.py [--sets criteo_kaggle,criteo_terabyte_mlperf,criteo_multihot_mlperf_dcnv2,taobao_ad_x1_din]
        [--calibrate 120] [--calibrate_comm 18] [--measure_budget_s 90] [--no_race] [--models_dir models] [--ndevices 4]
        [--max_mem 0.04] [--cost step|paper] [--risk] [--refine R]

The cost is the user's (`--cost step`, shard_tables' default: the search minimises the step TorchRec runs and
`--measure`'s emulated engine measures it, per sharding group the input distribution and both all-to-alls);
`--cost paper` plans and measures the paper's three terms. In TorchRec's own training step the user's plans are
measured by benchmarks/torchrec_step.py. The candidates are the `--alg` algorithms' plans, whole tables and column
shards (the paper's space); the same sets planned over every TorchRec sharding type (row-wise, data-parallel, ...),
`NeuroShardPlanner` against TorchRec's planner, in both engines: benchmarks/all_types_step.py.

For each cited table set in benchmarks/real_tables/ (26 Criteo features, or Taobao's 19; see the files' `source`),
scaled to this machine (rows x `row_scale` of the set, tables of <= 100 rows kept as they are):
1. every algorithm plans it; each plan is simulated with the pre-trained models;
2. the models are calibrated on K measured shards of the set's tables (`--calibrate`);
3. NeuroShard searches again with the calibrated models (its best 3 distinct plans); with `--refine R`, also
   up to R rounds of calibration where that search goes (planning/refine.py), whose final plan is a candidate;
4. every candidate (NeuroShard's 3, the pre-calibration NeuroShard plan, the four greedy heuristics,
   TorchRec) is measured in interleaved rounds on the same ranks (`measure_candidates`), until the
   best is told apart or the budget ends; rounds are the pairs of the paired 95% intervals. A candidate
   measured slower than the best is dropped from later rounds (racing; `--no_race` measures all in every
   round), and its comparisons use the rounds it was measured in.
Per set it also says where the written plan's step goes (`measure.step_breakdown`): the share that is
all-to-all after its slowest device's compute, and what a perfect balance of its shards' compute could save.
Per plan it also splits the calibrated simulator's miss into compute and comm on the device that measured
slowest; per set it times `speed_probe_ms` before calibrating and after measuring, and `--measure` measures
the calibration's drift reference in every round (compute and all-to-all now against when calibrating), so a
run whose machine changed speed in between shows it; the drift-corrected sim/meas scales the simulated parts
by that drift.
Writes results/real_tables.csv (one row per set and plan) and results/real_tables.md.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from common import SETS, check_sets, scaled_table_list, speed_probe_ms  # noqa: E402
from neuroshard.core.artifacts import OutputLock, atomic_write_text, check_output_dir, write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.errors import UserError  # noqa: E402
from neuroshard.core.tables import format_table  # noqa: E402
from neuroshard.core.config import (DEFAULT_CALIBRATE_COMM, DEFAULT_CALIBRATE_K, MEASURE_NUM_ITER,  # noqa: E402
                                    MEASURE_WARMUP_ITER, PRESETS, SearchParams, flag)
from neuroshard.core.file_names import MODELS_DIR, RESULTS_DIR  # noqa: E402
from neuroshard.core.costs import Cluster  # noqa: E402
from neuroshard.data.table_list import load_table_list  # noqa: E402
from neuroshard.planning.calibrate import CalibrationConfig, calibrate  # noqa: E402
from neuroshard.planning.refine import check_rounds, refine  # noqa: E402
from neuroshard.planning.measure import MeasureConfig, candidate_plans, measure_candidates  # noqa: E402
from neuroshard.sharding.candidates import simulated_parts  # noqa: E402
from neuroshard.experiments.paired import paired  # noqa: E402
from neuroshard.hardware.backends import resolve_hardware  # noqa: E402
from neuroshard.sharding.registry import make_sharder, shard_task  # noqa: E402
from neuroshard.sharding.simulator import Simulator  # noqa: E402

HEURISTICS = ("dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy")


@dataclass
class RealTablesConfig:
    """Real table sets through the user path (benchmarks/real_tables.py)."""

    sets: tuple[str, ...] = flag(tuple(SETS), "table sets of benchmarks/real_tables/, comma-separated",
                                 parse="str_list")
    models_dir: str = flag(MODELS_DIR, "the pre-trained compute.pt and comm_<N>_{fw,bw}.pt")
    ndevices: int = flag(4)
    max_mem: float = flag(PRESETS["quick"].max_mem, "GB per device (the quick preset's)")
    calibrate: int = flag(DEFAULT_CALIBRATE_K, "shards of each set measured to calibrate the cost models")
    calibrate_comm: int = flag(DEFAULT_CALIBRATE_COMM, "all-to-all layouts to check the comm models on")
    measure_budget_s: float = flag(90.0)
    warmup_iter: int = flag(MEASURE_WARMUP_ITER, "per candidate per round")
    num_iter: int = flag(MEASURE_NUM_ITER, "timed, per candidate per round")
    no_race: bool = flag(False, "measure every candidate in every round")
    cost: str = flag("step", "what the search minimises and the emulated engine measures, as in shard_tables: step "
                             "(TorchRec's step: per sharding group the input distribution and both all-to-alls) or "
                             "paper (compute + one forward and one backward all-to-all)", choices=("step", "paper"))
    risk: bool = flag(False, "also measure --alg neuroshard_risk's plan, searched with the calibrated models and the "
                             "pre-trained models' ensemble members (models_dir/ensemble/, train_ensemble.py)")
    refine: int = flag(0, "also measure the plan of the paper search refined where it goes: rounds of measuring the "
                          "device shards and the all-to-all layout of its plan that calibration has not measured, "
                          "refitting the models and searching again (planning/refine.py); 0: none")
    out_dir: str = flag(RESULTS_DIR)

    def calibration(self) -> CalibrationConfig:
        return CalibrationConfig(num_shards=self.calibrate, comm_layouts=self.calibrate_comm).check()

    def measurement(self) -> MeasureConfig:
        return MeasureConfig(budget_s=self.measure_budget_s, warmup_iter=self.warmup_iter, num_iter=self.num_iter,
                             race=not self.no_race, cost=self.cost).check()

    def check(self) -> "RealTablesConfig":
        self.calibration(), self.measurement()
        check_rounds(self.refine)
        check_sets(self.sets)
        return self


def main(argv=None) -> None:
    a = config_from_args(RealTablesConfig, step_parser(RealTablesConfig, __doc__, raw_doc=True).parse_args(argv))
    # every check before any work: a run that calibrates for minutes never fails at its end
    a.check()
    ccfg, mcfg, sets = a.calibration(), a.measurement(), a.sets
    cluster = Cluster(a.ndevices, a.max_mem).need_peers()
    check_output_dir(a.out_dir, "--out_dir")
    with OutputLock([("--out_dir", Path(a.out_dir) / "real_tables.md")]):
        measure_sets(a, sets, ccfg, mcfg, cluster)


def measure_sets(a: RealTablesConfig, sets: tuple[str, ...], ccfg: CalibrationConfig, mcfg: MeasureConfig,
                 cluster: Cluster) -> None:
    """Every set through pre-train, calibrate, search, verify (module docstring); the tables after each set."""
    N = cluster.num_devices
    sim0 = Simulator.from_files(a.models_dir, N).with_cost(a.cost)
    if a.risk and not sim0.members:
        raise UserError(f"--risk: {a.models_dir} has no ensemble members (models/ensemble/b<k>/); train them with "
                        "train_ensemble.py, or leave --risk out")
    batch = int(sim0.compute.meta["batch_size"])
    hw = resolve_hardware("cpu", "auto")
    search = SearchParams()
    rows, summary, parts, refines = [], [], [], []
    t_all = time.perf_counter()
    for name in sets:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            tl = load_table_list(scaled_table_list(name, SETS[name], Path(tmp) / f"{name}.json"), a.max_mem)
        print(f"\n=== {name}: {tl.task.num_tables} tables, {tl.task.total_size_gb():.4f} GB (rows x {SETS[name]}), "
              f"{N} x {a.max_mem} GB")
        probe_start = speed_probe_ms()  # the machine's speed before calibrating and after measuring: drift
        pre = shard_task(make_sharder("neuroshard", 0, sim0, search, batch), tl.task, cluster).plan
        sim1, cal = calibrate(sim0, tl, cluster, hw, batch, ccfg)
        sim1 = sim1.with_cost(a.cost).with_members(sim0.members)  # the calibration keeps the members' spread
        extra = {"neuroshard_precalibration": pre}
        if a.risk:
            extra["neuroshard_risk"] = shard_task(make_sharder("neuroshard_risk", 0, sim1, search, batch), tl.task,
                                                  cluster).plan
        refined = {}
        if a.refine:
            def paper_search(sim):
                return shard_task(make_sharder("neuroshard", 0, sim, search, batch), tl.task, cluster).plan
            _, plan, rep = refine(sim0, sim1, cal, tl, cluster, hw, batch, ccfg, paper_search, a.refine)
            if plan is not None:
                extra["neuroshard_refined"] = plan
            refines.append({"set": name, **rep})  # every round: what was measured, and the models' ms for it before
            r0 = rep["rounds"][0] if rep["rounds"] else {}
            refined = {"refine_rounds": len(rep["rounds"]), "refine_shards": rep["shards_measured"],
                       "refine_layouts": rep["layouts_measured"], "refine_fixed_point": rep["fixed_point"],
                       "refine_first_pred_meas": r0.get("predicted_over_measured", np.nan),
                       "refine_first_comm_pred_meas": r0.get("comm_predicted_over_measured", np.nan),
                       "refine_s": rep["seconds"]}
        cands = candidate_plans(tl.task, cluster, sim1, search, batch, 3, extra=extra)
        res = measure_candidates(tl, cluster, cands, hw, batch, mcfg, calibration=cal)
        drift = res["drift"]
        probe_end = speed_probe_ms()
        R = res["rounds"]
        round_ms = {i: c.round_ms[:R] for i, c in enumerate(cands)}
        best = res["best_index"]
        idx = {n: i for i, c in enumerate(cands) for n in c.names}
        for i, c in enumerate(cands):
            s0, s1 = sim0.plan_cost(tl.task, c.plan, cluster), sim1.plan_cost(tl.task, c.plan, cluster)
            s_drift = res["candidates"][i]["simulated_drift_ms"]
            meas = res["candidates"][i]["measured_ms"]  # geometric mean over the rounds it was measured in
            # where the calibrated simulator errs: compute and comm on the device that measured slowest
            m_parts = np.asarray(res["candidates"][i]["measured_parts_ms"])
            s_parts = np.asarray(simulated_parts(s1))
            crit = int(np.argmax(m_parts.sum(axis=1)))
            rows.append({"set": name, "plan": "/".join(c.names), "written": i == best, "measured_ms": meas,
                         "sim_before_ms": s0.cost_ms, "sim_after_ms": s1.cost_ms, "sim_drift_ms": s_drift,
                         "sim_meas_before": s0.cost_ms / meas, "sim_meas_after": s1.cost_ms / meas,
                         "sim_meas_drift": s_drift / meas, "rounds": res["candidates"][i]["rounds"],
                         "dropped": res["candidates"][i]["rounds"] < R,
                         "critical_rank": crit, "compute_sim_meas_after": s_parts[crit, 0] / m_parts[crit, 0],
                         "comm_sim_meas_after": s_parts[crit, 1:].sum() / m_parts[crit, 1:].sum(),
                         "comm_share": m_parts[crit, 1:].sum() / m_parts[crit].sum()})
            parts.append({"set": name, "plan": "/".join(c.names), "dim_sums": [int(v) for v in c.plan.device_dim_sums()],
                          "measured_parts_ms": m_parts.round(4).tolist(),
                          "simulated_parts_ms": s_parts.round(4).tolist(),  # per rank: [compute, fw, bw]
                          "round_ms": res["candidates"][i]["round_ms"]})  # per round (None: dropped by then)
        # the best heuristic: of those measured in the most rounds (racing drops the slower), the lowest geo-mean
        best_h = min((h for h in HEURISTICS if h in idx), key=lambda h: (-res["candidates"][idx[h]]["rounds"],
                                                                         res["candidates"][idx[h]]["measured_ms"]))
        vs_h = paired(dict(enumerate(round_ms[best])), dict(enumerate(round_ms[idx[best_h]])))
        nan = {"ratio": np.nan, "ci_lo": np.nan, "ci_hi": np.nan}
        vs_tr = paired(dict(enumerate(round_ms[best])), dict(enumerate(round_ms[idx["torchrec"]]))) \
            if "torchrec" in idx else nan
        ns = idx["neuroshard#1"]
        ns_h = paired(dict(enumerate(round_ms[ns])), dict(enumerate(round_ms[idx[best_h]])))
        ns_tr = paired(dict(enumerate(round_ms[ns])), dict(enumerate(round_ms[idx["torchrec"]]))) \
            if "torchrec" in idx else nan
        searches = dict(refined)
        # issue 63: the risk-aware and the refined search against the paper's and the best heuristic's
        for alg, short in (("neuroshard_risk", "risk"), ("neuroshard_refined", "refined")):
            if alg in idx:
                for key, other in ((f"{short}_vs_ns", ns), (f"{short}_vs_heuristic", idx[best_h])):
                    r = paired(dict(enumerate(round_ms[idx[alg]])), dict(enumerate(round_ms[other])))
                    searches.update({key: r["ratio"], f"{key}_lo": r["ci_lo"], f"{key}_hi": r["ci_hi"]})
        summary.append({"set": name, "cost": a.cost, **searches, "written": "/".join(cands[best].names), "rounds": R,
                        "separated": res["separated"],
                        "best_heuristic": best_h, "vs_heuristic": vs_h["ratio"], "vs_heuristic_lo": vs_h["ci_lo"],
                        "vs_heuristic_hi": vs_h["ci_hi"], "vs_torchrec": vs_tr["ratio"],
                        "vs_torchrec_lo": vs_tr["ci_lo"], "vs_torchrec_hi": vs_tr["ci_hi"],
                        "ns_vs_heuristic": ns_h["ratio"], "ns_vs_heuristic_lo": ns_h["ci_lo"],
                        "ns_vs_heuristic_hi": ns_h["ci_hi"], "ns_vs_torchrec": ns_tr["ratio"],
                        "ns_vs_torchrec_lo": ns_tr["ci_lo"], "ns_vs_torchrec_hi": ns_tr["ci_hi"],
                        "compute_mape_before": cal["compute"]["before"]["mape"],
                        "compute_mape_after": cal["compute"]["after"]["mape"],
                        "drift_compute": drift["compute"]["ratio"], "drift_compute_lo": drift["compute"]["ci_lo"],
                        "drift_compute_hi": drift["compute"]["ci_hi"], "drift_comm": drift["comm"]["ratio"],
                        "drift_comm_lo": drift["comm"]["ci_lo"], "drift_comm_hi": drift["comm"]["ci_hi"],
                        "probe_start_ms": probe_start, "probe_end_ms": probe_end,
                        "written_comm_share": (res["step"] or {}).get("comm_share", np.nan),
                        "written_balance_headroom": (res["step"] or {}).get("balance_headroom", np.nan),
                        "seconds": time.perf_counter() - t0})
        print(summary[-1])
        text = write_tables(rows, summary, parts, a, refines)  # after every set: an interrupted run keeps the sets it finished
    print(text)
    print(f"total {time.perf_counter() - t_all:.0f} s")


def _ci(s: dict, key: str) -> str:
    """A summary's ratio with its interval: 'r [lo, hi]'."""
    return f"{s[key]:.3f} [{s[key + '_lo']:.3f}, {s[key + '_hi']:.3f}]"


def write_tables(rows: list[dict], summary: list[dict], parts: list[dict], a: RealTablesConfig,
                 refines: list[dict] = ()) -> str:
    """results/real_tables.{md,json} (+ .csv) for the sets measured so far; returns the markdown. The JSON also
    holds every plan's per-rank measured and simulated [compute, fw comm, bw comm] ms and its round costs (`parts`),
    and with --refine each set's refine rounds (`refines`: what each measured, and the models' ms for it before)."""
    df, sm = pd.DataFrame(rows), pd.DataFrame(summary)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "real_tables.csv", df.to_csv(index=False))
    atomic_write_text(out / "real_tables_summary.csv", sm.to_csv(index=False))
    rho0 = spearmanr(df["sim_before_ms"], df["measured_ms"]).statistic
    rho1 = spearmanr(df["sim_after_ms"], df["measured_ms"]).statistic
    rho2 = spearmanr(df["sim_drift_ms"], df["measured_ms"]).statistic
    cells = []
    for r in rows:
        dropped = f" (dropped after {r['rounds']} rounds)" if r.get("dropped") else ""
        cells.append([r["set"], f"{r['plan']}{' **(written)**' if r['written'] else ''}{dropped}",
                      f"{r['measured_ms']:.2f}", f"{r['sim_before_ms']:.2f} / {r['sim_after_ms']:.2f}",
                      f"{r['sim_meas_before']:.2f} / {r['sim_meas_after']:.2f} / {r['sim_meas_drift']:.2f}",
                      f"{r['compute_sim_meas_after']:.2f} / {r['comm_sim_meas_after']:.2f} "
                      f"({100 * r['comm_share']:.0f}%)"])
    lines = format_table(["set", "plan", "measured (ms)", "simulated before / after calibration (ms)",
                          "sim/meas before / after / after, drift-corrected",
                          "slowest device after calibration: compute / comm sim/meas (comm share)"], cells,
                         align="llrrrr")
    within = {k: (abs(df[k] - 1) <= 0.15).mean() for k in ("sim_meas_before", "sim_meas_after", "sim_meas_drift")}
    lines += ["", f"Spearman (simulated vs measured, all plans of all sets): before calibration {rho0:.3f}, "
                  f"after {rho1:.3f}, after and drift-corrected {rho2:.3f}. Plans within ±15%: before "
                  f"{within['sim_meas_before']:.0%}, after {within['sim_meas_after']:.0%}, after and drift-corrected "
                  f"{within['sim_meas_drift']:.0%}.", "",
              *format_table(["set", "machine drift since calibrating: compute", "all-to-all"],
                            [[s["set"], _ci(s, "drift_compute"), _ci(s, "drift_comm")] for s in summary], align="lrr"),
              ""]
    lines += format_table(
        ["set", "written plan", "rounds", "best told apart", "written vs best heuristic (95% CI)",
         "written vs TorchRec (95% CI)", "neuroshard#1 vs best heuristic", "neuroshard#1 vs TorchRec",
         "compute MAPE before / after calibration", "written plan's step: all-to-all share / balance headroom",
         "speed probe start / end (ms)", "seconds"],
        [[s["set"], s["written"], s["rounds"], "yes" if s["separated"] else "no",
          f"{_ci(s, 'vs_heuristic')} ({s['best_heuristic']})", _ci(s, "vs_torchrec"), _ci(s, "ns_vs_heuristic"),
          _ci(s, "ns_vs_torchrec"), f"{100 * s['compute_mape_before']:.1f}% / {100 * s['compute_mape_after']:.1f}%",
          f"{100 * s['written_comm_share']:.0f}% / {100 * s['written_balance_headroom']:.1f}%",
          f"{s['probe_start_ms']:.0f} / {s['probe_end_ms']:.0f}", f"{s['seconds']:.0f}"] for s in summary],
        align="llrlrrrrrrrr")
    for alg, short in (("neuroshard_risk", "risk"), ("neuroshard_refined", "refined")):
        got = [s for s in summary if f"{short}_vs_ns" in s]
        if got:  # --risk / --refine (issue 63): the measured cost of that search's plan, paired over rounds
            lines += ["", *format_table(["set", f"{alg} vs neuroshard#1 (95% CI)", f"{alg} vs best heuristic (95% CI)"],
                                        [[s["set"], _ci(s, f"{short}_vs_ns"),
                                          f"{_ci(s, f'{short}_vs_heuristic')} ({s['best_heuristic']})"] for s in got],
                                        align="lrr")]
    refined = [s for s in summary if "refine_rounds" in s]
    if refined:
        lines += ["", *format_table(["set", "refine rounds", "shards / layouts measured", "models' / measured in the "
                                     "first round: shards' compute, all-to-all", "everything of the final plan measured",
                                     "seconds"],
                                    [[s["set"], s["refine_rounds"], f"{s['refine_shards']} / {s['refine_layouts']}",
                                      f"{s['refine_first_pred_meas']:.3f}, {s['refine_first_comm_pred_meas']:.3f}",
                                      "yes" if s["refine_fixed_point"] else "no", f"{s['refine_s']:.0f}"]
                                     for s in refined], align="lrrrlr")]
    text = "\n".join(lines) + "\n"
    write_results(out / "real_tables.json", markdown=text,
                  record={"config": asdict(a), "spearman_before": rho0, "spearman_after": rho1,
                          "spearman_drift_corrected": rho2, "plans": json.loads(df.to_json(orient="records")),
                          "sets": json.loads(sm.to_json(orient="records")), "per_rank_parts": parts,
                          **({"refine": list(refines)} if refines else {})})
    return text


if __name__ == "__main__":
    run_main(main, interrupted="interrupted: --out_dir's real_tables.* hold the sets finished before it")
