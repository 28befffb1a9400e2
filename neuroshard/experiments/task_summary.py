"""Per-task result summaries of eval.py and eval_simulator.py (their CSVs: `core.artifacts.write_results`)."""
from __future__ import annotations

import numpy as np

from ..core.tables import format_table
from .paired import paired_table, strongest


def summarize(rows: list[dict], cost_key: str) -> list[dict]:
    """Per algorithm: mean cost over its valid tasks and over the tasks every algorithm solved
    (the fair comparison), valid count, total, mean search seconds."""
    algs = list(dict.fromkeys(r["alg"] for r in rows))
    tasks = set(r["task"] for r in rows)
    common = [t for t in sorted(tasks) if all(not r["oom"] for r in rows if r["task"] == t)]
    out = []
    for alg in algs:
        mine = [r for r in rows if r["alg"] == alg]
        valid = [r for r in mine if not r["oom"]]
        shared = [r[cost_key] for r in valid if r["task"] in common]
        out.append({"alg": alg, "mean_cost_ms": float(np.mean([r[cost_key] for r in valid])) if valid else float("nan"),
                    "mean_cost_common_ms": float(np.mean(shared)) if shared else float("nan"),
                    "num_common": len(common), "valid": len(valid), "total": len(mine),
                    "mean_search_s": float(np.mean([r["search_s"] for r in mine]))})
    return out


def print_paired(rows: list[dict], cost_key: str) -> list[dict]:
    """Print NeuroShard's paired comparison with every other algorithm (when NeuroShard ran)."""
    table = paired_table(rows, cost_key)
    if not table:
        return table
    print(f"\nneuroshard vs each algorithm, paired on the tasks both solved ({cost_key}; ratio < 1: neuroshard "
          "cheaper; 95% bootstrap CI)")
    print("\n".join(format_table(["vs", "tasks", "ratio", "95% CI", "W/T/L", "valid ours/theirs"],
                                 [[t["vs"], t["n"], f"{t['ratio']:.3f}", f"[{t['ci_lo']:.3f}, {t['ci_hi']:.3f}]",
                                   f"{t['wins']}/{t['ties']}/{t['losses']}", f"{t['valid_ours']}/{t['valid_theirs']}"]
                                  for t in table], style="text")))
    best = strongest(table)
    if best:
        print(f"headline: vs the best other algorithm ({best['vs']}) neuroshard's paired cost ratio is "
              f"{best['ratio']:.3f} [{best['ci_lo']:.3f}, {best['ci_hi']:.3f}] over {best['n']} tasks")
    return table


def print_summary(summary: list[dict], title: str) -> None:
    print(title)
    n_common = summary[0]["num_common"] if summary else 0
    print("\n".join(format_table(["algorithm", "mean cost (ms)", f"on {n_common} common", "valid", "search (s)"],
                                 [[s["alg"], f"{s['mean_cost_ms']:.3f}", f"{s['mean_cost_common_ms']:.3f}",
                                   f"{s['valid']} / {s['total']}", f"{s['mean_search_s']:.4f}"] for s in summary],
                                 style="text")))
