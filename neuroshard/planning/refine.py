"""Calibration where the search goes (issue 63, item 3: "learn where the search goes").

`calibrate` measures random shards of the user's tables. The search then keeps, out of thousands of placements, the
one its calibrated models rate lowest, so where those models err low on a device's shards, that error wins the
selection (docs/findings.md). `refine` closes the loop for the user's tables, a round at a time:
1. search with the current models;
2. measure each device's shards of that plan that no calibration round has measured, exactly as calibration
   measures them (one worker, cache flushed, median of the timed iterations), and note the models' error on them
   before they are learned (the selection's optimism, on the plans the search actually picks);
3. fine-tune the pre-trained compute model again on calibration's fine-tune shards plus every shard measured here,
   kept only where calibration's held-out shards are not priced worse (the same rule as `calibrate`);
4. search again.
It stops when the search's plan has no unmeasured shard (every device of it is priced from a fit to its own
measurement) or after `rounds`. The comm models are not touched: all-to-all layouts are not where the search's
optimism was found. Each round costs one search and at most one measured shard per device.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..core.costs import Cluster, implausible_ms
from ..core.errors import UserError, check_int
from ..data.table_list import TableList
from ..hardware.engine import EngineSettings, measure_fixed
from ..sharding.plan import Placement
from ..sharding.simulator import Simulator
from .calibrate import CalibrationConfig, measure_shards
from .fine_tune import compute_arrays, copy_model, fine_tune_kept, held_out_split
from .user_data import user_tables_dataset

MAX_REFINE_ROUNDS = 20  # --refine at most


def device_shards(plan: Placement) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each non-empty device's shards of a plan as calibration names them: (table positions, dims)."""
    return [(np.array([s.table for s in dev], np.int64), np.array([s.dim for s in dev], np.int64))
            for dev in plan.per_device() if dev]


def shard_key(shard) -> tuple:
    """One device's shards, order-free: what it costs depends on which (table, dim) it holds, not their order."""
    return tuple(sorted(zip((int(t) for t in shard[0]), (int(d) for d in shard[1]))))


@dataclass
class RefineRound:
    """One round: the shards measured, their measured ms and the models' ms for them before they were learned."""
    shards: list[list[list[int]]] = field(default_factory=list)  # per shard its [table, dim] pairs
    measured_ms: list[float] = field(default_factory=list)
    predicted_ms: list[float] = field(default_factory=list)
    kept: bool = False  # whether the refit compute model was kept (calibration's held-out shards not priced worse)

    @property
    def predicted_over_measured(self) -> float:
        """Median of the models' / the measured ms of this round's shards (below 1: the search's optimism)."""
        return float(np.median(np.array(self.predicted_ms) / np.array(self.measured_ms)))


def measure_plans_compute(ds, hw, batch_size: int, plans, N: int, known: set, cfg: CalibrationConfig):
    """Each plan's devices measured together on N ranks (one round of the measurement engine); the device shards
    not in `known` (first occurrence) and their compute ms."""
    items = [[[(s.table, s.dim) for s in dev] for dev in p.per_device()] for p in plans]
    measured = measure_fixed(EngineSettings(str(ds.path), hw, batch_size, cfg.warmup_iter, cfg.num_iter,
                                            shuffle=False), items, N)
    new, got, seen = [], [], set(known)
    for p, m in zip(plans, measured):
        for dev, ms in zip(p.per_device(), m.compute_ms):
            sh = (np.array([s.table for s in dev], np.int64), np.array([s.dim for s in dev], np.int64))
            if dev and shard_key(sh) not in seen:
                seen.add(shard_key(sh))
                new.append(sh)
                got.append(float(ms))
    return new, np.array(got)


def check_rounds(rounds: int, what: str = "--refine") -> int:
    check_int(what, rounds, 0, MAX_REFINE_ROUNDS)
    return rounds


