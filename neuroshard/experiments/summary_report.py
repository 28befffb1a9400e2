"""Results report: results/summary.md, summary.csv, a bar chart and a fidelity plot, from the eval CSVs.

Headline: NeuroShard's paired measured cost ratio against the best other algorithm with its
bootstrap 95% interval (`paired.py`), then the paired table against every algorithm (simulated and
measured), valid counts, and the mean cost over the tasks every algorithm solved; the run-to-run
spread of a plan (over the interleaved rounds); every plan's simulated vs measured cost with the
ones more than 25% apart flagged; the simulator's fidelity (Spearman rank correlation of simulated vs measured
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
from .task_summary import summarize
from .paired import format_paired, paired_table, strongest


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
    others = table[table.algorithm != "neuroshard"]
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


def paired_section(sim_csv: Path, eval_csv: Path) -> tuple[list[str], dict]:
    """Markdown of NeuroShard's paired comparisons (measured and simulated) and the headline numbers."""
    measured = paired_table(_rows(eval_csv), "cost_ms")
    simulated = paired_table(_rows(sim_csv), "cost_ms")
    best = strongest(measured)
    head = {"best_other": best["vs"] if best else None}
    md = []
    if best:
        tr = next((t for t in measured if t["vs"] == "torchrec"), None)
        head.update(ratio=best["ratio"], ci=(best["ci_lo"], best["ci_hi"]), n=best["n"],
                    torchrec=None if tr is None else (tr["ratio"], tr["ci_lo"], tr["ci_hi"], tr["n"]))
        md += [f"**Headline: NeuroShard's measured cost is {best['ratio']:.3f}x that of the best other algorithm "
               f"({best['vs']}), 95% CI [{best['ci_lo']:.3f}, {best['ci_hi']:.3f}], paired over the {best['n']} "
               f"tasks both placed within memory.**"
               + (f" Against TorchRec: {tr['ratio']:.3f}x [{tr['ci_lo']:.3f}, {tr['ci_hi']:.3f}] over {tr['n']} tasks."
                  if tr else ""), "",
               "Paired comparison on measured cost (geometric mean of per-task ratios; < 1: NeuroShard cheaper; "
               "the best other algorithm is the one against which NeuroShard's ratio is highest):", ""]
        md += format_paired(measured) + [""]
        md += ["The same on simulated cost:", ""] + format_paired(simulated) + [""]
    return md, head


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
        charts.append((sec["ndevices"], table))
        paired_md, head = paired_section(Path(sec["sim_csv"]), Path(sec["eval_csv"]))
        fid_md, plans = fidelity_section(Path(sec["eval_csv"]))
        meta = {**meta, f"headline_{sec['ndevices']}": head}
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
    md += ["![measured cost per algorithm](summary.png)", "", "![simulated vs measured cost of every plan](summary_fidelity.png)", ""]
    summary = pd.concat(all_tables, ignore_index=True)
    atomic_write_text(out_dir / "summary.csv", summary.to_csv(index=False))
    atomic_write_bytes(out_dir / "summary.png", _bar_chart(charts))
    atomic_write_bytes(out_dir / "summary_fidelity.png", _fidelity_plot(scatter))
    atomic_write_text(out_dir / "summary.md", "\n".join(md))
    write_json(out_dir / "summary.meta.json", {"command": command, **meta}, indent=2)
    return out_dir / "summary.md"


def _bar_chart(charts) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(charts), figsize=(6 * len(charts), 4), squeeze=False)
    for ax, (n, table) in zip(axes[0], charts):
        colors = ["tab:red" if a == "neuroshard" else "tab:gray" for a in table.algorithm]
        ax.bar(table.algorithm, table.measured_ms, color=colors)
        ax.set_title(f"measured embedding cost, {n} devices")
        ax.set_ylabel("ms per iteration (max over devices)")
        ax.tick_params(axis="x", rotation=35)
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
            ax.scatter(*zip(*pts), s=18, label=alg, marker="*" if alg == "neuroshard" else "o")
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
