"""Results report: results/summary.md, summary.csv, a chart of paired ratios and a fidelity plot, from the eval CSVs.

Headline, for each search run (the paper's NeuroShard, and neuroshard_risk where it ran): its paired measured cost
ratio against the best other algorithm (searches left out) with its bootstrap 95% interval (`paired.py`), then the
paired table against every algorithm (simulated and measured; summary.png draws both), valid counts, and the mean
cost over the tasks every algorithm solved; the run-to-run spread of a plan (over the interleaved rounds); each
algorithm's median simulated / measured cost; every plan's simulated vs measured cost with the ones more than 25%
apart flagged; the simulator's fidelity (Spearman rank correlation of simulated vs measured
cost over every plan measured) and the cost models' test errors.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from ..core.artifacts import atomic_write_bytes, atomic_write_text, load_torch, write_json
from ..core.tables import format_table
from ..sharding.plan_ratios import STATED_BY_RATIO
from ..sharding.risk import INTERVAL_LEVEL, STATED_BY_SPREAD
from .task_summary import summarize
from .paired import format_paired, paired_table, strongest


OURS = ("neuroshard", "neuroshard_risk")  # the paper's search, and the search ranking by the ensemble's risk


def _rows(csv_path: Path) -> list[dict]:
    df = pd.read_csv(csv_path)
    df["oom"] = df["oom"].astype(str).str.lower() == "true"
    return df.to_dict("records")


def algorithm_table(sim_csv: Path, eval_csv: Path) -> tuple[pd.DataFrame, dict]:
    sim_rows, eval_rows = _rows(sim_csv), _rows(eval_csv)
    sim_s = {s["alg"]: s for s in summarize(sim_rows, "cost_ms")}
    ev_s = {s["alg"]: s for s in summarize(eval_rows, "cost_ms")}
    table = pd.DataFrame([{
        "algorithm": alg,
        "simulated_ms": sim_s[alg]["mean_cost_common_ms"] if alg in sim_s else np.nan,
        "measured_ms": ev_s[alg]["mean_cost_common_ms"],
        "valid": f"{ev_s[alg]['valid']} / {ev_s[alg]['total']}",
        "search_s": sim_s[alg]["mean_search_s"] if alg in sim_s else ev_s[alg]["mean_search_s"],
    } for alg in ev_s])
    others = table[~table.algorithm.isin(OURS)]
    best_other = others.loc[others.measured_ms.idxmin()] if len(others) else None
    table["vs_best_other_pct"] = (100 * (1 - table.measured_ms / best_other.measured_ms)
                                  if best_other is not None else np.nan)
    measured = [r for r in eval_rows if not r["oom"] and np.isfinite(r.get("sim_cost_ms", np.nan))]
    fidelity = (float(spearmanr([r["sim_cost_ms"] for r in measured], [r["cost_ms"] for r in measured]).statistic)
                if len(measured) > 2 else float("nan"))
    info = {"num_common": next(iter(ev_s.values()))["num_common"], "num_tasks": next(iter(ev_s.values()))["total"],
            "best_other": None if best_other is None else best_other.algorithm,
            "fidelity_spearman": fidelity, "num_plans_measured": len(measured)}
    return table, info


FIDELITY_FLAG = 0.25


def paired_section(sim_csv: Path, eval_csv: Path) -> tuple[list[str], dict, dict]:
    """Markdown of each search's paired comparisons (measured and simulated) against every other algorithm, the
    headline numbers, and the tables the paired chart draws ({ours: (measured, simulated)})."""
    eval_rows, sim_rows = _rows(eval_csv), _rows(sim_csv)
    head, md, charts = {}, [], {}
    for ours in (o for o in OURS if any(r["alg"] == o for r in eval_rows)):
        measured = paired_table(eval_rows, "cost_ms", ours)
        simulated = paired_table(sim_rows, "cost_ms", ours)
        charts[ours] = (measured, simulated)
        best = strongest([t for t in measured if t["vs"] not in OURS])
        if not best:
            continue
        tr = next((t for t in measured if t["vs"] == "torchrec"), None)
        key = "headline" if ours == "neuroshard" else f"headline_{ours}"
        head[key] = {"best_other": best["vs"], "ratio": best["ratio"], "ci": (best["ci_lo"], best["ci_hi"]),
                     "n": best["n"], "torchrec": None if tr is None else (tr["ratio"], tr["ci_lo"], tr["ci_hi"], tr["n"])}
        md += [f"**{ours}: measured cost {best['ratio']:.3f}x that of the best other algorithm ({best['vs']}), 95% "
               f"CI [{best['ci_lo']:.3f}, {best['ci_hi']:.3f}], paired over the {best['n']} tasks both placed within "
               "memory.**" + (f" Against TorchRec: {tr['ratio']:.3f}x [{tr['ci_lo']:.3f}, {tr['ci_hi']:.3f}] over "
                              f"{tr['n']} tasks." if tr else ""), "",
               f"Paired comparison on measured cost (geometric mean of per-task ratios; < 1: {ours} cheaper; the best "
               f"other algorithm is the one against which {ours}'s ratio is highest, searches left out):", ""]
        md += format_paired(measured, ours) + [""]
        md += ["The same on simulated cost:", ""] + format_paired(simulated, ours) + [""]
    return md, head, charts


def fidelity_section(eval_csv: Path) -> tuple[list[str], list[dict]]:
    rows = [r for r in _rows(eval_csv) if not r["oom"] and np.isfinite(r.get("sim_cost_ms", np.nan))
            and np.isfinite(r.get("cost_ms", np.nan))]
    plans = [{"task": int(r["task"]), "alg": r["alg"], "sim": float(r["sim_cost_ms"]), "meas": float(r["cost_ms"]),
              "spread": float(r.get("spread_pct", np.nan))} for r in rows]
    if not plans:
        return [], plans
    off = [p for p in plans if abs(p["sim"] / p["meas"] - 1) > FIDELITY_FLAG]
    spread = np.array([p["spread"] for p in plans if np.isfinite(p["spread"])])
    md = []
    if len(spread):
        md += [f"Run-to-run spread of a plan (max - min over the interleaved rounds, relative to the median): median "
               f"{np.median(spread):.1f}%, 90th percentile {np.percentile(spread, 90):.1f}% over {len(spread)} plans.", ""]
    ratio = {alg: [p["sim"] / p["meas"] for p in plans if p["alg"] == alg] for alg in dict.fromkeys(p["alg"] for p in plans)}
    md += ["Median simulated / measured cost of each algorithm's plans (below 1: predicted cheaper than measured): "
           + ", ".join(f"{alg} {np.median(v):.3f} ({len(v)})" for alg, v in ratio.items()) + ".", ""]
    md += stated_lines(rows)
    md += coverage_lines(rows)
    md += [f"Simulated vs measured cost of every measured plan ({len(off)} of {len(plans)} disagree by more than "
           f"{FIDELITY_FLAG:.0%}, flagged): see summary_fidelity.png.", "",
           "<details><summary>every plan</summary>", ""]
    cells = [[p["task"], p["alg"], f"{p['sim']:.3f}", f"{p['meas']:.3f}", f"{p['sim'] / p['meas']:.2f}",
              f"{p['spread']:.1f}%", "**> 25%**" if abs(p["sim"] / p["meas"] - 1) > FIDELITY_FLAG else ""]
             for p in sorted(plans, key=lambda p: (p["task"], p["alg"]))]
    md += format_table(["task", "algorithm", "simulated (ms)", "measured (ms)", "sim / meas", "spread", "flag"],
                       cells, align="rlrrrrl")
    md += ["", "</details>", ""]
    return md, plans


def _method(r: dict) -> str:
    m = r.get("stated_by")
    return m if isinstance(m, str) else ""


def stated_lines(rows: list[dict]) -> list[str]:
    """The median stated / measured cost of the algorithms whose stated cost is their training plans' ratio x the
    models' cost (eval.py --ratio_tasks or --plan_ratios)."""
    by_alg: dict[str, list[float]] = {}
    for r in rows:
        if _method(r) == STATED_BY_RATIO and np.isfinite(r.get("pred_ms", np.nan)):
            by_alg.setdefault(r["alg"], []).append(r["pred_ms"] / r["cost_ms"])
    if not by_alg:
        return []
    return ["Median stated / measured cost, where the stated cost is the models' cost x the median measured / "
            "modelled ratio of the algorithm's plans for the training tasks (eval.py --ratio_tasks: the pipeline "
            "measures them spread among the test tasks' plans): "
            + ", ".join(f"{a} {np.median(v):.3f} ({len(v)})" for a, v in by_alg.items()) + ".", ""]