def refine(sim0: Simulator, sim_cal: Simulator, cal_report: dict, tl: TableList, cluster: Cluster, hw,
           batch_size: int, cfg: CalibrationConfig, search: Callable[[Simulator], Placement | None], rounds: int,
           ids_path=None, log=print, concurrent: bool = False, anchors: tuple = ()
           ) -> tuple[Simulator, Placement | None, dict]:
    """The module docstring's loop from `calibrate`'s result (`sim_cal`, `cal_report`; `sim0` the pre-trained
    simulator it was calibrated from). Returns (the refined simulator, the search's last plan, a report)."""
    check_rounds(rounds)
    t0 = time.perf_counter()
    task = tl.task
    measured = cal_report["measured"]
    shards = [(np.array([t for t, _ in sh], np.int64), np.array([d for _, d in sh], np.int64))
              for sh in measured["shards"]]
    y = [float(v) for v in measured["compute_ms"]]
    tune, held = held_out_split(len(shards), cfg.seed)  # calibration's split: its held-out shards stay held out
    known = {shard_key(s) for s in shards}
    sim, plan, done = sim_cal, search(sim_cal), []
    with tempfile.TemporaryDirectory(prefix="neuroshard-refine-") as tmp:
        ds = None
        for r in range(rounds):
            if plan is None:
                break
            new = [s for s in device_shards(plan) if shard_key(s) not in known]
            if not new:
                break
            if ds is None:  # the same synthetic ids as calibration's (same seed)
                ds = user_tables_dataset(tl, batch_size, cfg.seed, Path(tmp), ids_path)
            if concurrent:  # the plan's devices measured together on N ranks, as --measure runs them
                new, got = measure_plans_compute(ds, hw, batch_size, [plan, *(anchors if r == 0 else ())],
                                                 cluster.num_devices, known, cfg)
            else:
                got = measure_shards(ds, hw, batch_size, new, cfg.warmup_iter, cfg.num_iter)
            pred = sim.compute.predict(*compute_arrays(task.data_features, new))
            why = implausible_ms(got, True)
            if why:
                raise UserError(f"refining measured a compute cost that cannot be true ({why}): the timer or a worker "
                                "failed; rerun the same command (nothing was saved)")
            shards += new
            y += [float(v) for v in got]
            known |= {shard_key(s) for s in new}
            fit = np.concatenate([tune, np.arange(len(measured["shards"]), len(shards))])
            compute, rep = fine_tune_kept(sim0.compute, compute_arrays(task.data_features, shards),
                                          np.asarray(y, np.float32), fit, held, cfg, copy_model)
            done.append(RefineRound([[[int(t), int(d)] for t, d in zip(*sh)] for sh in new], [float(v) for v in got],
                                    [float(v) for v in pred], bool(rep["kept"])))
            log(f"  refine round {r + 1}: {len(new)} new device shard(s) of the search's plan; models' / measured "
                f"{done[-1].predicted_over_measured:.3f} before learning them; compute model "
                f"{'refit' if rep['kept'] else 'kept as calibrated (refit priced held-out shards worse)'}")
            if rep["kept"]:
                sim = sim_cal.with_compute(compute)
            plan = search(sim)
    fixed = plan is not None and all(shard_key(s) in known for s in device_shards(plan))
    report = {"rounds": [{"shards": d.shards, "measured_ms": d.measured_ms, "predicted_ms": d.predicted_ms, "kept": d.kept,
                          "predicted_over_measured": d.predicted_over_measured} for d in done],
              "fixed_point": fixed, "shards_measured": sum(len(d.measured_ms) for d in done),
              "seconds": time.perf_counter() - t0}
    log(f"  refining: {len(done)} round(s), {report['shards_measured']} shard(s) measured, "
        f"{'every device shard of the final plan measured' if fixed else 'stopped at the round limit'}, "
        f"{report['seconds']:.0f} s")
    return sim, plan, report
