"""Calibration where the search goes (issue 63, item 3: "learn where the search goes").

`calibrate` measures random shards of the user's tables. The search then keeps, out of thousands of placements, the
one its calibrated models rate lowest, so where those models err low on a device's shards, that error wins the
selection (docs/findings.md). `refine` closes the loop for the user's tables, a round at a time:
1. search with the current models;
2. measure each device's shards of that plan that no calibration round has measured, exactly as calibration
   measures them (one worker, cache flushed, median of the timed iterations), and the plan's all-to-all layout
   (its dim sums, each rank starting after the delay the models give it) if no round has measured it, on N ranks;
   note the models' error on both before they are learned (the selection's optimism, on the plans the search
   actually picks);
3. fine-tune the pre-trained compute and forward / backward comm models again on calibration's fine-tune
   measurements plus every one measured here, each kept only where calibration's held-out measurements are not
   priced worse (the same rule as `calibrate`);
4. search again.
It stops when the search's plan has nothing unmeasured (every device's shards and its layout are priced from a fit
to their own measurements) or after `rounds`. Each round costs one search, at most one measured shard per device
and one all-to-all layout.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..core.costs import Cluster
from ..core.errors import check_int
from ..data.table_list import TableList
from ..sharding.plan import Placement
from ..sharding.simulator import Simulator
from .calibrate import CalibrationConfig, measure_layouts, measure_shards, refuse_implausible
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
    """One round: what was measured and the models' ms for it before it was learned."""
    shards: list[list[list[int]]] = field(default_factory=list)  # per shard its [table, dim] pairs
    measured_ms: list[float] = field(default_factory=list)       # the shards' compute
    predicted_ms: list[float] = field(default_factory=list)
    dim_sums: list[int] | None = None                             # the plan's layout, if it was new
    comm_measured_ms: list[float] | None = None                   # per rank forward + backward all-to-all
    comm_predicted_ms: list[float] | None = None
    kept: dict = field(default_factory=dict)  # per refit model, whether it was kept

    @property
    def predicted_over_measured(self) -> float:
        """Median of the models' / the measured ms of this round's shards (below 1: the search's optimism)."""
        if not self.measured_ms:
            return float("nan")
        return float(np.median(np.array(self.predicted_ms) / np.array(self.measured_ms)))

    @property
    def comm_predicted_over_measured(self) -> float:
        """The models' / the measured all-to-all ms of the plan's slowest rank by measurement."""
        if self.comm_measured_ms is None:
            return float("nan")
        r = int(np.argmax(self.comm_measured_ms))
        return float(self.comm_predicted_ms[r] / self.comm_measured_ms[r])


def check_rounds(rounds: int, what: str = "--refine") -> int:
    check_int(what, rounds, 0, MAX_REFINE_ROUNDS)
    return rounds


def _refit(models: dict, name: str, pretrained, inputs, y, n_cal: int, tune, held, cfg) -> bool:
    """The pre-trained model fine-tuned on calibration's fine-tune part and every refine measurement (from n_cal
    on); it replaces `models[name]` only where calibration's held-out part is not priced worse than by the
    pre-trained model (otherwise the model in use stays). Returns whether it did."""
    fit = np.concatenate([tune, np.arange(n_cal, len(y))])
    tuned, rep = fine_tune_kept(pretrained, inputs, np.asarray(y, np.float32), fit, held, cfg, copy_model)
    if rep["kept"]:
        models[name] = tuned
    return bool(rep["kept"])