def coverage_lines(rows: list[dict]) -> list[str]:
    """How often each plan's stated 90% interval held its measured cost, by algorithm, with the interval's method
    (the training plans' ratio from eval.py --ratio_tasks or --plan_ratios, or the ensemble members' spread,
    `sharding/risk.predicted_interval`)."""
    ok = [r for r in rows if np.isfinite(r.get("pred_lo_ms", np.nan)) and np.isfinite(r.get("pred_hi_ms", np.nan))]
    if not ok:
        return []
    inside: dict[tuple[str, str, float], list[bool]] = {}
    for r in ok:
        level = float(r.get("pred_level", INTERVAL_LEVEL))  # results from before the column: the spread's level
        inside.setdefault((r["alg"], _method(r) or STATED_BY_SPREAD, INTERVAL_LEVEL if np.isnan(level) else level),
                          []).append(
            r["pred_lo_ms"] <= r["cost_ms"] <= r["pred_hi_ms"])
    return ["How often the stated interval of a plan's cost held its measured cost (plans; the interval's method "
            "and nominal level): " + ", ".join(f"{alg} {np.mean(v):.1%} ({len(v)}; {m}, {lv:.1%})"
                                               for (alg, m, lv), v in inside.items()) + ".", ""]


def model_errors(model_paths: dict[str, Path]) -> pd.DataFrame:
    rows = []
    for name, path in model_paths.items():
        if Path(path).exists():
            m = load_torch(path, "cost model")["meta"].get("metrics", {})
            rows.append({"model": name, "MSE": m.get("mse"), "MAPE_pct": 100 * m.get("mape", np.nan),
                         "R2": m.get("r2"), "Spearman": m.get("spearman")})
    return pd.DataFrame(rows)


