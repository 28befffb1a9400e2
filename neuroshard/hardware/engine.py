"""The measurement engine (DESIGN.md §3.7): how eval.py, `--measure` and calibration measure on hardware.

One worker, `rounds_rank`, runs on every rank and takes one `Job`: the engine's `EngineSettings` (dataset,
hardware, batch, warm-up and timed iterations per round, DCT-MP's `mp_keep`, round order, and the `step`),
groups of items to measure, a stop rule and an optional drift reference. Each group is measured in
interleaved rounds: every round measures every item of the group still in the race once (A B C A B C ...;
with `shuffle` in an order shuffled per round, seeded and the same on every rank, so neither a slow period
nor a place in the round favours one item). After each round rank 0 emits (group, round, costs [P (+1), N,
3]: per item, every rank's [compute, fw, bw] ms, NaN for an item not measured that round) and asks the stop
rule `stop(round_costs [R, P (+1)], last_round_s)` and, if it has one, `stop.active(round_costs)` (bool [P]:
what the next round measures); both answers are broadcast so every rank stops, and measures, together.
eval.py and calibration stop after a fixed number of rounds (`FixedRounds`); `--measure` stops when its best
plan is told apart, races and measures a drift reference (`planning/measure.py`).

**How one round of an item is measured is the pluggable part**: `EngineSettings.step`, a class built once
per rank as `step(settings, rank, world)` whose `measure(item)` all ranks call together and which returns
every rank's [compute, fw, bw] ms. `EmulatedStep` (the default) emulates independent devices as the
simulator and the paper do: compute one rank at a time (ranks sharing a machine do not disturb each other),
then the backward all-to-all with all ranks together, then the forward all-to-all with each rank starting
after its delay d_r = (compute_r + bw_r) - min_r(...), as in training. An item is a plan (per device, the
(dataset table, dim) of each shard; a column twin reads its parent table's ids at its own dim; on one rank
without a process group: a shard, compute only), a `StepPlan` (a plan as the step cost prices it: a row block
computes the ids that fall in its rows, a data-parallel replica its rank's local batch, in an operator of the
replicas alone; after the compute, per
sharding group present TorchRec's input distribution of the group's ids and the backward (all-to-all; a row-wise
group's all-gather; the replicas' gradient all-reduce asynchronous beside the other backwards, as DDP runs it),
then the forwards (all-to-all; a row-wise group's
reduce-scatter), the first after each rank's delay) or a `Layout` (an all-to-all alone, with given delays). With
`mp_keep` both all-to-alls are DCT-MP's compressed ones (`comm_bench.make_all_to_all`). Another step (e.g. a
framework's own training step of the plan) plugs in by subclassing `Step`.

**A plan's measured cost** (`Measured`): a round's cost is max_r (compute_r + fw_r + bw_r); the plan's cost
is the geometric mean of its round costs, with a Student-t 95% interval of it over rounds
(`core.intervals.paired_interval`); its per-device parts are the median over rounds of each part.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np

from ..core.costs import Cost
from ..core.errors import UserError
from ..core.intervals import geo_mean, paired_interval
from ..data.dataset import DLRMDataset
from ..sharding.simulator import ALL_TO_ALL, GROUPS, REPLICA_GROUP, ROW_GROUPS
from ..sharding.torchrec_export import placement_rank
from .backends import Hardware
from .comm_bench import (Collectives, InputDist, gather_floats, make_all_to_all, timed_collective,
                         torchrec_available)
from .compute_bench import ComputeBenchmark, ShardView
from .launch import run_processes



# ----------------------------------------------------------------------------- settings and items

@dataclass(frozen=True)
class EngineSettings:
    """How the engine measures: the one settings object every engine worker takes."""

    dataset_dir: str | None       # the tables' ids (None: only `Layout`s are measured)
    hw: Hardware
    batch_size: int
    warmup: int                   # warm-up iterations of each item in each round
    iters: int                    # timed iterations of each item in each round (their median)
    mp_keep: float | None = None  # DCT-MP's compressed all-to-alls (None: uncompressed)
    shuffle: bool = True          # each round in a seeded shuffled order (False: item order)
    step: type | None = None      # how one round of an item is measured (None: `EmulatedStep`)
    rebuild_every: int = 0        # a step that builds state per item (`DMPStep`) builds it again after this many
                                  # of its measurements, so rounds sample builds too (0: never)


@dataclass(frozen=True)
class Layout:
    """An all-to-all alone: each rank's dim sum and start delay (ms); nothing computed."""

    dim_sums: tuple
    delays_ms: tuple


