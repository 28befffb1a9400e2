"""Per-task result summaries of eval.py and eval_simulator.py (their CSVs: `core.artifacts.write_results`)."""
from __future__ import annotations

import numpy as np


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
    from .stats import paired_table, strongest

    table = paired_table(rows, cost_key)
    if not table:
        return table
    print(f"\nneuroshard vs each algorithm, paired on the tasks both solved ({cost_key}; ratio < 1: neuroshard "
          "cheaper; 95% bootstrap CI)")
    print(f"{'vs':<20} {'tasks':>5} {'ratio':>7} {'95% CI':>17} {'W/T/L':>10} {'valid ours/theirs':>18}")
    for t in table:
        print(f"{t['vs']:<20} {t['n']:>5} {t['ratio']:>7.3f} [{t['ci_lo']:.3f}, {t['ci_hi']:.3f}]".ljust(53)
              + f"{t['wins']}/{t['ties']}/{t['losses']}".rjust(10) + f"{t['valid_ours']}/{t['valid_theirs']}".rjust(19))
    best = strongest(table)
    if best:
        print(f"headline: vs the best other algorithm ({best['vs']}) neuroshard's paired cost ratio is "
              f"{best['ratio']:.3f} [{best['ci_lo']:.3f}, {best['ci_hi']:.3f}] over {best['n']} tasks")
    return table


def print_summary(summary: list[dict], title: str) -> None:
    print(title)
    n_common = summary[0]["num_common"] if summary else 0
    print(f"{'algorithm':<20} {'mean cost (ms)':>15} {f'on {n_common} common':>15} {'valid':>9} {'search (s)':>11}")
    for s in summary:
        print(f"{s['alg']:<20} {s['mean_cost_ms']:>15.3f} {s['mean_cost_common_ms']:>15.3f} "
              f"{s['valid']:>4} / {s['total']:<3} {s['mean_search_s']:>11.4f}")
