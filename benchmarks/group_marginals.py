"""Probe: what the tables TorchRec replicates cost each plan, in DMP steps and on the emulated engine.

    python benchmarks/group_marginals.py --set criteo_kaggle --ddr_mb 1024 --rounds 12 [--measure_engine emulated]

Plans the set as `all_types_step.py` does (the same flags), then measures in the same interleaved rounds six plans:
NeuroShard's and TorchRec's; each without the tables TorchRec replicates (TorchRec's then has no data-parallel group,
NeuroShard's loses those tables from its table-wise one); and each with those tables narrowed to 4 columns. The
differences of medians are what the tables cost each plan replicated or table-wise, and how much of it grows with
their width. Printed only.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
import all_types_step as ats  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.intervals import paired_interval  # noqa: E402


def narrowed(spec: dict, names: set, dim: int = 4) -> dict:
    """The spec with the tables `names` at `dim` columns (their one shard, or each replica, that wide)."""
    def one(t: dict) -> dict:
        if t["name"] not in names:
            return t
        shards = [{**s, "width": dim} if "width" in s else s for s in t["shards"]]
        return {**t, "dim": dim, "shards": shards}
    return {**spec, "tables": [one(t) for t in spec["tables"]]}


def main(argv=None) -> None:
    from neuroshard.data.table_list import load_table_list
    from neuroshard.hardware.backends import resolve_hardware
    from neuroshard.hardware.dmp_step import DMPStep, TorchRecItem
    from neuroshard.hardware.engine import EmulatedStepCost, EngineSettings, measure_fixed, spec_step_item
    from neuroshard.planning.user_data import user_tables_dataset

    C = ats.AllTypesStepConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    emulated = a.measure_engine == "emulated"
    with tempfile.TemporaryDirectory() as tmp:
        tl = load_table_list(ats.scaled_table_list(a.set, ats.SCALES[a.set], Path(tmp) / f"{a.set}.json"), 1e6)
        ds = user_tables_dataset(tl, 4096, 0, Path(tmp), None)
        planner, theirs = ats.plans(tl, a, 4096 // a.ndevices, None)
        ours = planner.last_result.specs[""]
        index, pooling = {n: i for i, n in enumerate(tl.names)}, tl.task.pooling_factors
        replicated = {t["name"] for t in theirs["tables"] if t["sharding_type"] == "data_parallel"}

        def item(spec: dict, keep=lambda t: True):
            tables = [t for t in spec["tables"] if keep(t)]
            ids = [index[t["name"]] for t in tables]
            spec = {**spec, "tables": tables}
            if emulated:
                return spec_step_item(spec, a.ndevices, ids, [pooling[i] for i in ids], lambda *_: 1.0 / a.ndevices)
            return TorchRecItem.of(spec, ids)

        def without(t: dict) -> bool:
            return t["name"] not in replicated

        items = {"ours": item(ours), "theirs": item(theirs), "ours_without": item(ours, without),
                 "theirs_without": item(theirs, without), "ours_narrow": item(narrowed(ours, replicated)),
                 "theirs_narrow": item(narrowed(theirs, replicated))}
        print(f"NeuroShard: {ats.kinds_text(ours)}; TorchRec: {ats.kinds_text(theirs)}; TorchRec replicates "
              f"{len(replicated)}: {', '.join(sorted(replicated))}")
        settings = EngineSettings(str(ds.path), resolve_hardware("cpu", "auto"), 4096, a.warmup_iter, a.num_iter,
                                  step=EmulatedStepCost if emulated else DMPStep)
        got = measure_fixed(settings, list(items.values()), a.ndevices, a.rounds)
    ms = {k: np.asarray(g.round_ms, np.float64) for k, g in zip(items, got)}
    for k, v in ms.items():
        print(f"{k}: median {np.median(v):.2f} ms")
    for x, y in (("ours", "theirs"), ("ours_without", "theirs_without")):
        r = paired_interval(ms[x], ms[y])
        print(f"{x} / {y}: {r.estimate:.3f} [{r.lo:.3f}, {r.hi:.3f}]")
    for who, kind in (("theirs", "replicated"), ("ours", "table-wise")):
        full, narrow = (float(np.median(ms[f"{who}{s}"] - ms[f"{who}_without"])) for s in ("", "_narrow"))
        print(f"the {len(replicated)} tables {kind} ({who}): {full:.2f} ms at their dims, {narrow:.2f} ms at 4 "
              "columns (median paired difference)")


if __name__ == "__main__":
    run_main(main)