def plan_device_tables(task, plan) -> list[list[tuple[int, int]]]:
    """Per device, the (dataset table id, dim) of each shard it owns: the engine's item for a plan under the paper's
    cost (whole tables and column shards: a row block or replica is measured as the step cost prices it)."""
    if (task.pinned_ranks([s.table for s in plan.shards]) >= 0).any():
        raise UserError("the paper's cost has no row-wise or data-parallel tables; measure this plan under the step "
                        "cost (--cost step)")
    return [[(int(task.table_ids[s.table]), int(s.dim)) for s in dev] for dev in plan.per_device()]


class StepShard(NamedTuple):
    """One shard of a `StepPlan`: its dataset table, columns, sharding group (`simulator.GROUPS`), the lookups per
    sample its input distribution carries (its table's pooling factor; a row block's share of it), and what part of
    the table it computes: rows `row_lo` to `row_lo + rows` for a row block (`rows` 0: the whole table), or with
    `replica` >= 0 that rank's local batch (a data-parallel replica; `rows` then counts the table's rows, whose
    gradient it all-reduces)."""

    table: int
    dim: int
    group: int
    pooling: float
    row_lo: int = 0
    rows: int = 0
    replica: int = -1

    def view(self, world: int) -> ShardView | None:
        """What its compute reads (`compute_bench.ShardView`); None for a whole table at the global batch."""
        if self.replica >= 0:
            return ShardView(replica=self.replica, world=world)
        return ShardView(self.row_lo, self.rows) if self.rows > 0 else None


@dataclass(frozen=True)
class StepPlan:
    """A plan measured as the step cost prices it (`Simulator(cost="step")`): per device its `StepShard`s."""

    devices: tuple

    def group(self, g: int) -> tuple[list[int], list[list[float]]]:
        """Group g's per-device dim sums and the pooling factors of the features each device receives."""
        return ([sum(s.dim for s in dev if s.group == g) for dev in self.devices],
                [[s.pooling for s in dev if s.group == g] for dev in self.devices])

    def gradient_floats(self) -> list[int]:
        """Per device, the floats of its data-parallel replicas' gradients (rows x dim each), all-reduced."""
        return [sum(s.rows * s.dim for s in dev if s.group == REPLICA_GROUP) for dev in self.devices]


def plan_step_item(task, plan) -> StepPlan:
    """The engine's item for a plan under the step cost: its shards by device with their sharding group
    (`ShardingTask.shard_groups`, the simulator's rule), their table's pooling factor (a row block's: its share, as
    the task holds it) and, for a row block, its rows of the table (TorchRec's cut: the blocks of one table in rank
    order), for a replica its rank's local batch."""
    shards = plan.shards
    tables = [s.table for s in shards]
    group = task.shard_groups(tables, [s.dim for s in shards])
    block = task.row_block if task.row_block is not None else np.full(task.num_tables, -1)
    replica = task.replica if task.replica is not None else np.full(task.num_tables, -1)
    first_row, next_row = {}, {}  # a row block's first row: the rows of its table's blocks on lower ranks
    for t in sorted(np.flatnonzero(np.asarray(block) >= 0), key=lambda t: int(block[t])):
        key = int(task.table_ids[t])
        first_row[t] = next_row.get(key, 0)
        next_row[key] = first_row[t] + int(task.rows[t])
    devices: list[list] = [[] for _ in range(plan.num_devices)]
    for i, (s, d) in enumerate(zip(shards, plan.device_of)):
        t = s.table
        row_lo, rows = (first_row[t], int(task.rows[t])) if block[t] >= 0 else (0, 0)
        if replica[t] >= 0:
            rows = int(task.rows[t])
        devices[d].append(StepShard(int(task.table_ids[t]), int(s.dim), int(group[i]),
                                    float(task.pooling_factors[t]), row_lo, rows, int(replica[t])))
    return StepPlan(tuple(tuple(dev) for dev in devices))


