"""Fit the step cost to TorchRec's own training step on the user's ranks (`--calibrate_dmp P`, DESIGN.md §8).

The step cost (`Simulator`, cost="step") prices compute and collectives from models measured one rank at a
time. TorchRec's `DistributedModelParallel` step on the same ranks also pays what every step pays whatever the
plan (its sharded module's forward and backward outside the lookups and collectives, the fused optimizer's
fixed part), and where ranks share cores its compute and collectives stretch. `planning.calibrate` with
`--calibrate_dmp P`:
1. draws P random plans of the user's tables (`sample_user_plans`: random column splits in half, devices drawn
   from skewed weights so that balanced and unbalanced plans both appear, within each device's memory);
2. measures each as TorchRec training steps (`measure_plans_dmp`, `hardware/dmp_step.py`: forward + backward
   with the fused update, the same ids, `rounds` interleaved rounds; a plan's cost is the geometric mean of its
   rounds);
3. fits step_ms = scale x simulated step + overhead_ms (`fit_to_steps`, `fit_step`: non-negative least
   squares on the relative error) on 2/3 of them and reports the error on the held-out third before (scale 1,
   overhead 0) and after; the fit is kept only where its held-out error is lower.

Why this form: fitted on random plans and judged on the plans users get, it puts held-out plans near their
measured step, where terms for the sharding-group count, the summed compute and the comm on their own do not help
on every table set (docs/findings.md). Being increasing, the fit never reorders plans: it makes totals, and the
gains `--min_gain` judges, those of the measured step.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from ..core.errors import UserError
from ..core.costs import Cluster, StepFit, implausible_ms
from ..data.features import can_split
from ..data.table_list import TableList
from ..data.tasks import ShardingTask
from ..hardware.dmp_step import DMPStep
from ..hardware.engine import EngineSettings, measure_fixed
from ..sharding.plan import Placement, apply_splits, fits_memory
from ..sharding.torchrec_export import plan_spec

SPLIT_SHARES = (0.0, 0.1, 0.3)        # a random plan splits each splittable table with one of these chances
DEVICE_CONCENTRATIONS = (0.5, 2.0, 20.0)  # Dirichlet concentration of its device weights: skewed to even


def sample_user_plans(task, cluster: Cluster, count: int, seed: int, max_tries: int = 1000) -> list[Placement]:
    """`count` random plans of the task's tables (module docstring, step 1), each within device memory."""
    rng = np.random.default_rng([seed, 41])
    N = cluster.num_devices
    out: list[Placement] = []
    for _ in range(count):
        for _ in range(max_tries):
            share = rng.choice(SPLIT_SHARES)
            splits = [t for t in range(task.num_tables) if can_split(int(task.dims[t])) and rng.random() < share]
            shards = apply_splits(task.dims, splits)
            weights = rng.dirichlet(np.full(N, rng.choice(DEVICE_CONCENTRATIONS)))
            plan = Placement(N, shards, [int(d) for d in rng.choice(N, size=len(shards), p=weights)], splits)
            if fits_memory(task, plan, cluster):
                out.append(plan)
                break
        else:
            raise UserError(f"could not draw a random plan of these tables within {cluster.max_mem_gb:g} GB per "
                            "device for --calibrate_dmp; raise --max_mem")
    return out


def fit_step(simulated_ms, measured_ms) -> StepFit:
    """scale and overhead (both >= 0) minimising the squared relative error of scale x simulated + overhead
    against measured (ms)."""
    sim = np.asarray(simulated_ms, np.float64)
    y = np.asarray(measured_ms, np.float64)
    X = np.stack([sim, np.ones_like(sim)], axis=1) / y[:, None]
    (scale, overhead), _ = nnls(X, np.ones_like(y))
    if scale <= 0:  # every plan measured the same: the simulated differences explain nothing
        raise UserError("--calibrate_dmp: the measured TorchRec steps do not grow with the simulated step cost (the "
                        "fit's scale is 0); measure more plans (a larger P) or more rounds")
    return StepFit(float(scale), float(overhead))


def _errors(pred, y) -> dict:
    from scipy.stats import spearmanr

    pred, y = np.asarray(pred, np.float64), np.asarray(y, np.float64)
    rho = float(spearmanr(pred, y)[0]) if len(y) > 2 and np.ptp(pred) > 0 and np.ptp(y) > 0 else float("nan")
    return {"mape": float(np.mean(np.abs(pred / y - 1))), "spearman": rho,
            "ratio_min": float((pred / y).min()), "ratio_max": float((pred / y).max())}


def measure_plans_dmp(tl: TableList, plans: list[Placement], ds, hw, batch_size: int, num_devices: int, rounds: int,
                      warmup: int, iters: int, log=print) -> np.ndarray:
    """Step 2 of the module docstring: each plan's TorchRec training step (ms; the geometric mean over `rounds`
    interleaved rounds)."""
    DMPStep.check_available(num_devices)
    log(f"calibrating the step cost: measuring {len(plans)} random plans of these tables as TorchRec training steps "
        f"(DistributedModelParallel) on {num_devices} ranks, {rounds} interleaved rounds of {warmup} warm-up + "
        f"{iters} timed steps")
    task = ShardingTask.from_dataset(ds, np.arange(tl.task.num_tables), tl.task.dims)
    items = [DMPStep.item(task, p, plan_spec(tl.names, tl.rows, tl.task.dims, p)) for p in plans]
    settings = EngineSettings(str(ds.path), hw, batch_size, warmup, iters, step=DMPStep,
                              rebuild_every=DMPStep.rebuild_every)
    y = np.array([m.cost_ms for m in measure_fixed(settings, items, num_devices, rounds)])
    why = implausible_ms(y, positive=True)
    if why:
        raise UserError(f"--calibrate_dmp measured a TorchRec step that cannot be true ({why}): the timer or a worker "
                        "failed; rerun the same command (nothing was saved)")
    return y


def fit_to_steps(sim, task, plans: list[Placement], step_ms: np.ndarray, split, seed: int,
                 log=print) -> tuple[StepFit | None, dict, dict]:
    """Step 3 of the module docstring with the simulator `sim` (its step cost) and the plans' measured steps:
    (the fit, or None where it is not better on the held-out plans; its report; what was measured).
    `split(n, seed)` gives the (fit, held-out) positions, as the rest of the calibration splits."""
    y = np.asarray(step_ms, np.float64)
    step = sim.with_cost("step").with_step_fit(None)
    simulated = np.array([step.plan_cost(task, p).cost_ms for p in plans])
    tune, held = split(len(plans), seed + 2)
    fit = fit_step(simulated[tune], y[tune])
    before, after = _errors(simulated[held], y[held]), _errors(fit.apply(simulated[held]), y[held])
    kept = after["mape"] < before["mape"]
    report = {"before": before, "after": after, "kept": kept, "fit": fit.to_dict(),
              "samples": {"fit": len(tune), "held_out": len(held)}}
    log(f"  step     held-out MAPE {100 * before['mape']:6.1f}% -> {100 * after['mape']:6.1f}%   simulated/measured "
        f"{before['ratio_min']:.2f}-{before['ratio_max']:.2f} -> {after['ratio_min']:.2f}-{after['ratio_max']:.2f}   "
        f"(step = {fit.scale:.3f} x simulated + {fit.overhead_ms:.2f} ms; {len(tune)} fit / {len(held)} held out)"
        f"{'' if kept else '  (not better: the step cost is used unfitted)'}")
    measured = {"plans": [p.to_dict() for p in plans], "step_ms": [float(v) for v in y]}
    return (fit if kept else None), report, measured
