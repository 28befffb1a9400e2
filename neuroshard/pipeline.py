"""The end-to-end pipeline of DESIGN.md §3 as resumable steps (used by tools/run_pipeline.py).

Each step runs one of the numbered scripts with the preset's arguments. A step whose outputs exist
is skipped (`force` redoes it); the collectors always run but continue their files up to the target
sample count, so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError

ROOT = Path(__file__).resolve().parent.parent

PRESETS = {
    # CPU, 2 cores, ~6 minutes: rows scaled by 0.01 and budgets scaled alike (4 GB -> 0.04 GB).
    "quick": {
        "num_tables": 856, "batch_size": 4096, "row_scale": 0.01, "task_max_mem": 0.15, "max_mem": 0.04,
        "T_range": "10,30", "num_train_tasks": 20, "num_test_tasks": 20, "ndevices": [4],
        "compute_samples": 800, "comm_samples": 300, "epochs": 500, "eval_warmup": 5, "eval_iters": 20,
    },
    # The paper's sizes, for machines with GPUs (pass --gpu_devices) and the memory to match.
    "paper": {
        "num_tables": 856, "batch_size": 65536, "row_scale": 1.0, "task_max_mem": 15.0, "max_mem": 4.0,
        "T_range": "10,60", "num_train_tasks": 100, "num_test_tasks": 100, "ndevices": [4, 8],
        "compute_samples": 5000, "comm_samples": 1000, "epochs": 1000, "eval_warmup": 10, "eval_iters": 100,
    },
}


@dataclass
class Step:
    name: str
    script: str
    argv: list[str]
    outputs: list[Path] = field(default_factory=list)   # skipped when all exist
    always: bool = False                                  # resumable steps: always run, redo on force
    redo_removes: list[Path] = field(default_factory=list)

    def done(self) -> bool:
        return bool(self.outputs) and all(p.exists() for p in self.outputs)


def run_script(script: str, argv: list[str]) -> None:
    """Run a step script's `main(argv)` in this process (a failing step raises)."""
    path = ROOT / script
    spec = importlib.util.spec_from_file_location(f"_step_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    code = mod.main([str(a) for a in argv])
    if code:
        raise UserError(f"step {script} exited with {code}")


def build_steps(preset: str, work: Path, gpu_devices: str | None = None) -> list[Step]:
    if preset not in PRESETS:
        raise UserError(f"unknown --preset {preset!r}; choose one of {', '.join(PRESETS)}")
    P = PRESETS[preset]
    data, tasks, cost, models, results = (work / "data/dlrm_datasets", work / "data/tasks", work / "data/cost_data",
                                          work / "models", work / "results")
    gpu = ["--gpu_devices", gpu_devices] if gpu_devices else []
    steps = [
        Step("1 data", "tools/gen_dlrm_data.py",
             ["--synthetic", "--out_dir", data, "--num_tables", P["num_tables"], "--batch_size", P["batch_size"],
              "--row_scale", P["row_scale"], "--seed", 0], [data / "tables.pkl"]),
        *[Step(f"2 tasks ({split})", "tools/gen_tasks.py",
               ["--data_dir", data, "--out_dir", tasks, "--split", split, "--data_size", P[f"num_{split}_tasks"],
                "--T_range", P["T_range"], "--max_mem", P["task_max_mem"], "--seed", seed], [tasks / f"{split}.pkl"])
          for split, seed in (("train", 1), ("test", 2))],
        Step("3 compute cost data", "collect_compute_cost_data.py",
             ["--dataset_dir", data, "--out_dir", cost, "--data_size", P["compute_samples"], "--max_mem", P["max_mem"],
              *gpu], always=True, redo_removes=[cost / "compute_cost_data.pkl"]),
        Step("4 compute cost model", "train_compute_cost_model.py",
             ["--data_dir", cost, "--dataset_dir", data, "--out_path", models / "compute.pt", "--epochs", P["epochs"]],
             [models / "compute.pt"]),
    ]
    for N in P["ndevices"]:
        fw, bw = models / f"comm_{N}_fw.pt", models / f"comm_{N}_bw.pt"
        model_args = ["--compute_model", models / "compute.pt", "--fw_comm_model", fw, "--bw_comm_model", bw]
        task_args = ["--data_dir", data, "--task_path", tasks / "test.pkl", "--ndevices", N, "--max_mem", P["max_mem"]]
        steps += [
            Step(f"3 comm cost data ({N} devices)", "collect_comm_cost_data.py",
                 ["--out_dir", cost, "--ndevices", N, "--data_size", P["comm_samples"], "--batch_size", P["batch_size"],
                  "--T_range", P["T_range"], *gpu], always=True, redo_removes=[cost / f"comm_cost_data_{N}.pkl"]),
            Step(f"4 comm cost models ({N} devices)", "train_comm_cost_model.py",
                 ["--data_dir", cost, "--ndevices", N, "--fw_out_path", fw, "--bw_out_path", bw, "--epochs", P["epochs"]],
                 [fw, bw]),
            Step(f"5 simulate all algorithms ({N} devices)", "eval_simulator.py",
                 [*task_args, *model_args, "--alg", "all", "--results_csv", results / f"sim_{N}.csv"],
                 [results / f"sim_{N}.csv"]),
            Step(f"6 measure all algorithms ({N} devices)", "eval.py",
                 [*task_args, *model_args, "--alg", "all", "--results_csv", results / f"eval_{N}.csv",
                  "--warmup_iter", P["eval_warmup"], "--num_iter", P["eval_iters"], *gpu],
                 [results / f"eval_{N}.csv"]),
        ]
    return steps


def run_pipeline(preset: str, work_dir: str | Path = ".", force: bool = False, gpu_devices: str | None = None,
                 command: str = "") -> Path:
    work = Path(work_dir)
    steps = build_steps(preset, work, gpu_devices)
    t_start = time.perf_counter()
    for i, step in enumerate(steps, 1):
        tag = f"[{i}/{len(steps) + 1}] {step.name}"
        if force:
            for p in step.outputs + step.redo_removes:
                p.unlink(missing_ok=True)
        elif step.done():
            print(f"{tag}: outputs exist, skipped (--force redoes it)")
            continue
        print(f"{tag}: python {step.script} {' '.join(map(str, step.argv))}", flush=True)
        t0 = time.perf_counter()
        run_script(step.script, step.argv)
        print(f"{tag}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    from .report import write_report

    P = PRESETS[preset]
    sections = [{"ndevices": N, "sim_csv": work / f"results/sim_{N}.csv", "eval_csv": work / f"results/eval_{N}.csv",
                 "models": {"compute": work / "models/compute.pt", f"comm fw ({N})": work / f"models/comm_{N}_fw.pt",
                            f"comm bw ({N})": work / f"models/comm_{N}_bw.pt"}} for N in P["ndevices"]]
    import json

    hw = json.loads((work / f"results/eval_{P['ndevices'][0]}.csv.meta.json").read_text())
    meta = {"preset": preset, "device": hw.get("device"), "backend": hw.get("backend"),
            "device_name": hw.get("device_name"), "batch": P["batch_size"], "max_mem_gb": P["max_mem"],
            "row_scale": P["row_scale"], "test tasks": P["num_test_tasks"], "T_range": P["T_range"],
            "eval iterations": f"{P['eval_warmup']}+{P['eval_iters']}"}
    out = write_report(work / "results", sections, command or f"python tools/run_pipeline.py --preset {preset}", meta)
    print(f"[{len(steps) + 1}/{len(steps) + 1}] report: {out} (+ summary.csv, summary.png) "
          f"— pipeline took {time.perf_counter() - t_start:.0f} s")
    print(out.read_text())
    return out