def spec_step_item(spec: dict, world: int, table_ids, pooling, lookup_share: Callable[[int, int, int], float]
                   ) -> StepPlan:
    """The engine's step item for a plan given as a spec: an export spec (`torchrec_export.plan_spec`, with
    `NeuroShardPlanner`'s sharding types and row blocks) or a TorchRec planner's plan (`incumbent.parameter_specs`,
    `"torchrec": True`) on `world` ranks. Spec table i reads dataset table `table_ids[i]` with `pooling[i]` lookups a sample; a row
    block's input carries `lookup_share(i, first row, rows)` of them (its share of the table's ids). A table's
    group is its sharding type's (`simulator.GROUPS`; a spec table without one: table-wise whole, column-wise
    split)."""
    devices: list[list] = [[] for _ in range(world)]
    for i, t in enumerate(spec["tables"]):
        kind = t.get("sharding_type") or ("table_wise" if len(t["shards"]) == 1 else "column_wise")
        g, table, p = GROUPS.index(kind), int(table_ids[i]), float(pooling[i])
        if spec.get("torchrec"):  # shards of [rows, columns] at [row, column] offsets, on "rank:R/device"
            placed = [(placement_rank(s["placement"]), *s["offsets"], *s["sizes"]) for s in t["shards"]]
            if kind == "data_parallel":
                placed = [(r, 0, 0, t["rows"], t["dim"]) for r in t["ranks"]]
        else:  # col_offset, width, rank (and a row block's row_offset, rows)
            placed = [(s["rank"], s.get("row_offset", 0), s["col_offset"], s.get("rows", t["rows"]), s["width"])
                      for s in t["shards"]]
        for rank, row_lo, _, rows, cols in placed:
            if kind == "data_parallel":
                shard = StepShard(table, int(cols), g, p / len(placed), 0, int(t["rows"]), int(rank))
            elif g in ROW_GROUPS:
                shard = StepShard(table, int(cols), g, p * lookup_share(i, int(row_lo), int(rows)), int(row_lo),
                                  int(rows))
            else:
                shard = StepShard(table, int(cols), g, p)
            devices[int(rank)].append(shard)
    return StepPlan(tuple(tuple(dev) for dev in devices))


# ----------------------------------------------------------------------------- how one round is measured

class Step:
    """How one round of one item is measured; built once per rank. `measure(item)` is called by all ranks
    together and returns every rank's [compute, fw, bw] ms ([world][3]).

    A step also says, before any rank starts, what it measures: `item(task, plan, spec)` is the item of a
    `Placement` of a `ShardingTask` (`spec`: the plan as `torchrec_export.plan_spec` describes it, for steps that
    build the framework's own model), `reference_items` the items of a calibration's drift reference and `drift`
    what the reference measured in the rounds, against when it was calibrated. The measurement path asks the step
    and never which step it is."""

    describes = ""       # how a log line words what is measured (after "measuring N plans")
    measured_cost = "paper"  # the simulated cost this step measures: "paper" or "step"
    rebuild_every = 0    # a step that builds state per item builds it again after this many measurements (0: never)

    def __init__(self, settings: EngineSettings, rank: int, world: int):
        self.settings, self.rank, self.world = settings, rank, world

    def measure(self, item) -> list[list[float]]:
        raise NotImplementedError

    @classmethod
    def check_available(cls, num_devices: int) -> None:
        """One line before any work when what this step needs is missing (nothing by default)."""

    @classmethod
    def check_items(cls, items: list, settings: "EngineSettings") -> None:
        """One line, before the ranks start, for an item this step cannot run on `settings`' device (nothing by
        default)."""

    @classmethod
    def item(cls, task, plan, spec: dict):
        """The item measuring `plan` (a `Placement` of `task`'s tables)."""
        raise NotImplementedError

    @classmethod
    def reference_items(cls, reference, task, num_devices: int, spec_of: Callable) -> list:
        """The items of a drift reference, measured one a round beside the candidates (`spec_of(plan)`: a plan's
        spec, for references that are plans)."""
        raise NotImplementedError

    @classmethod
    def drift(cls, reference, ref_rounds: list[np.ndarray], seed: int = 0) -> dict:
        """How much slower (> 1) or faster the reference measured in the rounds than when calibrating."""
        raise NotImplementedError


