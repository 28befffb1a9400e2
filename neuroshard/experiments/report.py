"""Results report: results/summary.md, summary.csv and a bar chart, from the eval CSVs.

Per algorithm: mean simulated and measured cost over the tasks every algorithm solved (the fair
comparison; valid counts alongside), improvement of NeuroShard over the best other algorithm,
mean search time; the simulator's fidelity (Spearman rank correlation of simulated vs measured
cost over every plan measured) and the cost models' test errors.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from ..core.artifacts import atomic_write_bytes, atomic_write_text
from .results import summarize


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


def model_errors(model_paths: dict[str, Path]) -> pd.DataFrame:
    from ..core.artifacts import load_torch

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
    for sec in sections:
        table, info = algorithm_table(Path(sec["sim_csv"]), Path(sec["eval_csv"]))
        table.insert(0, "ndevices", sec["ndevices"])
        all_tables.append(table)
        charts.append((sec["ndevices"], table))
        md += [f"## {sec['ndevices']} devices", "",
               f"Mean cost over the {info['num_common']} of {info['num_tasks']} test tasks that every algorithm "
               "placed within memory (valid = tasks with a memory-feasible plan); improvement is measured cost "
               f"relative to the best other algorithm ({info['best_other']}).", "",
               "| algorithm | simulated (ms) | measured (ms) | valid | vs best other | search (s) |",
               "|---|---:|---:|---:|---:|---:|"]
        for _, r in table.iterrows():
            md.append(f"| {r.algorithm} | {r.simulated_ms:.3f} | {r.measured_ms:.3f} | {r.valid} | "
                      f"{r.vs_best_other_pct:+.1f}% | {r.search_s:.4f} |")
        md += ["", f"Simulator fidelity: Spearman rank correlation {info['fidelity_spearman']:.3f} between simulated "
               f"and measured cost over {info['num_plans_measured']} measured plans.", ""]
        errs = model_errors(sec["models"])
        if len(errs):
            md += ["Cost models (test split):", "", "| model | MSE | MAPE | R² | Spearman |", "|---|---:|---:|---:|---:|"]
            for _, e in errs.iterrows():
                md.append(f"| {e.model} | {e.MSE:.4g} | {e.MAPE_pct:.1f}% | {e.R2:.3f} | {e.Spearman:.3f} |")
            md.append("")
    md += ["![measured cost per algorithm](summary.png)", ""]
    summary = pd.concat(all_tables, ignore_index=True)
    atomic_write_text(out_dir / "summary.csv", summary.to_csv(index=False))
    atomic_write_bytes(out_dir / "summary.png", _bar_chart(charts))
    atomic_write_text(out_dir / "summary.md", "\n".join(md))
    atomic_write_text(out_dir / "summary.meta.json", json.dumps({"command": command, **meta}, indent=2, default=str))
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
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