def write_report(out_dir: Path, sections: list[dict], command: str, meta: dict) -> Path:
    """sections: [{"ndevices", "sim_csv", "eval_csv", "models": {name: path}}]; writes summary.{md,csv,png}."""
    out_dir = Path(out_dir)
    md = ["# neuroshard results", "", f"Produced by `{command}`.", "",
          "Hardware and settings: " + ", ".join(f"{k} {v}" for k, v in meta.items()), ""]
    all_tables = []
    charts = []
    scatter = []
    for sec in sections:
        table, info = algorithm_table(Path(sec["sim_csv"]), Path(sec["eval_csv"]))
        table.insert(0, "ndevices", sec["ndevices"])
        all_tables.append(table)
        paired_md, head, paired_charts = paired_section(Path(sec["sim_csv"]), Path(sec["eval_csv"]))
        fid_md, plans = fidelity_section(Path(sec["eval_csv"]))
        meta = {**meta, **{f"{k}_{sec['ndevices']}": v for k, v in head.items()}}
        charts.append((sec["ndevices"], paired_charts))
        scatter.append((sec["ndevices"], plans))
        md += [f"## {sec['ndevices']} devices", ""] + paired_md + fid_md + [
               f"Mean cost over the {info['num_common']} of {info['num_tasks']} test tasks that every algorithm "
               "placed within memory (valid = tasks with a memory-feasible plan); improvement is measured cost "
               f"relative to the other algorithm with the lowest mean on these common tasks ({info['best_other']}); "
               "the paired headline above uses every task a pair solved.", ""]
        md += format_table(["algorithm", "simulated (ms)", "measured (ms)", "valid", "vs best other", "search (s)"],
                           [[r.algorithm, f"{r.simulated_ms:.3f}", f"{r.measured_ms:.3f}", r.valid,
                             f"{r.vs_best_other_pct:+.1f}%", f"{r.search_s:.4f}"] for _, r in table.iterrows()],
                           align="lrrrrr")
        md += ["", f"Simulator fidelity: Spearman rank correlation {info['fidelity_spearman']:.3f} between simulated "
               f"and measured cost over {info['num_plans_measured']} measured plans.", ""]
        errs = model_errors(sec["models"])
        if len(errs):
            md += ["Cost models (test split):", "",
                   *format_table(["model", "MSE", "MAPE", "R²", "Spearman"],
                                 [[e.model, f"{e.MSE:.4g}", f"{e.MAPE_pct:.1f}%", f"{e.R2:.3f}", f"{e.Spearman:.3f}"]
                                  for _, e in errs.iterrows()], align="lrrrr"), ""]
    md += ["![paired cost ratios, simulated and measured](summary.png)", "", "![simulated vs measured cost of every plan](summary_fidelity.png)", ""]
    summary = pd.concat(all_tables, ignore_index=True)
    atomic_write_text(out_dir / "summary.csv", summary.to_csv(index=False))
    atomic_write_bytes(out_dir / "summary.png", _paired_chart(charts))
    atomic_write_bytes(out_dir / "summary_fidelity.png", _fidelity_plot(scatter))
    atomic_write_text(out_dir / "summary.md", "\n".join(md))
    write_json(out_dir / "summary.meta.json", {"command": command, **meta}, indent=2)
    return out_dir / "summary.md"