def _grouped() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


class EmulatedStep(Step):
    """Independent devices emulated (module docstring): compute one rank at a time, then the all-to-alls. Its
    item is a plan as the paper cost prices it (`plan_device_tables`); its drift reference is a calibration's
    held-out shards in groups of one per rank (`machine_drift`)."""

    @classmethod
    def item(cls, task, plan, spec: dict):
        return plan_device_tables(task, plan)

    @classmethod
    def reference_items(cls, reference, task, num_devices: int, spec_of: Callable) -> list:
        return [[[(int(task.table_ids[t]), int(d)) for t, d in dev] for dev in g["devices"]] for g in reference]

    @classmethod
    def drift(cls, reference, ref_rounds: list[np.ndarray], seed: int = 0) -> dict:
        return machine_drift(reference, ref_rounds, seed)

    def __init__(self, settings: EngineSettings, rank: int, world: int):
        super().__init__(settings, rank, world)
        self.bench = None  # built before the first round, so that round's time is measuring only
        if settings.dataset_dir is not None:
            s = settings
            self.bench = ComputeBenchmark(DLRMDataset.load(s.dataset_dir), s.hw, s.batch_size, s.warmup, s.iters)

    def _compute(self, mine, views=None) -> float:
        """This rank's compute ms of its (table, dim) shards (each in its `ShardView`, if given), one rank at a
        time (0 for none). Replicas run in an operator of their own at the rank's local batch, as TorchRec runs a
        data-parallel group's lookups, the rest in one operator at the global batch: the sum of the two."""
        import torch.distributed as dist

        compute = 0.0
        views = views or [None] * len(mine)
        for r in range(self.world):
            if r == self.rank:
                for replicas in (False, True):
                    part = [k for k, v in enumerate(views) if (v is not None and v.replica >= 0) == replicas]
                    if part:
                        compute += self.bench.measure([mine[k][0] for k in part], [mine[k][1] for k in part],
                                                      [views[k] for k in part])
            if _grouped():
                dist.barrier()
        return compute

    def measure(self, item) -> list[list[float]]:
        s, rank, grouped = self.settings, self.rank, _grouped()
        compute = 0.0
        if isinstance(item, StepPlan):
            mine = item.devices[rank]
            compute = self._compute([(x.table, x.dim) for x in mine], [x.view(self.world) for x in mine])
            return self._step(item, compute) if grouped else [[compute, 0.0, 0.0]]
        if isinstance(item, Layout):
            dim_sums = [int(d) for d in item.dim_sums]
        else:
            compute = self._compute(item[rank])
            dim_sums = [sum(d for _, d in dev) for dev in item]
        if not grouped:  # one worker: no all-to-all
            return [[compute, 0.0, 0.0]]
        device = s.hw.device
        a2a = make_all_to_all(dim_sums, s.batch_size, rank, device, s.mp_keep)
        bw = timed_collective(a2a.backward, device, 0.0, s.warmup, s.iters)
        if isinstance(item, Layout):
            delay = float(item.delays_ms[rank])
        else:
            ready = np.array([c[0] for c in gather_floats([compute + bw], device)])
            delay = float(ready[rank] - ready.min())
        fw = timed_collective(a2a.forward, device, delay, s.warmup, s.iters)
        return gather_floats([compute, fw, bw], device)

    def _step(self, item: StepPlan, compute: float) -> list[list[float]]:
        """The step cost's collectives (module docstring), per sharding group present in `GROUPS` order: the input
        distribution (TorchRec's KJTAllToAll of the ids the group's shards read; none for replicas) and the
        backward (the all-to-all of the gradients; a row-wise group's all-gather); the replicas' gradient all-reduce
        runs asynchronously beside the other groups' backwards, timed with them as DDP runs it; then the forwards
        (the pooled all-to-all; a row-wise group's reduce-scatter of its partial sums; none for replicas), the first
        group's after each rank's delay, the others' together. Parts:
        [compute, the forwards, the input distributions + backwards], as the simulated step cost's."""
        s, rank, device = self.settings, self.rank, self.settings.hw.device
        N = len(item.devices)
        forwards, backwards, before, all_reduce = [], [], 0.0, None
        for g in range(len(GROUPS)):
            dims, pooling = item.group(g)
            if not any(dims):  # a group absent from the plan runs no collectives
                continue
            if g == REPLICA_GROUP:
                floats = max(item.gradient_floats())  # every rank holds a replica of each data-parallel table
                all_reduce = Collectives(1, s.batch_size, N, device, gradient_floats=floats).ar
                continue
            if ALL_TO_ALL[g]:
                before += timed_collective(InputDist(pooling, s.batch_size, rank, device).run, device, 0.0, s.warmup,
                                           s.iters)
            if g in ROW_GROUPS:  # every rank holds a block of each of the group's tables: one width on all ranks
                coll = Collectives(max(dims), s.batch_size, N, device)
                backwards.append(coll.all_gather)
                forwards.append(coll.reduce_scatter)
            else:
                a2a = make_all_to_all(dims, s.batch_size, rank, device, s.mp_keep)
                backwards.append(a2a.backward)
                forwards.append(a2a.forward)
        if all_reduce is None:
            before += sum(timed_collective(backward, device, 0.0, s.warmup, s.iters) for backward in backwards)
        else:  # DDP's all-reduce of the replicas' gradients, started as the backward starts, beside the others
            before += timed_collective(functools.partial(_beside_all_reduce, all_reduce, backwards), device, 0.0,
                                       s.warmup, s.iters)
        ready = np.array([c[0] for c in gather_floats([compute + before], device)])
        delay = float(ready[rank] - ready.min())
        fw = sum(timed_collective(forward, device, delay if i == 0 else 0.0, s.warmup, s.iters)
                 for i, forward in enumerate(forwards))
        return gather_floats([compute, fw, before], device)


