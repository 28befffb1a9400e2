"""How well do comm models predict the all-to-alls of real plans? Paired over the same measured plans.
(By hand, not in CI.)

python benchmarks/comm_on_plans.py --plans results/real_tables.json [--plans ...] --models DIR [--models DIR ...]

Reads the per-rank measured [compute, fw comm, bw comm] ms and dim sums that benchmarks/real_tables.py
records for every plan (`per_rank_parts`), and for each DIR's comm_<N>_fw.pt / comm_<N>_bw.pt (pre-trained,
as they are before `--calibrate`) predicts every rank's backward comm from the dim sums and forward comm from
the dim sums and the measured delays (measured compute + bw, minus the earliest rank's), so compute errors are
left out. Prints per DIR: fw and bw MAPE over all ranks, fw MAPE on the last-ready rank, and the plans whose
cost (max over ranks of measured compute + predicted comm) is within +-15% of measured.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.cli import run_main  # noqa: E402
from neuroshard.core.config import comm_model_paths  # noqa: E402
from neuroshard.core.errors import UserError  # noqa: E402
from neuroshard.models.cost_models import CommCostModel  # noqa: E402
from neuroshard.models.trainer import regression_metrics  # noqa: E402


def load_plans(paths: list[str]) -> list[dict]:
    plans = []
    for path in paths:
        try:
            rec = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read {path} ({type(e).__name__}); pass a real_tables.json") from None
        got = rec.get("per_rank_parts") if isinstance(rec, dict) else None
        if not got or any("dim_sums" not in p for p in got):
            raise UserError(f"{path} holds no per-rank parts with dim sums; write it with a current "
                            "benchmarks/real_tables.py")
        for q in got:
            try:
                dims = np.asarray(q["dim_sums"], np.float64)
                parts = np.asarray(q["measured_parts_ms"], np.float64)
                ok = dims.ndim == 1 and parts.shape == (len(dims), 3) and np.isfinite(parts).all() and (parts > 0).all()
            except (TypeError, ValueError, KeyError):
                ok = False
            if not ok:
                raise UserError(f"{path}: a plan's per-rank parts are not N dim sums and N x 3 positive measured ms; "
                                "write the file again with benchmarks/real_tables.py")
            plans.append({**q, "source": path})
    if len({len(q["dim_sums"]) for q in plans}) > 1:
        raise UserError("the --plans files are for different device counts; pass files of one device count")
    return plans


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plans", action="append", required=True)
    p.add_argument("--models", action="append", required=True)
    a = p.parse_args(argv)
    plans = load_plans(a.plans)
    n = len(plans[0]["dim_sums"])
    dims = np.array([q["dim_sums"] for q in plans], np.float64)
    meas = np.array([q["measured_parts_ms"] for q in plans])  # [P, N, 3]
    ready = meas[..., 0] + meas[..., 2]
    delays = ready - ready.min(1, keepdims=True)
    last = delays == delays.max(1, keepdims=True)
    total = meas.sum(2).max(1)
    sets = sorted({q["set"] for q in plans})
    models = {}
    for d in a.models:  # every model loaded and checked before any output
        fw_path, bw_path = comm_model_paths(d, n)
        fw, bw = CommCostModel.load_direction(fw_path, "fw"), CommCostModel.load_direction(bw_path, "bw")
        if fw.num_devices != n or bw.num_devices != n:
            raise UserError(f"{d}: comm models for {fw.num_devices} devices, the plans have {n}; pass models for {n}")
        models[d] = fw, bw
    print(f"{len(plans)} plans of {', '.join(sets)} on {n} ranks")
    print("| comm models | fw MAPE, all ranks | fw MAPE, last-ready rank | bw MAPE | plans within ±15% "
          "(measured compute + predicted comm) | per set |\n|---|---:|---:|---:|---:|---|")
    for d, (fw, bw) in models.items():
        fw_p = fw.predict_np(np.concatenate([dims, delays], 1))
        bw_p = bw.predict_np(dims)
        mape_fw, mape_fw_last = (regression_metrics(fw_p[m], meas[..., 1][m])["mape"] for m in (np.s_[:], last))
        mape_bw = regression_metrics(bw_p, meas[..., 2])["mape"]
        cost = (meas[..., 0] + fw_p + bw_p).max(1)
        ok = np.abs(cost / total - 1) <= 0.15
        per_set = ", ".join(f"{s} {ok[[q['set'] == s for q in plans]].mean():.0%}" for s in sets)
        tag = "wait term" if fw.meta.get("fw_wait_term") else "paper"
        print(f"| {d} ({tag}, sleep_range {fw.meta.get('sleep_range', '?')}) | {100 * mape_fw:.1f}% | "
              f"{100 * mape_fw_last:.1f}% | {100 * mape_bw:.1f}% | {ok.mean():.0%} ({ok.sum()}/{len(ok)}) "
              f"| {per_set} |")


if __name__ == "__main__":
    run_main(main)
