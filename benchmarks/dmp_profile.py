"""Probe: where NeuroShard's DMP step spends its time, with the tables TorchRec replicates at their width and at 4.

    python benchmarks/dmp_profile.py --set criteo_kaggle --ddr_mb 1024

Plans the set as `all_types_step.py` does (the same flags), builds NeuroShard's plan as TorchRec's training step on
`--ndevices` gloo ranks (`hardware/dmp_step.py`), twice: as planned, and with the tables TorchRec's plan replicates
narrowed to 4 columns. Each rank runs `--warmup_iter` steps, then profiles 10 (`torch.profiler`, CPU); printed per
plan for the first and last rank: the operators with the most self time a step. Printed only.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
import all_types_step as ats  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402

STEPS = 10


def profile_rank(rank: int, world: int, emit, ds_path: str, warmup: int, items: list) -> None:
    """On each rank: every (name, item) built as TorchRec's step, `warmup` steps, then `STEPS` profiled; emits
    (rank, name, [(operator, self ms a step, total ms a step)]) for the 12 with the most self time."""
    from torch.profiler import ProfilerActivity, profile

    from neuroshard.hardware.backends import resolve_hardware
    from neuroshard.hardware.dmp_step import DMPStep
    from neuroshard.hardware.engine import EngineSettings

    step = DMPStep(EngineSettings(ds_path, resolve_hardware("cpu", "auto"), 4096, warmup, STEPS, step=DMPStep),
                   rank, world)
    for name, item in items:
        dmp, kjt = step._build(item)
        for _ in range(warmup):
            step._step(dmp, kjt)
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(STEPS):
                step._step(dmp, kjt)
        rows = [(e.key, e.self_cpu_time_total / STEPS / 1e3, e.cpu_time_total / STEPS / 1e3) for e in p.key_averages()]
        emit((rank, name, sorted(rows, key=lambda r: -r[1])[:12]))


def main(argv=None) -> None:
    from neuroshard.data.table_list import load_table_list
    from neuroshard.hardware.dmp_step import TorchRecItem
    from neuroshard.hardware.launch import run_processes
    from neuroshard.planning.user_data import user_tables_dataset

    C = ats.AllTypesStepConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    with tempfile.TemporaryDirectory() as tmp:
        tl = load_table_list(ats.scaled_table_list(a.set, ats.SCALES[a.set], Path(tmp) / f"{a.set}.json"), 1e6)
        ds = user_tables_dataset(tl, 4096, 0, Path(tmp), None)
        planner, theirs = ats.plans(tl, a, 4096 // a.ndevices, None)
        ours = planner.last_result.specs[""]
        index = {n: i for i, n in enumerate(tl.names)}
        replicated = {t["name"] for t in theirs["tables"] if t["sharding_type"] == "data_parallel"}

        def narrow(t: dict) -> dict:
            if t["name"] not in replicated:
                return t
            return {**t, "dim": 4, "shards": [{**s, "width": 4} if "width" in s else s for s in t["shards"]]}

        specs = {"as planned": ours, "replicated tables at 4 columns": {**ours, "tables": [narrow(t) for t in
                                                                                              ours["tables"]]}}
        items = [(k, TorchRecItem.of(s, [index[t["name"]] for t in s["tables"]])) for k, s in specs.items()]
        got: list = []
        run_processes(profile_rank, a.ndevices, (str(ds.path), a.warmup_iter, items), got.append, group_device="cpu")
    print(f"NeuroShard's plan: {ats.kinds_text(ours)}; TorchRec replicates {len(replicated)} tables")
    for rank, name, rows in sorted(got, key=lambda g: (list(specs).index(g[1]), g[0])):
        if rank in (0, a.ndevices - 1):
            print(f"\n{name}, rank {rank}: ms a step (self, total)")
            for key, self_ms, total_ms in rows[:10]:
                print(f"  {self_ms:6.2f} {total_ms:6.2f}  {key}")


if __name__ == "__main__":
    run_main(main)
