"""The end-to-end pipeline of DESIGN.md §3 as resumable steps (used by tools/run_pipeline.py).

Each step calls the package function behind one of the numbered scripts with the preset's
arguments (the equivalent command is printed). A step whose outputs exist is skipped (`force`
redoes it); the collectors always run but continue their files up to the target sample count, and
eval resumes from its progress log, so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Callable

from ..core.artifacts import check_results_csv
from ..core.config import (PRESETS, CommCollectConfig, ComputeCollectConfig, CostModelFiles, DatasetConfig,
                           EnsembleConfig, EvalConfig, EvalSimConfig, FitConfig, HardwareConfig, PipelineConfig,
                           TasksConfig, TrainCommConfig, TrainComputeConfig)
from ..core.errors import UserError
from ..core.file_names import (COST_DATA_DIR, DATASET_DIR, DATASET_TABLES, FAMILY_TABLES_DIR, MODELS_DIR, RESULTS_DIR,
                               TASKS_DIR, collective_model_path, comm_data_path, comm_model_paths, compute_data_path,
                               compute_model_path, eval_results_path, input_model_path, meta_path, model_files,
                               plan_ratios_path, ratio_results_path, sim_results_path, tasks_path)
from ..data.dataset import build_dataset
from ..data.tasks import make_task_file
from ..hardware.collect import collect_comm, collect_compute
from ..hardware.comm_bench import torchrec_available
from ..models.ensemble import member_files, train_members
from ..models.fitting import train_comm_models, train_compute_model
from .evaluate import eval_hardware, eval_simulator
from .summary_report import write_report




@dataclass
class Step:
    name: str
    command: str                       # the equivalent shell command, for the log
    run: Callable[[], object]          # calls the package
    outputs: list[Path] = field(default_factory=list)   # skipped when all exist
    redo_removes: list[Path] = field(default_factory=list)

    def done(self) -> bool:
        return bool(self.outputs) and all(p.exists() for p in self.outputs)


def _cmd(script: str, cfg) -> str:
    """The shell command that runs `script` with the flags of `cfg` that differ from their defaults."""

    def flags(c) -> list[str]:
        out = []
        default = type(c)()
        for f in fields(c):
            v, d = getattr(c, f.name), getattr(default, f.name)
            if is_dataclass(v):
                out += flags(v)
            elif v != d and v is not None and v is not False:
                text = ",".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)
                out.append(f"--{f.name}" if v is True else f"--{f.name} {text}")
        return out

    return " ".join(["python", script, *flags(cfg)])


def build_steps(cfg: PipelineConfig) -> list[Step]:
    P = PRESETS[cfg.check().preset]
    gpus = cfg.gpu_devices
    work = Path(cfg.work_dir)
    data, tasks, cost, models, results = (work / DATASET_DIR, work / TASKS_DIR, work / COST_DATA_DIR,
                                          work / MODELS_DIR, work / RESULTS_DIR)
    fit = FitConfig(epochs=P.epochs)
    data_cfg = DatasetConfig(out_dir=str(data), synthetic=True, num_tables=P.num_tables, batch_size=P.batch_size,
                             row_scale=P.row_scale, seed=0)
    steps = [Step("1 data", _cmd("tools/gen_dlrm_data.py", data_cfg), lambda: build_dataset(data_cfg),
                  [data / DATASET_TABLES])]
    for split, seed in (("train", 1), ("test", 2)):
        tc = TasksConfig(data_dir=str(data), out_dir=str(tasks), split=split,
                         data_size=getattr(P, f"num_{split}_tasks"), T_range=P.T_range, max_mem=P.task_max_mem,
                         seed=seed)
        steps.append(Step(f"2 tasks ({split})", _cmd("tools/gen_tasks.py", tc), lambda tc=tc: make_task_file(tc),
                          [tasks_path(tasks, split)]))
    mix = P.families or cfg.families
    cc = ComputeCollectConfig(dataset_dir=str(data), out_dir=str(cost),
                              data_size=P.compute_samples * 3 // 2 if mix else P.compute_samples,
                              max_mem=P.max_mem, workers=P.compute_workers, hardware=HardwareConfig(gpu_devices=gpus),
                              families_dir=str(work / FAMILY_TABLES_DIR) if mix else None)
    compute_model = compute_model_path(models)
    # the family mix's device-sized tables and short pooling need log inputs (README, table families)
    tc = TrainComputeConfig(data_dir=str(cost), dataset_dir=str(data), out_path=str(compute_model), fit=fit,
                            input_transform="log" if mix else "raw")
    steps += [
        Step("3 compute cost data", _cmd("collect_compute_cost_data.py", cc), lambda: collect_compute(cc),
             redo_removes=[compute_data_path(cost)]),
        Step("4 compute cost model", _cmd("train_compute_cost_model.py", tc), lambda: train_compute_model(tc),
             [compute_model]),
    ]
    for N in P.ndevices:
        fw, bw = comm_model_paths(models, N)
        files = CostModelFiles(str(compute_model), str(fw), str(bw))
        task_kw = dict(data_dir=str(data), task_path=str(tasks_path(tasks, "test")), ndevices=N, max_mem=P.max_mem,
                       alg=("all",), models=files)
        cm = CommCollectConfig(out_dir=str(cost), ndevices=N, data_size=P.comm_samples, batch_size=P.batch_size,
                               T_range=P.T_range, gpu_devices=gpus)
        tm = TrainCommConfig(data_dir=str(cost), ndevices=N, fw_out_path=str(fw), bw_out_path=str(bw), fit=fit)
        sim_csv, eval_csv = sim_results_path(results, N), eval_results_path(results, N)
        ratios = plan_ratios_path(models, N)
        sim = EvalSimConfig(**task_kw, results_csv=str(sim_csv))
        # the searches' plans for the training tasks are measured spread among the test tasks' plans, and state the
        # searches' costs of the test plans (sharding/plan_ratios.py)
        ev = EvalConfig(**task_kw, results_csv=str(eval_csv), ratio_tasks=str(tasks_path(tasks, "train")),
                        plan_ratios_out=str(ratios), warmup_iter=P.eval_warmup, num_iter=P.eval_iters,
                        rounds=P.eval_rounds, hardware=HardwareConfig(gpu_devices=gpus))
        steps += [
            Step(f"3 comm cost data ({N} devices)", _cmd("collect_comm_cost_data.py", cm),
                 lambda cm=cm: collect_comm(cm), redo_removes=[comm_data_path(cost, N)]),
            Step(f"4 comm cost models ({N} devices)", _cmd("train_comm_cost_model.py", tm),
                 lambda tm=tm: train_comm_models(tm), [fw, bw]),
            *_input_steps(cost, models, N, P, gpus, fit),
            *_collective_steps(cost, models, N, P, gpus),
            _ensemble_step(cost, data, models, N, fit),
            Step(f"5 simulate all algorithms ({N} devices)", _cmd("eval_simulator.py", sim),
                 lambda sim=sim: eval_simulator(sim), [sim_csv]),
            Step(f"6 measure all algorithms ({N} devices)", _cmd("eval.py", ev),
                 lambda ev=ev: eval_hardware(ev), [eval_csv, ratio_results_path(eval_csv), ratios]),
        ]
    return steps


def _ensemble_step(cost: Path, data: Path, models: Path, N: int, fit: FitConfig) -> Step:
    """The cost models' ensemble members (`models/ensemble.py`), for neuroshard_risk: after every model they
    resample (the input-distribution model's members where TorchRec made its data)."""
    cfg = EnsembleConfig(data_dir=str(cost), dataset_dir=str(data), models_dir=str(models), ndevices=N, fit=fit)
    files = [f for k in range(1, cfg.members + 1) for f in member_files(models, N, k, torchrec_available())]
    return Step(f"4 ensemble members ({N} devices)", _cmd("train_ensemble.py", cfg), lambda: train_members(cfg),
                files)


def _input_steps(cost: Path, models: Path, N: int, P, gpus, fit: FitConfig) -> list[Step]:
    """The input-distribution model of the step cost (TorchRec's KJTAllToAll; the user's tools plan with it, the
    paper's cost does not use it): nothing where TorchRec is not installed."""
    if not torchrec_available():
        print(f"note: torchrec is not installed; no input-distribution model for {N} devices (`make setup`)")
        return []

    out = input_model_path(models, N)
    ci = CommCollectConfig(out_dir=str(cost), ndevices=N, data_size=P.comm_samples, batch_size=P.batch_size,
                           T_range=P.T_range, gpu_devices=gpus, input_dist=True)
    ti = TrainCommConfig(data_dir=str(cost), ndevices=N, input_dist=True, input_out_path=str(out), fit=fit)
    return [Step(f"3 input-distribution cost data ({N} devices)", _cmd("collect_comm_cost_data.py", ci),
                 lambda: collect_comm(ci), redo_removes=[comm_data_path(cost, N, input_dist=True)]),
            Step(f"4 input-distribution model ({N} devices)", _cmd("train_comm_cost_model.py", ti),
                 lambda: train_comm_models(ti), [out])]


def _collective_steps(cost: Path, models: Path, N: int, P, gpus) -> list[Step]:
    """The costs of the row-wise and data-parallel groups' collectives for the step cost (`NeuroShardPlanner`
    prices its row-wise and data-parallel tables with them; the paper's cost does not use them)."""
    out = collective_model_path(models, N)
    cc = CommCollectConfig(out_dir=str(cost), ndevices=N, data_size=P.collective_samples, batch_size=P.batch_size,
                           gpu_devices=gpus, collectives=True)
    tc = TrainCommConfig(data_dir=str(cost), ndevices=N, collectives=True, collectives_out_path=str(out))
    return [Step(f"3 collectives cost data ({N} devices)", _cmd("collect_comm_cost_data.py", cc),
                 lambda: collect_comm(cc), redo_removes=[comm_data_path(cost, N, collectives=True)]),
            Step(f"4 collectives costs ({N} devices)", _cmd("train_comm_cost_model.py", tc),
                 lambda: train_comm_models(tc), [out])]


def run_pipeline(cfg: PipelineConfig, command: str = "") -> Path:
    steps = build_steps(cfg)
    force = cfg.force
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
    out = report_step(cfg, steps, command)
    print(f"[{len(steps) + 1}/{len(steps) + 1}] report: {out} (+ summary.csv, summary.png) "
          f"— pipeline took {time.perf_counter() - t_start:.0f} s")
    print(out.read_text())
    return out


RESULT_COLUMNS = ("alg", "task", "oom", "cost_ms", "search_s")


def _check_results(steps: list[Step]) -> None:
    """Every results file the report reads exists and is a readable results CSV (with its provenance
    sidecar), else one line naming the step command that writes it again."""
    for step in steps:
        for p in (p for p in step.outputs if p.suffix == ".csv"):
            fix = f"rerun step {step.name.split()[0]} with: {step.command}"
            if not p.is_file():
                raise UserError(f"{p} is missing; {fix}")
            try:
                check_results_csv(p, "results file", RESULT_COLUMNS, "sharding")
                json.loads(meta_path(p).read_text())
            except UserError as e:
                raise UserError(f"{str(e).split(';')[0]}; {fix}") from None
            except (OSError, ValueError) as e:
                raise UserError(f"{meta_path(p)} is missing or damaged ({type(e).__name__}); {fix}") from None


def report_step(cfg: PipelineConfig, steps: list[Step], command: str = "") -> Path:
    """The pipeline's last step: results/summary.md and its charts from the step 5/6 results files."""
    work, preset = Path(cfg.work_dir), cfg.preset
    results, models = work / RESULTS_DIR, work / MODELS_DIR
    _check_results(steps)
    P = PRESETS[preset]
    sections = [{"ndevices": N, "sim_csv": sim_results_path(results, N), "eval_csv": eval_results_path(results, N),
                 "models": dict(zip(("compute", f"comm fw ({N})", f"comm bw ({N})"), model_files(models, N)))}
                for N in P.ndevices]
    hw = json.loads(meta_path(eval_results_path(results, P.ndevices[0])).read_text())
    meta = {"preset": preset, "device": hw.get("device"), "backend": hw.get("backend"),
            "device_name": hw.get("device_name"), "batch": P.batch_size, "max_mem_gb": P.max_mem,
            "row_scale": P.row_scale, "test tasks": P.num_test_tasks, "T_range": ",".join(map(str, P.T_range)),
            "eval iterations": f"{P.eval_warmup}+{P.eval_iters}"}
    try:
        return write_report(results, sections, command or f"python tools/run_pipeline.py --preset {preset}",
                            meta)
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as e:
        fixes = "; ".join(f"step {s.name.split()[0]}: {s.command}" for s in steps if s.name[0] in "56")
        raise UserError(f"the results files in {results} cannot be summarised ({type(e).__name__}: "
                        f"{str(e)[:80]}); rerun {fixes}") from None
