"""Calibrate the pre-trained cost models to a user's tables and hardware (DESIGN.md §8).

Pre-train, **calibrate**, search, verify. `calibrate`:
1. builds the user's tables on this machine (`user_data.user_tables_dataset`: their real ids with `--ids`, or
   ids synthesised from each table's rows, pooling factor and reuse histogram);
2. measures K shards of those tables (`calibration_sampling.sample_user_shards`) exactly as the collector does
   (one worker, one thread, cache flushed, median of `num_iter` after `warmup_iter`);
3. measures all-to-all layouts of the user's dims (`comm_layouts`) on N ranks, on the all-to-all the comm models
   were trained on (DCT-MP's compressed one for `--mp_keep` models), and with an input-distribution model as
   many layouts of TorchRec's input distribution (`input_layouts`), and with the collectives' costs as many
   widths of the row-wise and data-parallel collectives (`collective_widths`);
4. fine-tunes each model on two thirds of its measurements and keeps it only where its held-out error is not
   worse than the pre-trained one's (`fine_tune.py`); each collective's line is fitted afresh on its two thirds
   and kept by the same rule;
5. keeps a drift reference of the held-out shards (`drift_reference`), which `--measure` measures one group a
   round, so a machine that got faster or slower since calibrating shows as a ratio;
6. with `dmp_plans`, measures random plans as TorchRec steps and fits the step cost to them (`step_fit.py`).
The calibrated models are saved beside the plan (`calibration_file.py`) with what they were made for and
everything measured.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..core.artifacts import provenance
from ..core.config import (CALIBRATE_DMP_ROUNDS, CALIBRATE_NUM_ITER, CALIBRATE_WARMUP_ITER, DEFAULT_CALIBRATE_COMM,
                           DEFAULT_CALIBRATE_K, MEASURE_NUM_ITER, MEASURE_WARMUP_ITER, check_calibrate, check_iters)
from ..core.errors import UserError, check_int
from ..core.costs import Cluster, implausible_ms
from ..data.table_list import TableList
from ..hardware.comm_bench import COLLECTIVES, CommRankSettings, comm_rank, torchrec_available
from ..hardware.engine import EngineSettings, Layout, measure_fixed
from ..hardware.launch import run_processes
from ..sharding.simulator import Simulator
from ..models.collective_models import CollectiveCost, CollectiveModels, relative_fit
from .calibration_sampling import (MIN_SPREAD_MS, collective_widths, comm_layouts, drift_reference, input_layouts,
                                   reference_layouts, sample_user_shards)
from .fine_tune import copy_model, fine_tune_compute, fine_tune_kept, held_out_split, kept_report
from .step_fit import fit_to_steps, measure_plans_dmp, sample_user_plans
from .user_data import user_tables_dataset


@dataclass(frozen=True)
class CalibrationConfig:
    """Settings of `--calibrate K` and the fine-tuning behind it."""

    num_shards: int = DEFAULT_CALIBRATE_K       # K compute samples; a third held out
    comm_layouts: int = DEFAULT_CALIBRATE_COMM  # all-to-all layouts of the user's dims; a third held out
    warmup_iter: int = CALIBRATE_WARMUP_ITER
    num_iter: int = CALIBRATE_NUM_ITER
    steps: int = 500              # fine-tuning: full-batch Adam steps on the relative error, from the pre-trained
    lr: float = 1e-3              # weights (`CostModel.fine_tune`)
    seed: int = 0
    dmp_plans: int = 0            # random plans measured as TorchRec steps, to fit the step cost (`step_fit.py`)
    dmp_rounds: int = CALIBRATE_DMP_ROUNDS

    def check(self) -> "CalibrationConfig":
        check_calibrate(self.num_shards, self.comm_layouts, self.dmp_plans, self.dmp_rounds)
        check_iters(self.warmup_iter, self.num_iter)
        check_int("--seed", self.seed, 0)
        return self



def refuse_implausible(values, what: str, positive: bool = True, doing: str = "calibrating") -> np.ndarray:
    """`values` (ms) as an array, or one line saying which measured cost cannot be true (`implausible_ms`)."""
    why = implausible_ms(values, positive)
    if why:
        raise UserError(f"{doing} measured a {what} cost that cannot be true ({why}): the timer or a worker "
                        "failed; rerun the same command (nothing was saved)")
    return np.asarray(values)


def measure_shards(ds, hw, batch_size: int, shards, warmup: int, iters: int) -> np.ndarray:
    """Each shard's compute ms on one worker, one round of the measurement engine (`hardware.engine`)."""
    items = [[[(int(t), int(d)) for t, d in zip(*shard)]] for shard in shards]
    measured = measure_fixed(EngineSettings(str(ds.path), hw, batch_size, warmup, iters, shuffle=False), items, 1)
    return np.array([m.compute_ms[0] for m in measured])