def refine(sim0: Simulator, sim_cal: Simulator, cal_report: dict, tl: TableList, cluster: Cluster, hw,
           batch_size: int, cfg: CalibrationConfig, search: Callable[[Simulator], Placement | None], rounds: int,
           ids_path=None, log=print) -> tuple[Simulator, Placement | None, dict]:
    """The module docstring's loop from `calibrate`'s result (`sim_cal`, `cal_report`; `sim0` the pre-trained
    simulator it was calibrated from). Returns (the refined simulator, the search's last plan, a report)."""
    check_rounds(rounds)
    t0 = time.perf_counter()
    task, N = tl.task, cluster.num_devices
    measured = cal_report["measured"]
    shards = [(np.array([t for t, _ in sh], np.int64), np.array([d for _, d in sh], np.int64))
              for sh in measured["shards"]]
    y = [float(v) for v in measured["compute_ms"]]
    n_shards = len(shards)
    tune, held = held_out_split(n_shards, cfg.seed)  # calibration's splits: its held-out part stays held out
    layouts = [np.concatenate([lay["dims"], lay["delays_ms"]]).astype(np.float32) for lay in measured["layouts"]]
    fw_y, bw_y = [list(map(float, v)) for v in measured["fw_ms"]], [list(map(float, v)) for v in measured["bw_ms"]]
    n_layouts = len(layouts)
    ctune, cheld = held_out_split(n_layouts, cfg.seed + 1)
    known = {shard_key(s) for s in shards}
    known_dims = {tuple(int(v) for v in lay["dims"]) for lay in measured["layouts"]}
    models = {"compute": sim_cal.compute, "fw": sim_cal.fw, "bw": sim_cal.bw}

    def unmeasured(plan: Placement) -> tuple[list, np.ndarray, bool]:
        """The plan's device shards nothing measured yet, its dim sums, and whether no layout of them was."""
        dims = plan.device_dim_sums()
        return ([s for s in device_shards(plan) if shard_key(s) not in known], dims,
                tuple(int(v) for v in dims) not in known_dims)

    sim, plan, done = sim_cal, search(sim_cal), []
    with tempfile.TemporaryDirectory(prefix="neuroshard-refine-") as tmp:
        ds = None
        for r in range(rounds):
            if plan is None:
                break
            new, dims, new_layout = unmeasured(plan)
            if not new and not new_layout:
                break
            rnd = RefineRound()
            if new:
                if ds is None:  # the same synthetic ids as calibration's (same seed)
                    ds = user_tables_dataset(tl, batch_size, cfg.seed, Path(tmp), ids_path)
                pred = sim.compute.predict(*compute_arrays(task.data_features, new))
                got = refuse_implausible(measure_shards(ds, hw, batch_size, new, cfg.warmup_iter, cfg.num_iter),
                                         "compute", doing="refining")
                shards += new
                y += [float(v) for v in got]
                known |= {shard_key(s) for s in new}
                rnd.kept["compute"] = _refit(models, "compute", sim0.compute,
                                             compute_arrays(task.data_features, shards), y, n_shards, tune, held, cfg)
                rnd.shards = [[[int(t), int(d)] for t, d in zip(*sh)] for sh in new]
                rnd.measured_ms, rnd.predicted_ms = [float(v) for v in got], [float(v) for v in pred]
            if new_layout:  # the delays the models give this plan's ranks (their compute and what comes before the
                # forward all-to-all, as the simulator's cost adds them)
                cost = sim.plan_cost(task, plan)
                ready = np.asarray(cost.compute_ms) + np.asarray(cost.bw_ms)
                delays = ready - ready.min()
                fw_m, bw_m = measure_layouts([(dims, delays)], N, batch_size, hw, cfg.warmup_iter, cfg.num_iter,
                                             sim.mp_keep)
                refuse_implausible(np.concatenate([fw_m[0], bw_m[0]]), "all-to-all", False, "refining")
                layouts.append(np.concatenate([dims, delays]).astype(np.float32))
                fw_y.append([float(v) for v in fw_m[0]])
                bw_y.append([float(v) for v in bw_m[0]])
                known_dims.add(tuple(int(v) for v in dims))
                lay = np.stack(layouts)
                rnd.kept["fw"] = _refit(models, "fw", sim0.fw, (lay,), fw_y, n_layouts, ctune, cheld, cfg)
                rnd.kept["bw"] = _refit(models, "bw", sim0.bw, (lay[:, :N],), bw_y, n_layouts, ctune, cheld, cfg)
                rnd.dim_sums = [int(v) for v in dims]
                rnd.comm_measured_ms = [float(a + b) for a, b in zip(fw_m[0], bw_m[0])]
                x = np.concatenate([dims, delays])[None].astype(np.float64)
                rnd.comm_predicted_ms = (sim.fw.predict_np(x) + sim.bw.predict_np(x[:, :N]))[0].tolist()
            done.append(rnd)
            log(f"  refine round {r + 1}: {len(new)} new device shard(s) of the search's plan"
                f"{' and its all-to-all layout' if new_layout else ''}; models' / measured before learning them: "
                f"compute {rnd.predicted_over_measured:.3f}, all-to-all {rnd.comm_predicted_over_measured:.3f}; "
                f"refit and kept: {', '.join(k for k, v in rnd.kept.items() if v) or 'none'}")
            sim = sim_cal.with_models(**models)
            plan = search(sim)
    new, _, new_layout = unmeasured(plan) if plan is not None else ([None], None, True)
    fixed = not new and not new_layout  # everything of the plan returned was measured
    report = {"rounds": [{**asdict(d), "predicted_over_measured": d.predicted_over_measured,
                          "comm_predicted_over_measured": d.comm_predicted_over_measured} for d in done],
              "fixed_point": fixed, "shards_measured": sum(len(d.measured_ms) for d in done),
              "layouts_measured": sum(d.dim_sums is not None for d in done),
              "seconds": time.perf_counter() - t0}
    log(f"  refining: {len(done)} round(s), {report['shards_measured']} shard(s) and {report['layouts_measured']} "
        f"layout(s) measured, {'everything of the final plan measured' if fixed else 'stopped at the round limit'}, "
        f"{report['seconds']:.0f} s")
    return sim, plan, report