def _paired_chart(charts) -> bytes:
    """Per device count and search, one row per other algorithm: the paired cost ratio (geometric mean over the
    tasks both placed) with its 95% interval, simulated and measured side by side; < 1: the search cheaper."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(n, ours, tables) for n, per in charts for ours, tables in per.items()]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6 * max(1, len(panels)), 4), squeeze=False)
    for ax, (n, ours, (measured, simulated)) in zip(axes[0], panels):
        names = [t["vs"] for t in measured]
        sims = {t["vs"]: t for t in simulated}
        for shift, what, table, color in ((-0.15, "simulated", [sims.get(v) for v in names], "tab:gray"),
                                          (0.15, "measured", measured, "tab:red")):
            rows = [(i + shift, t) for i, t in enumerate(table) if t is not None and t["n"] > 0]
            if rows:
                y, ts = zip(*rows)
                x = [t["ratio"] for t in ts]
                err = [[t["ratio"] - t["ci_lo"] for t in ts], [t["ci_hi"] - t["ratio"] for t in ts]]
                ax.errorbar(x, y, xerr=err, fmt="o", color=color, capsize=3, label=what)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlabel(f"{ours} cost / the algorithm's (paired, 95% interval)")
        ax.set_title(f"{ours}, {n} devices")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return figure_png(fig)


def figure_png(fig) -> bytes:
    """A matplotlib figure as PNG bytes (closed afterwards): every plot of the project is written this way."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _fidelity_plot(scatter) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(1, len(scatter)), figsize=(5.5 * max(1, len(scatter)), 5), squeeze=False)
    for ax, (n, plans) in zip(axes[0], scatter):
        algs = sorted({p["alg"] for p in plans})
        for alg in algs:
            pts = [(p["meas"], p["sim"]) for p in plans if p["alg"] == alg]
            ax.scatter(*zip(*pts), s=18, label=alg, marker="*" if alg in OURS else "o")
        if plans:
            hi = max(max(p["meas"], p["sim"]) for p in plans) * 1.05
            ax.plot([0, hi], [0, hi], "k-", lw=0.8)
            ax.fill_between([0, hi], [0, hi * (1 - FIDELITY_FLAG)], [0, hi * (1 + FIDELITY_FLAG)], color="gray",
                            alpha=0.15, label="within 25%")
        ax.set_xlabel("measured cost (ms)")
        ax.set_ylabel("simulated cost (ms)")
        ax.set_title(f"simulator fidelity, {n} devices")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return figure_png(fig)