def _beside_all_reduce(gradients, backwards: list) -> None:
    """An asynchronous all-reduce of `gradients` while `backwards` run one after another, then its wait."""
    import torch.distributed as dist

    work = dist.all_reduce(gradients, async_op=True)
    for backward in backwards:
        backward()
    work.wait()


class EmulatedStepCost(EmulatedStep):
    """`EmulatedStep` measuring the step cost (`StepPlan` items: per sharding group present TorchRec's input
    distribution and both all-to-alls), as `Simulator(cost="step")` prices a plan."""

    describes = " as the step cost prices them (per sharding group the input distribution and both all-to-alls)"
    measured_cost = "step"

    @classmethod
    def check_available(cls, num_devices: int) -> None:
        if num_devices > 1 and not torchrec_available():
            raise UserError("--measure of the step cost times TorchRec's input distribution (its KJTAllToAll), and "
                            "torchrec is not installed; install it (make setup installs torchrec 1.9.2) or pass "
                            "--cost paper")

    @classmethod
    def item(cls, task, plan, spec: dict):
        return plan_step_item(task, plan)


def machine_drift(reference: list[dict], ref_rounds: list[np.ndarray], seed: int = 0) -> dict:
    """How much slower (> 1) or faster the reference measured in the rounds than when calibrating: per round
    (group r mod G) the geometric mean over ranks of compute now / then and of backward all-to-all now / then;
    the geometric mean over rounds with a bootstrap 95% interval (rounds resampled)."""
    out = {"rounds": len(ref_rounds), "groups": len(reference)}
    for name, col, key in (("compute", 0, "compute_ms"), ("comm", 2, "bw_ms")):
        per_round = np.array([np.exp(np.log(np.asarray(parts)[:, col] / np.asarray(reference[r % len(reference)][key],
                                                                                  np.float64)).mean())
                              for r, parts in enumerate(ref_rounds)])
        st = paired_interval(per_round, np.ones_like(per_round), method="bootstrap", seed=seed)
        out[name] = {"ratio": st.estimate, "ci_lo": st.lo, "ci_hi": st.hi}
    return out


