"""Would column-splitting the heaviest table give a faster plan? Run by hand, not in CI:

    python benchmarks/split_heavy_table.py [--sets criteo_multihot_mlperf_dcnv2] [--models_dir models]
        [--calibrate 120] [--measure_budget_s 120] [--out_dir results]

For each cited set of benchmarks/real_tables/ (scaled as real_tables.py scales it): calibrate the models on
the set's tables (`--calibrate` shards, as real_tables.py does), then measure in one interleaved run, every
candidate in every round (no racing), the usual candidates (NeuroShard's 3, the greedy heuristics, TorchRec)
and the heaviest table (most lookups x dim) split into 2 and into 4 column shards, each placed by
NeuroShard's grid search on the calibrated models (`search.plan_with_splits`). The grid search can leave a
split table alone on a device or give it company, whichever the models prefer.

On the multi-hot set the heaviest table (100 lookups per sample) alone is most of a device's step. A plan
that splits it is the one lever a sharding plan has beyond what the heuristics do; if no split plan measures
faster, the set's top plans are as fast as its tables allow here. Writes results/split_heavy_table.{md,json}.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from neuroshard.core.artifacts import check_output_dir, write_results  # noqa: E402
from neuroshard.core.cli import run_main  # noqa: E402
from neuroshard.core.config import DEFAULT_CALIBRATE_K, SearchParams, comm_model_paths  # noqa: E402
from neuroshard.core.errors import UserError  # noqa: E402
from neuroshard.core.types import Cluster  # noqa: E402
from neuroshard.data.table_list import load_table_list  # noqa: E402
from neuroshard.experiments.calibrate import CalibrationConfig, calibrate, heaviest_tables  # noqa: E402
from neuroshard.experiments.measure import MeasureConfig, candidate_plans, measure_candidates  # noqa: E402
from neuroshard.hardware.backends import resolve_hardware  # noqa: E402
from neuroshard.sharding.plan import can_split  # noqa: E402
from neuroshard.sharding.search import plan_with_splits  # noqa: E402
from neuroshard.sharding.simulator import Simulator  # noqa: E402
from real_tables import SETS, scaled_table_list  # noqa: E402


def heavy_splits(task) -> dict[str, list[int]]:
    """{label: splits} for the table with the most lookups x dim (as `--calibrate` ranks them) in 2 and in 4
    column shards (those it allows)."""
    h = int(heaviest_tables(task, 1)[0])
    d = int(task.dims[h])
    out = {}
    if can_split(d):
        out[f"table {h} in 2"] = [h]
        if can_split(d // 2):
            out[f"table {h} in 4"] = [h, h, task.num_tables]  # the first split's twin is appended last
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", default="criteo_multihot_mlperf_dcnv2")
    p.add_argument("--models_dir", default="models")
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--max_mem", type=float, default=0.04)
    p.add_argument("--calibrate", type=int, default=DEFAULT_CALIBRATE_K)
    p.add_argument("--measure_budget_s", type=float, default=120.0)
    p.add_argument("--out_dir", default="results")
    a = p.parse_args(argv)
    names = a.sets.split(",")
    unknown = [n for n in names if n not in SETS]
    if unknown:
        raise UserError(f"--sets: unknown set {unknown[0]!r}; choose from {', '.join(SETS)}")
    ccfg = CalibrationConfig(num_shards=a.calibrate).check()
    mcfg = MeasureConfig(budget_s=a.measure_budget_s, race=False).check()
    check_output_dir(a.out_dir, "--out_dir")
    N, models = a.ndevices, Path(a.models_dir)
    sim0 = Simulator.load(models / "compute.pt", *comm_model_paths(models, N), num_devices=N)
    batch = int(sim0.compute.meta["batch_size"])
    hw, cluster, search = resolve_hardware("cpu", "auto"), Cluster(N, a.max_mem), SearchParams()
    lines = ["| set | plan | simulated, calibrated (ms) | measured (ms) | ratio to the measured best [95% CI] |",
             "|---|---|---:|---:|---:|"]
    record = {"config": vars(a), "sets": {}}
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            tl = load_table_list(scaled_table_list(name, SETS[name], Path(tmp) / f"{name}.json"), a.max_mem)
        print(f"\n=== {name}")
        sim1, cal = calibrate(sim0, tl, cluster, hw, batch, ccfg)
        extra, forced = {}, heavy_splits(tl.task)
        for label, splits in forced.items():
            found = plan_with_splits(sim1, tl.task, cluster, splits, search)
            if found is not None:
                extra[label] = found[1]
        cands = candidate_plans(tl.task, cluster, sim1, search, batch, 3, extra=extra)
        res = measure_candidates(tl, cluster, cands, hw, batch, mcfg, reference=cal["reference"])
        rows = sorted(res["candidates"], key=lambda r: r["measured_ms"])
        for r in rows:
            lines.append(f"| {name} | {'/'.join(r['names'])} | {r['simulated_ms']:.2f} | {r['measured_ms']:.2f} | "
                         f"{r['ratio_to_best']:.3f} [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}] |")
        record["sets"][name] = {"result": res, "splits": forced,
                                "plans": {"/".join(c.names): c.plan.to_dict() for c in cands}}
        text = "\n".join(lines) + f"\n\n{res['verdict']}\n"
        write_results(a.out_dir, "split_heavy_table", text, record)  # after every set
    print("\n" + text)


if __name__ == "__main__":
    run_main(main, interrupted="interrupted: --out_dir's split_heavy_table.* hold the sets finished before it")