def measure_layouts(layouts, N: int, batch_size: int, hw, warmup: int, iters: int, mp_keep: float | None = None):
    """Per layout, every rank's forward and backward all-to-all ms ([len, N] each), one round of the measurement
    engine on N ranks; DCT-MP's with `mp_keep`."""
    items = [Layout(tuple(int(x) for x in d), tuple(float(x) for x in w)) for d, w in layouts]
    measured = measure_fixed(EngineSettings(None, hw, batch_size, warmup, iters, mp_keep, shuffle=False), items, N)
    return np.array([m.fw_ms for m in measured]), np.array([m.bw_ms for m in measured])



def comm_rank_samples(settings: CommRankSettings, N: int, hw) -> list[dict]:
    """What the comm collector's rank function (`comm_bench.comm_rank`) emits for each of `settings.indices`, run on
    N ranks, in index order."""
    got: dict[int, dict] = {}
    run_processes(comm_rank, N, (settings,), lambda m: got.__setitem__(int(m["index"]), m), group_device=hw.device)
    return [got[i] for i in settings.indices]



def measure_input_layouts(layouts, N: int, batch_size: int, hw, warmup: int, iters: int
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Per layout every rank's input words and TorchRec input-distribution ms ([len, N] each), on N ranks, as the
    input-distribution collector measures them (`comm_bench.comm_rank`)."""
    got = comm_rank_samples(CommRankSettings(list(range(len(layouts))), {"seed": 0, "T_range": (1, 2)}, batch_size,
                                             hw.device, warmup, iters, None, True, tuple(layouts)), N, hw)
    return (np.array([g["input_words"] for g in got], np.float64), np.array([g["input_ms"] for g in got], np.float64))



def measure_collective_widths(widths, N: int, batch_size: int, hw, warmup: int, iters: int) -> dict[str, np.ndarray]:
    """Per collective of `COLLECTIVES` every rank's ms at each width ({name: [len, N]}), on N ranks, as the
    collectives collector measures them (`comm_bench.comm_rank`)."""
    got = comm_rank_samples(CommRankSettings(list(range(len(widths))), {"seed": 0}, batch_size, hw.device, warmup,
                                             iters, collectives=True, collective_widths=tuple(int(w) for w in widths)),
                            N, hw)
    return {name: np.array([g[f"{name}_ms"] for g in got], np.float64) for name in COLLECTIVES}



def calibrate(sim: Simulator, tl: TableList, cluster: Cluster, hw, batch_size: int, cfg: CalibrationConfig,
              ids_path=None, log=print) -> tuple[Simulator, dict]:
    """Measure, fine-tune and check (module docstring); returns the calibrated simulator and a report."""
    cfg.check()
    t0 = time.perf_counter()
    task, N = tl.task, cluster.num_devices
    shards = sample_user_shards(task, cluster, cfg.num_shards, cfg.seed)
    dmp_plans = sample_user_plans(task, cluster, cfg.dmp_plans, cfg.seed) if cfg.dmp_plans else []  # before any work
    log(f"calibrating: measuring {len(shards)} shards of these tables (the heaviest tables alone, the rest "
        f"random; {cfg.warmup_iter} warm-up + {cfg.num_iter} timed iterations each, {hw.backend}/{hw.device}) "
        f"and {cfg.comm_layouts} all-to-all layouts of their dims on {N} ranks"
        f"{' (and of their input distribution)' if sim.inp is not None else ''}"
        f"{' and as many widths of the row-wise and data-parallel collectives' if sim.coll is not None else ''}")
    with tempfile.TemporaryDirectory(prefix="neuroshard-calibrate-") as tmp:
        ds = user_tables_dataset(tl, batch_size, cfg.seed, Path(tmp), ids_path)
        y = measure_shards(ds, hw, batch_size, shards, cfg.warmup_iter, cfg.num_iter)
        dmp_ms = measure_plans_dmp(tl, dmp_plans, ds, hw, batch_size, N, cfg.dmp_rounds,
                                   MEASURE_WARMUP_ITER, MEASURE_NUM_ITER, log) if dmp_plans else None
    measured, in_words, reference, spread_ms = measure_comm(sim, task, shards, y, N, batch_size, hw, cfg)
    measured_s = time.perf_counter() - t0
    calibrated, reports = fine_tune_models(sim, task, shards, measured, in_words, cfg)
    step_fit, rep_step = None, None
    if dmp_plans:
        step_fit, rep_step, measured["dmp"] = fit_to_steps(calibrated, task, dmp_plans, dmp_ms, held_out_split,
                                                           cfg.seed, log)
    report = {**reports, "step": rep_step, "step_fit": None if step_fit is None else step_fit.to_dict(),
              "comm_max_spread_ms": spread_ms, "reference": reference,
              "measured": measured, "measure_s": measured_s,
              "total_s": time.perf_counter() - t0, "config": asdict(cfg), "provenance": provenance()}
    log_report(report, measured_s, log)
    return calibrated.with_step_fit(step_fit), report


def measure_comm(sim: Simulator, task, shards, y: np.ndarray, N: int, batch_size: int, hw,
                 cfg: CalibrationConfig) -> tuple[dict, np.ndarray | None, list[dict], float]:
    """The all-to-all layouts (and the drift reference's) and, with an input-distribution model, the input
    layouts, measured on N ranks; every measurement checked. Returns (measured, the input layouts' words per rank
    or None, the drift reference, the layouts' straggler spread ms)."""
    spread_ms = max(MIN_SPREAD_MS, float(np.nanmax(y)))  # plans' straggler delays reach about a device's compute
    layouts = comm_layouts(task, N, cfg.comm_layouts, cfg.seed, spread_ms)
    reference = drift_reference(shards, y, held_out_split(len(shards), cfg.seed)[1], N, cfg.seed)
    # the all-to-all the comm models know: DCT-MP's compressed one for models trained with --mp_keep
    fw_y, bw_y = measure_layouts(layouts + reference_layouts(reference), N, batch_size, hw,
                                 cfg.warmup_iter, cfg.num_iter, sim.mp_keep)
    for g, b in zip(reference, bw_y[len(layouts):]):
        g["bw_ms"] = [float(v) for v in b]
    fw_y, bw_y = fw_y[:len(layouts)], bw_y[:len(layouts)]
    # TorchRec's input distribution, where there is a model of it to fine-tune, N tables to place and TorchRec
    in_layouts = input_layouts(task, N, cfg.comm_layouts, cfg.seed) \
        if sim.inp is not None and task.num_tables >= N and torchrec_available() else []
    in_words, in_y = (measure_input_layouts(in_layouts, N, batch_size, hw, cfg.warmup_iter,
                                            cfg.num_iter) if in_layouts else (None, None))
    # the row-wise and data-parallel collectives, where the step cost prices them by their own costs
    widths = collective_widths(task, cfg.comm_layouts, cfg.seed) if sim.coll is not None else []
    coll_y = measure_collective_widths(widths, N, batch_size, hw, cfg.warmup_iter, cfg.num_iter) if widths else {}
    for what, values, positive in (("compute", y, True), ("forward all-to-all", fw_y, False),
                                   ("backward all-to-all", bw_y, False),
                                   *((("input distribution", in_y, True),) if in_layouts else ()),
                                   *((name.replace("_", "-"), v, True) for name, v in coll_y.items())):
        refuse_implausible(values, what, positive)
    measured = {"shards": [[[int(t), int(d)] for t, d in zip(*sh)] for sh in shards],
                "compute_ms": [float(v) for v in y],
                "layouts": [{"dims": [int(v) for v in d], "delays_ms": [float(v) for v in w]} for d, w in layouts],
                "fw_ms": fw_y.tolist(), "bw_ms": bw_y.tolist()}
    if in_layouts:
        measured.update(input_layouts=in_layouts, input_ms=in_y.tolist())
    if widths:
        measured["collectives"] = {"widths": widths, **{f"{k}_ms": v.tolist() for k, v in coll_y.items()}}
    return measured, in_words, reference, spread_ms


def fine_tune_models(sim: Simulator, task, shards, measured: dict, in_words: np.ndarray | None,
                     cfg: CalibrationConfig) -> tuple[Simulator, dict]:
    """Each model fine-tuned on two thirds of its measurements and kept where its held-out error is not worse:
    the calibrated simulator (no step fit yet) and a report per model."""
    inp, rep_in = sim.inp, None
    if "input_ms" in measured:
        itune, iheld = held_out_split(len(measured["input_layouts"]), cfg.seed + 2)
        inp, rep_in = fine_tune_kept(sim.inp, (in_words.astype(np.float32),),
                                     np.asarray(measured["input_ms"], np.float32), itune, iheld, cfg, copy_model)
    compute, rep_c = fine_tune_compute(sim.compute, task, shards, measured["compute_ms"], cfg)
    layouts = measured["layouts"]
    dims = np.array([lay["dims"] for lay in layouts], np.float32)
    delays = np.array([lay["delays_ms"] for lay in layouts], np.float32)
    ctune, cheld = held_out_split(len(layouts), cfg.seed + 1)
    fw, rep_fw = fine_tune_kept(sim.fw, (np.concatenate([dims, delays], axis=1),),
                                np.asarray(measured["fw_ms"], np.float32), ctune, cheld, cfg, copy_model)
    bw, rep_bw = fine_tune_kept(sim.bw, (dims,), np.asarray(measured["bw_ms"], np.float32), ctune, cheld, cfg,
                                copy_model)
    coll, rep_coll = fit_collectives(sim.coll, measured.get("collectives"), cfg)
    report = {"compute": rep_c, "fw": rep_fw, "bw": rep_bw, "input": rep_in, "collectives": rep_coll}
    return Simulator(compute, fw, bw, inp=inp, coll=coll), report


def fit_collectives(coll: CollectiveModels | None, measured: dict | None, cfg: CalibrationConfig
                    ) -> tuple[CollectiveModels | None, dict | None]:
    """Each collective's line fitted afresh (`relative_fit`) on two thirds of the widths measured (each width's
    cost: the mean over ranks, as the collector's fit takes it), kept where its held-out MAPE is not worse than the
    pre-trained line's: the collectives' costs and a report per collective (None, None without them)."""
    if coll is None or not measured:
        return coll, None
    w = np.asarray(measured["widths"], np.float64)
    tune, held = held_out_split(len(w), cfg.seed + 3)
    costs, report = dict(coll.costs), {}
    for name in COLLECTIVES:
        y = np.asarray(measured[f"{name}_ms"], np.float64).mean(axis=1)
        fit = relative_fit(w[tune], y[tune])
        report[name] = kept_report(coll.costs[name].predict_np(w[held]), fit.predict_np(w[held]), y[held], tune, held)
        if report[name]["kept"]:
            costs[name] = CollectiveCost(fit.latency_ms, fit.ms_per_width, report[name]["after"]["mape"])
    meta = {**coll.meta, "calibrated": sorted(k for k, r in report.items() if r["kept"])}
    return CollectiveModels(coll.num_devices, coll.batch_size, costs, meta), report


def log_report(report: dict, measured_s: float, log) -> None:
    """Each model's held-out error before and after, and the time calibrating took."""
    coll = report.get("collectives") or {}
    for name, r in (("compute", report["compute"]), ("fw comm", report["fw"]), ("bw comm", report["bw"]),
                    ("input", report["input"]), *((k.replace("_", "-"), v) for k, v in coll.items())):
        if r is None:
            continue
        b, a = r["before"], r["after"]
        log(f"  {name:<14} held-out MAPE {100 * b['mape']:6.1f}% -> {100 * a['mape']:6.1f}%   Spearman "
            f"{b['spearman']:.3f} -> {a['spearman']:.3f}   ({r['samples']['fine_tune']} fine-tune / "
            f"{r['samples']['held_out']} held out){'' if r['kept'] else '  (not better: pre-trained model kept)'}")
    log(f"  calibration took {report['total_s']:.0f} s ({measured_s:.0f} s measuring)")