# ----------------------------------------------------------------------------- a plan's measured cost

def round_cost(parts) -> float:
    """One round's cost of a plan from every rank's [compute, fw, bw] ms: max_r of their sum (NaN: not measured)."""
    p = np.asarray(parts, np.float64)
    return float(p.sum(axis=1).max()) if np.isfinite(p).all() else float("nan")


@dataclass
class Measured:
    """A plan's measurement: each round's cost (NaN: a round it was not measured in) and each round's parts."""

    round_ms: np.ndarray                       # [R]
    round_parts_ms: list = field(default_factory=list)  # per round [N, 3]; may be empty (parts given below)
    parts_ms: np.ndarray | None = None         # [N, 3] median over the measured rounds of each part

    def __post_init__(self):
        self.round_ms = np.asarray(self.round_ms, np.float64)
        if self.parts_ms is None and self.round_parts_ms:
            stack = np.stack([np.asarray(p, np.float64) for p in self.round_parts_ms])
            ok = np.isfinite(stack).all(axis=(1, 2))
            self.parts_ms = np.median(stack[ok], axis=0) if ok.any() else None

    @classmethod
    def from_rounds(cls, round_parts) -> "Measured":
        return cls(np.array([round_cost(p) for p in round_parts]), list(round_parts))

    @property
    def rounds(self) -> int:
        return int(np.isfinite(self.round_ms).sum())

    @property
    def cost_ms(self) -> float:
        """The plan's measured cost: the geometric mean of its round costs."""
        return float(geo_mean(self.round_ms))

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """Student-t `level` interval of the geometric mean over rounds."""
        est = paired_interval(self.round_ms, np.ones_like(self.round_ms), level=level)
        return est.lo, est.hi

    @property
    def compute_ms(self) -> np.ndarray:
        return self.parts_ms[:, 0]

    @property
    def fw_ms(self) -> np.ndarray:
        return self.parts_ms[:, 1]

    @property
    def bw_ms(self) -> np.ndarray:
        return self.parts_ms[:, 2]

    @property
    def parts(self) -> Cost:
        """The per-device median parts as a `Cost` (its own `cost_ms` is theirs, not the plan's)."""
        return Cost(self.compute_ms, self.fw_ms, self.bw_ms)


# ----------------------------------------------------------------------------- the rounds

class FixedRounds:
    """Stop rule of eval.py and calibration: stop after `rounds` rounds, every item measured in each."""

    def __init__(self, rounds: int):
        self.rounds = int(rounds)

    def __call__(self, round_costs, last_round_s: float) -> bool:
        return len(round_costs) >= self.rounds


@dataclass
class Job:
    """What `rounds_rank` measures: groups of items (each raced on its own), the stop rule applied to each
    group, and an optional drift reference (round r also measures reference[r % len], last in the costs)."""

    settings: EngineSettings
    groups: list[list[Any]]
    stop: Callable
    reference: list | None = None


