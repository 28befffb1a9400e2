"""Which stated 90% interval of a plan's cost holds what it says? (issue 63, item 2)

Two split-conformal intervals, each fitted on training tasks' measured plans (`benchmarks/risk_search.py --split
train`'s CSV: simulated cost, the ensemble members' mean and sd, measured cost per plan):

- `ratio`: the simulated cost x the 5th and 95th percentiles of measured / simulated over the training plans
  (one width for every plan);
- `spread`: the members' mean x exp(+-q x their relative sd), q the 90th percentile of |log(measured / mean)| /
  relative sd over the training plans (as wide as the members disagree: what `risk.INTERVAL_WIDTH` scales).

Each is checked leave-one-task-out on the training tasks (fitted on the others, coverage on the task left out),
and the `ratio` interval fitted on all training plans is checked on the held-out test tasks' measured plans (an
`eval.py` CSV: `sim_cost_ms`, `cost_ms`; its own `pred_lo_ms` / `pred_hi_ms`, where it has them, are counted too).

    python benchmarks/interval_methods.py --train results/bench_risk_train.csv --test results/eval_4.csv
"""
from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.artifacts import check_output_dir, check_output_file, write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import flag  # noqa: E402
from neuroshard.core.errors import UserError, check_float  # noqa: E402

TRAIN_COLUMNS = ("task", "simulated_ms", "members_mean_ms", "members_sd_ms", "measured_ms")
TEST_COLUMNS = ("task", "alg", "oom", "sim_cost_ms", "cost_ms")


@dataclass
class IntervalMethodsConfig:
    """Split-conformal 90% intervals of a plan's cost, checked on measured plans (benchmarks/interval_methods.py)."""

    train: str = flag("results/bench_risk_train.csv", "benchmarks/risk_search.py --split train's CSV")
    test: str = flag("results/eval_4.csv", "eval.py's CSV of the held-out test tasks")
    level: float = flag(0.9, "the intervals' stated level")
    out: str = flag("results/interval_methods.md", "the summary; its .csv row beside it")

    def check(self) -> "IntervalMethodsConfig":
        check_float("--level", self.level, 0.5, 0.99)
        check_output_file(self.out, "--out")
        check_output_dir(Path(self.out).parent, "--out")
        return self


def read_rows(path: str, columns: tuple[str, ...], flag_name: str) -> list[dict]:
    """The CSV's rows with `columns` as numbers (task and alg, oom as text); one line naming what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{flag_name} {path}: no such file; run the step that writes it first")
    try:
        with open(p, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"{flag_name} {path}: not a readable CSV ({type(e).__name__})") from None
    missing = [c for c in columns if not rows or c not in rows[0]]
    if missing:
        raise UserError(f"{flag_name} {path}: no rows with column {missing[0]!r}; pass the CSV the module docstring names")
    out = []
    for i, r in enumerate(rows):
        if r.get("oom") == "True" or any(r.get(c) in (None, "") for c in columns):
            continue
        try:
            row = {c: (r[c] if c in ("task", "alg", "oom") else float(r[c])) for c in columns}
            row.update({c: float(r[c]) for c in ("pred_lo_ms", "pred_hi_ms") if r.get(c) not in (None, "")})
        except ValueError:
            raise UserError(f"{flag_name} {path}: row {i + 2} holds a value that is not a number") from None
        if not all(math.isfinite(row[c]) and row[c] > 0 for c in columns if c not in ("task", "alg", "oom",
                                                                                     "members_sd_ms")):
            raise UserError(f"{flag_name} {path}: row {i + 2} holds a cost that is not a finite number > 0")
        if "members_sd_ms" in row and not (math.isfinite(row["members_sd_ms"]) and row["members_sd_ms"] >= 0):
            raise UserError(f"{flag_name} {path}: row {i + 2} holds a members' sd that is not a finite number >= 0")
        out.append(row)
    if not out:
        raise UserError(f"{flag_name} {path}: no measured plans in it")
    return out


def conformal_quantile(values, p: float) -> float:
    """The split-conformal p quantile of `values`: its ceil((n + 1) p)-th smallest (the largest where past n)."""
    v = np.sort(np.asarray(values, np.float64))
    return float(v[min(len(v) - 1, max(0, math.ceil((len(v) + 1) * p) - 1))])


def ratio_bounds(rows: list[dict], level: float) -> tuple[float, float]:
    """The `ratio` interval's factors on the simulated cost, fitted on `rows`."""
    logs = [math.log(r["measured_ms"] / r["simulated_ms"]) for r in rows]
    tail = (1 - level) / 2
    return math.exp(conformal_quantile(logs, tail)), math.exp(conformal_quantile(logs, 1 - tail))


