"""The end-to-end pipeline of DESIGN.md §3 as resumable steps (used by tools/run_pipeline.py).

Each step calls the package function behind one of the numbered scripts with the preset's
arguments (the equivalent command is printed). A step whose outputs exist is skipped (`force`
redoes it); the collectors always run but continue their files up to the target sample count, and
eval resumes from its progress log, so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..core.errors import UserError

PRESETS = {
    # CPU, 2 cores, ~6 minutes: rows scaled by 0.01 and budgets scaled alike (4 GB -> 0.04 GB).
    "quick": {
        "num_tables": 856, "batch_size": 4096, "row_scale": 0.01, "task_max_mem": 0.15, "max_mem": 0.04,
        "T_range": "10,30", "num_train_tasks": 20, "num_test_tasks": 20, "ndevices": [4],
        "compute_samples": 800, "compute_workers": 1, "comm_samples": 300, "epochs": 500, "eval_warmup": 3, "eval_iters": 25,
        "eval_rounds": 5,
    },
    # The paper's sizes, for machines with GPUs (pass --gpu_devices) and the memory to match.
    "paper": {
        "num_tables": 856, "batch_size": 65536, "row_scale": 1.0, "task_max_mem": 15.0, "max_mem": 4.0,
        "T_range": "10,60", "num_train_tasks": 100, "num_test_tasks": 100, "ndevices": [4, 8],
        "compute_samples": 5000, "compute_workers": None, "comm_samples": 1000, "epochs": 1000, "eval_warmup": 10, "eval_iters": 100,
        "eval_rounds": 5,
    },
}


@dataclass
class Step:
    name: str
    command: str                       # the equivalent shell command, for the log
    run: Callable[[], object]          # calls the package
    outputs: list[Path] = field(default_factory=list)   # skipped when all exist
    redo_removes: list[Path] = field(default_factory=list)

    def done(self) -> bool:
        return bool(self.outputs) and all(p.exists() for p in self.outputs)


def _cmd(script: str, **kw) -> str:
    flags = " ".join(f"--{k}" if v is True else f"--{k} {v}" for k, v in kw.items() if v is not None and v is not False)
    return f"python {script} {flags}"


def build_steps(preset: str, work: Path, gpu_devices: str | None = None) -> list[Step]:
    from ..core.cli import parse_gpu_devices
    from ..data.dataset import build_dataset
    from ..data.tasks import make_task_file
    from ..hardware.collect import collect_comm, collect_compute
    from ..models.training import train_comm_models, train_compute_model
    from .evaluate import eval_hardware, eval_simulator

    if preset not in PRESETS:
        raise UserError(f"unknown --preset {preset!r}; choose one of {', '.join(PRESETS)}")
    P = PRESETS[preset]
    gpu_ids = parse_gpu_devices(gpu_devices)
    data, tasks, cost, models, results = (work / "data/dlrm_datasets", work / "data/tasks", work / "data/cost_data",
                                          work / "models", work / "results")
    data_kw = dict(out_dir=data, synthetic=True, num_tables=P["num_tables"], batch_size=P["batch_size"],
                   row_scale=P["row_scale"], seed=0)
    steps = [Step("1 data", _cmd("tools/gen_dlrm_data.py", **data_kw), lambda: build_dataset(**data_kw),
                  [data / "tables.pkl"])]
    for split, seed in (("train", 1), ("test", 2)):
        kw = dict(data_dir=data, out_dir=tasks, split=split, data_size=P[f"num_{split}_tasks"], T_range=P["T_range"],
                  max_mem=P["task_max_mem"], seed=seed)
        steps.append(Step(f"2 tasks ({split})", _cmd("tools/gen_tasks.py", **kw),
                          lambda kw=kw: make_task_file(**kw), [tasks / f"{split}.pkl"]))
    cc_kw = dict(dataset_dir=data, out_dir=cost, data_size=P["compute_samples"], max_mem=P["max_mem"],
                 workers=P["compute_workers"])
    tc_kw = dict(data_path=cost / "compute_cost_data.pkl", dataset_dir=data, out_path=models / "compute.pt",
                 epochs=P["epochs"])
    steps += [
        Step("3 compute cost data", _cmd("collect_compute_cost_data.py", **cc_kw, gpu_devices=gpu_devices),
             lambda: collect_compute(**cc_kw, gpu_ids=gpu_ids), redo_removes=[cost / "compute_cost_data.pkl"]),
        Step("4 compute cost model", _cmd("train_compute_cost_model.py", data_dir=cost, dataset_dir=data,
                                          out_path=models / "compute.pt", epochs=P["epochs"]),
             lambda: train_compute_model(**tc_kw), [models / "compute.pt"]),
    ]
    for N in P["ndevices"]:
        fw, bw = models / f"comm_{N}_fw.pt", models / f"comm_{N}_bw.pt"
        model_kw = dict(compute_model=models / "compute.pt", fw_comm_model=fw, bw_comm_model=bw)
        task_kw = dict(data_dir=data, task_path=tasks / "test.pkl", ndevices=N, max_mem=P["max_mem"])
        cm_kw = dict(out_dir=cost, ndevices=N, data_size=P["comm_samples"], batch_size=P["batch_size"],
                     T_range=P["T_range"])
        tm_kw = dict(fw_out_path=fw, bw_out_path=bw, epochs=P["epochs"])
        sim_kw = dict(**task_kw, **model_kw, alg="all", results_csv=results / f"sim_{N}.csv")
        ev_kw = dict(**task_kw, **model_kw, alg="all", results_csv=results / f"eval_{N}.csv",
                     warmup_iter=P["eval_warmup"], num_iter=P["eval_iters"], rounds=P.get("eval_rounds", 1))
        steps += [
            Step(f"3 comm cost data ({N} devices)", _cmd("collect_comm_cost_data.py", **cm_kw, gpu_devices=gpu_devices),
                 lambda kw=cm_kw: collect_comm(**kw, gpu_ids=gpu_ids), redo_removes=[cost / f"comm_cost_data_{N}.pkl"]),
            Step(f"4 comm cost models ({N} devices)", _cmd("train_comm_cost_model.py", data_dir=cost, ndevices=N, **tm_kw),
                 lambda kw=tm_kw, N=N: train_comm_models(cost / f"comm_cost_data_{N}.pkl", **kw), [fw, bw]),
            Step(f"5 simulate all algorithms ({N} devices)", _cmd("eval_simulator.py", **sim_kw),
                 lambda kw=sim_kw: eval_simulator(**kw), [results / f"sim_{N}.csv"]),
            Step(f"6 measure all algorithms ({N} devices)", _cmd("eval.py", **ev_kw, gpu_devices=gpu_devices),
                 lambda kw=ev_kw: eval_hardware(**kw, gpu_devices=gpu_devices), [results / f"eval_{N}.csv"]),
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
        print(f"{tag}: {step.command}", flush=True)
        t0 = time.perf_counter()
        step.run()
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