def rounds_rank(rank: int, world: int, emit, job: Job) -> None:
    """The engine's worker: every group's items in interleaved rounds until the stop rule says enough (module
    docstring); rank 0 emits (group, round, costs [P (+1), N, 3])."""
    import torch

    s = job.settings
    step = (s.step or EmulatedStep)(s, rank, world)
    grouped = _grouped()
    ref = job.reference or None
    for g, items in enumerate(job.groups):
        P = len(items)
        active = np.ones(P, bool)
        totals: list[list[float]] = []
        r = 0
        while True:
            t0 = time.perf_counter()
            todo = [i for i in range(P) if active[i]] + ([P] if ref else [])
            order = np.random.default_rng([r, len(todo)]).permutation(len(todo)) if s.shuffle else range(len(todo))
            costs = np.full((P + bool(ref), world, 3), np.nan)
            for j in order:
                i = todo[j]
                costs[i] = step.measure(items[i] if i < P else ref[r % len(ref)])
            answer = torch.zeros(1 + P, dtype=torch.int64, device=s.hw.device)  # [stop, measure item i next...]
            if rank == 0:
                emit((g, r, costs))
                totals.append([round_cost(c) for c in costs])
                done = bool(job.stop(np.array(totals), time.perf_counter() - t0))
                keep = active if done or not hasattr(job.stop, "active") \
                    else np.asarray(job.stop.active(np.array(totals)), bool)
                answer[0] = int(done)
                answer[1:] = torch.as_tensor(keep & active, dtype=torch.int64)
            if grouped:
                import torch.distributed as dist

                dist.broadcast(answer, src=0)
            if int(answer[0]):
                break
            active = answer[1:].cpu().numpy().astype(bool)
            r += 1


def run(job: Job, world: int, on_round: Callable[[int, int, np.ndarray], None], gpu_ids=None) -> None:
    """Run `job` on `world` ranks (one process group; one rank of a job without all-to-alls runs as a worker with
    no group); `on_round(group, round, costs)` gets each round as rank 0 emits it."""
    if not any(job.groups):
        return
    items = [i for g in job.groups for i in g]
    (job.settings.step or EmulatedStep).check_items(items + list(job.reference or ()), job.settings)
    group_device = job.settings.hw.device if world > 1 or any(isinstance(i, Layout) for i in items) else None
    run_processes(rounds_rank, world, (job,), lambda msg: on_round(*msg), group_device=group_device,
                  gpu_ids=gpu_ids, what="rank" if group_device else "worker")


def measure_fixed(settings: EngineSettings, items: list, world: int, rounds: int = 1) -> list[Measured]:
    """Each item measured in `rounds` rounds (one group); per item its `Measured`."""
    parts: list[list] = [[] for _ in items]

    def on_round(g, r, costs):
        for i, c in enumerate(costs):
            parts[i].append(c)

    run(Job(settings, [list(items)], FixedRounds(rounds)), world, on_round)
    return [Measured.from_rounds(p) for p in parts]


def measure_plans(settings: EngineSettings, plans: dict, num_devices: int, rounds: int = 1,
                  on_result=None, gpu_ids=None, group_of=None) -> dict:
    """Measure {key: per-device (table, dim) lists} on `num_devices` ranks in `rounds` rounds; {key: Measured}.

    Plans with the same `group_of(key)` (e.g. one task's plans of every algorithm) are measured interleaved,
    so a slow period of a shared machine hits all of them alike. `on_result(key, measured)` gets each plan as
    soon as its group is done."""
    groups: dict = {}
    for key, device_tables in plans.items():
        groups.setdefault(group_of(key) if group_of else None, []).append((key, device_tables))
    groups_list = list(groups.values())
    parts: list[list[list]] = [[[] for _ in g] for g in groups_list]
    results = {}

    def on_round(g, r, costs):
        for i, c in enumerate(costs):
            parts[g][i].append(c)
        if r + 1 == rounds:
            for i, (key, _) in enumerate(groups_list[g]):
                results[key] = Measured.from_rounds(parts[g][i])
                if on_result:
                    on_result(key, results[key])

    run(Job(settings, [[d for _, d in g] for g in groups_list], FixedRounds(rounds)), num_devices, on_round,
        gpu_ids=gpu_ids)
    return results