def spread_scale(rows: list[dict], level: float) -> float:
    """The `spread` interval's multiple of the members' relative sd, fitted on `rows`."""
    return conformal_quantile([abs(math.log(r["measured_ms"] / r["members_mean_ms"]))
                               / (r["members_sd_ms"] / r["members_mean_ms"]) for r in rows if r["members_sd_ms"] > 0],
                              level)


def leave_one_task_out(rows: list[dict], level: float) -> dict:
    """Coverage and median width (relative to the simulated cost) of both methods, each task's plans held out."""
    held = {"ratio": [], "spread": []}
    for task in sorted({r["task"] for r in rows}):
        fit = [r for r in rows if r["task"] != task]
        lo, hi = ratio_bounds(fit, level)
        q = spread_scale(fit, level)
        for r in (r for r in rows if r["task"] == task):
            held["ratio"].append((lo * r["simulated_ms"] <= r["measured_ms"] <= hi * r["simulated_ms"], hi - lo))
            rel = r["members_sd_ms"] / r["members_mean_ms"]
            a, b = r["members_mean_ms"] * math.exp(-q * rel), r["members_mean_ms"] * math.exp(q * rel)
            held["spread"].append((a <= r["measured_ms"] <= b, (b - a) / r["simulated_ms"]))
    return {m: (float(np.mean([c for c, _ in v])), float(np.median([w for _, w in v]))) for m, v in held.items()}


def run(a: IntervalMethodsConfig) -> tuple[dict, str]:
    train = read_rows(a.train, TRAIN_COLUMNS, "--train")
    test = read_rows(a.test, TEST_COLUMNS, "--test")
    if len({r["task"] for r in train}) < 2 or not any(r["members_sd_ms"] > 0 for r in train):
        raise UserError(f"--train {a.train}: needs the plans of 2 or more tasks, some with members that disagree (sd > "
                        "0), to hold one task out; run benchmarks/risk_search.py --split train on more tasks")
    cv = leave_one_task_out(train, a.level)
    lo, hi = ratio_bounds(train, a.level)
    inside = [lo * r["sim_cost_ms"] <= r["cost_ms"] <= hi * r["sim_cost_ms"] for r in test]
    stated = [r["pred_lo_ms"] <= r["cost_ms"] <= r["pred_hi_ms"] for r in test if "pred_lo_ms" in r]
    row = {"train_plans": len(train), "train_tasks": len({r["task"] for r in train}), "test_plans": len(test),
           "cv_ratio_coverage": cv["ratio"][0], "cv_ratio_width": cv["ratio"][1],
           "cv_spread_coverage": cv["spread"][0], "cv_spread_width": cv["spread"][1],
           "ratio_lo": lo, "ratio_hi": hi, "test_ratio_coverage": float(np.mean(inside)),
           "test_stated_coverage": float(np.mean(stated)) if stated else float("nan")}
    pct = f"{100 * a.level:g}%"
    text = (f"# Stated {pct} intervals of a plan's cost, checked on measured plans\n\n"
            f"Fitted on {row['train_plans']} plans of {row['train_tasks']} training tasks ({a.train}); "
            f"leave-one-task-out on them:\n\n"
            f"| method | coverage | median width (of the simulated cost) |\n|---|---|---|\n"
            f"| ratio | {cv['ratio'][0]:.1%} | {cv['ratio'][1]:.3f} |\n"
            f"| spread | {cv['spread'][0]:.1%} | {cv['spread'][1]:.3f} |\n\n"
            f"`ratio` fitted on all of them: the simulated cost x [{lo:.3f}, {hi:.3f}]; on the {row['test_plans']} "
            f"held-out test plans ({a.test}) it held {row['test_ratio_coverage']:.1%}"
            + (f"; the CSV's own stated intervals held {row['test_stated_coverage']:.1%}" if stated else "") + ".\n")
    return row, text


def main(argv=None) -> None:
    C = IntervalMethodsConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    row, text = run(a)
    print(text)
    write_results(Path(a.out).with_suffix(".csv"), [row], markdown=text, **a.__dict__)


if __name__ == "__main__":
    run_main(main)
