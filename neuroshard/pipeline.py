"""The end-to-end pipeline of DESIGN.md §3 as resumable steps (used by tools/run_pipeline.py).

Each step runs one of the numbered scripts with the preset's arguments and is skipped when its
outputs already exist (`force` redoes it). Outputs are written atomically by the scripts, so an
interrupted run resumes at the first step whose outputs are missing.
"""
from __future__ import annotations

import importlib.util
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import UserError

ROOT = Path(__file__).resolve().parent.parent

PRESETS = {
    # CPU, 2 cores: small rows and budgets so every step fits in minutes.
    "quick": {
        "num_tables": 856, "batch_size": 4096, "row_scale": 0.01,
        "task_max_mem": 0.15, "max_mem": 0.04, "T_range": "10,30", "num_train_tasks": 20, "num_test_tasks": 10,
        "ndevices": 4,
    },
    # The paper's sizes (machines with GPUs and the real dataset or a full-size synthetic one).
    "paper": {
        "num_tables": 856, "batch_size": 65536, "row_scale": 1.0,
        "task_max_mem": 15.0, "max_mem": 4.0, "T_range": "10,60", "num_train_tasks": 100, "num_test_tasks": 100,
        "ndevices": 4,
    },
}


@dataclass
class Step:
    name: str
    script: str
    argv: list[str]
    outputs: list[Path]
    post: Callable[[], None] | None = field(default=None)

    def done(self) -> bool:
        return all(p.exists() for p in self.outputs)


def run_script(script: str, argv: list[str]) -> None:
    """Run a step script's `main(argv)` in this process (a failing step raises)."""
    path = ROOT / script
    spec = importlib.util.spec_from_file_location(f"_step_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    code = mod.main(argv)
    if code:
        raise UserError(f"step {script} exited with {code}")


def build_steps(preset: str, work_dir: Path) -> list[Step]:
    if preset not in PRESETS:
        raise UserError(f"unknown --preset {preset!r}; choose one of {', '.join(PRESETS)}")
    P = PRESETS[preset]
    data_dir = work_dir / "data" / "dlrm_datasets"
    task_dir = work_dir / "data" / "tasks"
    return [
        Step("data", "tools/gen_dlrm_data.py",
             ["--synthetic", "--out_dir", str(data_dir), "--num_tables", str(P["num_tables"]),
              "--batch_size", str(P["batch_size"]), "--row_scale", str(P["row_scale"]), "--seed", "0"],
             [data_dir / "tables.pkl"]),
        *[Step(f"tasks ({split})", "tools/gen_tasks.py",
               ["--data_dir", str(data_dir), "--out_dir", str(task_dir), "--split", split,
                "--data_size", str(P[f"num_{split}_tasks"]), "--T_range", P["T_range"],
                "--max_mem", str(P["task_max_mem"]), "--seed", str(seed)],
               [task_dir / f"{split}.pkl"]) for split, seed in (("train", 1), ("test", 2))],
        Step("baseline plans", "tools/shard_summary.py",
             ["--data_dir", str(data_dir), "--task_path", str(task_dir / "test.pkl"),
              "--ndevices", str(P["ndevices"]), "--max_mem", str(P["max_mem"])], []),
    ]


def run_pipeline(preset: str, work_dir: str | Path = ".", force: bool = False, only: list[str] | None = None) -> None:
    steps = build_steps(preset, Path(work_dir))
    for i, step in enumerate(steps, 1):
        if only and step.name.split()[0] not in only:
            continue
        if step.outputs and step.done() and not force:
            print(f"[{i}/{len(steps)}] {step.name}: outputs exist, skipped (--force redoes it)")
            continue
        print(f"[{i}/{len(steps)}] {step.name}: python {step.script} {' '.join(step.argv)}", flush=True)
        t0 = time.perf_counter()
        run_script(step.script, step.argv)
        print(f"[{i}/{len(steps)}] {step.name}: done in {time.perf_counter() - t0:.1f} s", flush=True)
        sys.stdout.flush()
