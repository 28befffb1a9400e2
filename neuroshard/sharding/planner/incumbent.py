"""The plan NeuroShard's must beat: what the user's own `EmbeddingShardingPlanner` call returns for the same
module, topology, batch, storage reservation and constraints (`torchrec_full_plan`, run beside the search by
`TorchRecCall`), read back as a `Placement` of
the enumerated tables (`placement_of`), or of tables cut as it cuts them (`full_plan_elsewhere`: its row blocks
and replicas); where the cost models cannot price it, the plan TorchRec's planner makes with the sharding types
and kernel NeuroShard places (`torchrec_plan` with `storage.planned_constraints`)."""
from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
import warnings

from ...core.errors import PlanError, UserError
from ..plan import Placement, plan_from_slices
from ..torchrec_baseline import sharding_slices
from ..torchrec_export import placement_rank
from .types import COLUMN_WISE_KINDS, DATA_PARALLEL, DENSE, FUSED, ROW_WISE_KINDS, TABLE_WISE, Enumeration


def torchrec_plan(topology, batch_size: int, constraints: dict, reservation, module, sharders,
                  found: Enumeration) -> tuple[Placement | None, str | None]:
    """(TorchRec's plan, None), or (None, a note saying why there is none to compare with)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch_size, constraints=constraints,
                                       storage_reservation=reservation, debug=False)
    try:
        plan = planner.plan(module, sharders)
    except Exception as e:  # TorchRec's PlannerError: nothing fits its count of memory
        if "PlannerError" not in type(e).__name__:
            raise
        return None, ("note: TorchRec's EmbeddingShardingPlanner finds no plan of these tables with the same sharding types "
                      f"within the same memory ({str(e).splitlines()[0][:160]}); the plans are compared without it")
    return placement_of(plan, found, topology.world_size)


def placement_of(plan, found: Enumeration, world: int) -> tuple[Placement | None, str | None]:
    """(TorchRec's `ShardingPlan` as a placement of `found`'s tables, None), or (None, a note saying why it is
    not one: TorchRec cut column shards the cost models do not price). A table placed otherwise than `found` has it
    (another sharding type; row blocks or replicas `found` does not hold) is a `PlanError`."""
    index = {(t.module_path, t.name, max(t.row_block, t.replica, 0)): i for i, t in enumerate(found.tables)}
    shardings, pinned = [], {}
    for path, module_plan in plan.plan.items():
        for name, ps in module_plan.items():
            t = index.get((path, name, 0))
            table = found.tables[t] if t is not None else None
            kind = None if table is None else (table.row_wise_type if table.row_block == 0 else DATA_PARALLEL
                                               if table.replica == 0 else ps.sharding_type)
            if table is None or ps.sharding_type != kind or kind not in (TABLE_WISE, *COLUMN_WISE_KINDS,
                                                                          *ROW_WISE_KINDS, DATA_PARALLEL):
                raise PlanError(f"TorchRec's planner placed {path}.{name} {ps.sharding_type}, outside the constraints")
            if kind in (*ROW_WISE_KINDS, DATA_PARALLEL) and max(table.row_block, table.replica) < 0:
                raise PlanError(f"TorchRec's planner placed {path}.{name} {kind}, which these tables hold whole")
            if kind in COLUMN_WISE_KINDS and kind != table.column_wise_type:  # priced and exported as the other
                raise PlanError(f"TorchRec's planner placed {path}.{name} {kind}, not {table.column_wise_type}")
            if kind in (TABLE_WISE, *COLUMN_WISE_KINDS):
                shardings.append((t, ps))
                continue
            ranks = ([m.placement.rank() for m in ps.sharding_spec.shards if m.shard_offsets[1] == 0]
                     if kind in ROW_WISE_KINDS else list(ps.ranks or []))  # grid: the first column block's
            if ranks != list(range(world)):  # block or replica r on rank r, as `row_wise.py` has them
                raise PlanError(f"TorchRec's planner put {path}.{name} ({kind}) on ranks {ranks}")
            for r in ranks:
                pinned[index[(path, name, r)]] = [(0, int(found.task.dims[t]), r)]
    try:
        return plan_from_slices(found.task.dims, world,
                                {**sharding_slices(shardings, found.task.dims), **pinned}), None
    except PlanError as e:
        return None, (f"note: TorchRec's plan cuts column shards NeuroShard's cost models do not price ({e}); the plans "
                      "are compared without it")


def priced_kernels(plan) -> bool:
    """Whether every table of TorchRec's `ShardingPlan` is on a kernel the cost models price (`fused`; `dense` for a
    data-parallel table): not on UVM or caching kernels."""
    return all(ps.compute_kernel == (DENSE if ps.sharding_type == DATA_PARALLEL else FUSED)
               for module_plan in plan.plan.values() for ps in module_plan.values())


def full_plan_elsewhere(plan, given: Enumeration, world: int, memory_kind: str
                        ) -> tuple[Enumeration, Placement] | None:
    """TorchRec's `ShardingPlan` of the enumerated tables (`given`, before any row blocks or replicas) as a placement
    of tables cut as it cuts them: its row-wise tables in row blocks of its sharding type, its data-parallel ones in
    replicas (`row_wise.with_row_blocks`; the notes stay `given`'s). None where the cost models cannot price it
    (another kernel, shards they do not cut, a type a table does not allow as enumerated)."""
    from dataclasses import replace

    from .row_wise import with_row_blocks

    if not priced_kernels(plan):
        return None
    kinds = {(path, name): ps.sharding_type for path, module_plan in plan.plan.items()
             for name, ps in module_plan.items()}
    tables, row_wise, replicated = list(given.tables), [], []
    for t, table in enumerate(tables):
        kind = kinds.get((table.module_path, table.name))
        if kind in ROW_WISE_KINDS:
            row_wise.append(t)
            tables[t] = replace(table, row_wise_type=kind)
        elif kind == DATA_PARALLEL:
            replicated.append(t)
    try:
        found = with_row_blocks(replace(given, tables=tables), row_wise, world, memory_kind, replicated)
        placed, _ = placement_of(plan, found, world)
    except (PlanError, UserError):
        return None
    return (replace(found, notes=given.notes), placed) if placed is not None else None


def torchrec_full_plan(topology, batch_size: int, constraints: dict, reservation, module, sharders):
    """The plan the caller's own `EmbeddingShardingPlanner` call returns, every sharding type and kernel its
    constraints and sharders allow (row_wise, UVM caching, ...), or None where it finds none within memory."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    try:
        return EmbeddingShardingPlanner(topology=topology, batch_size=batch_size, constraints=constraints,
                                        storage_reservation=reservation, debug=False).plan(module, sharders)
    except Exception as e:  # no plan within memory, or a table no sharder and kernel the constraints allow can take
        if "PlannerError" not in type(e).__name__ and "No available sharding type" not in str(e):
            raise
        return None


class TorchRecCall:
    """The caller's own `EmbeddingShardingPlanner` call (`torchrec_full_plan` of `args`), started at once in a
    forked process where that is safe (`background_ok`), so that it runs on a second CPU while NeuroShard searches;
    `result()` waits for it. The child sends the plan back as `parameter_specs` JSON (no pickle) and exits; it dies
    with this process and is killed by `close()` (a Ctrl-C, an error in the search). Where anything goes wrong there
    (no fork, a child that fails or dies, a reply that does not read, a child that stops using CPU for `STALL_S`
    before it has replied: stuck on a lock another thread held at the fork), `result()` makes the call in this
    process, so the plan is the same either way and an error TorchRec raises is raised here with its own traceback."""

    STALL_S = 10.0  # seconds without CPU progress after which the child is taken for stuck (TorchRec's planner
                    # computes all along: it neither sleeps nor waits)

    def __init__(self, args: tuple, world: int, background: bool | None = None):
        self._args, self._world = args, world
        self._pid = self._fd = None
        self._plan = _UNREAD  # until `result()`
        self.ran_in_background = False
        if background_ok() if background is None else background:
            self._start()

    def _start(self) -> None:
        parent = os.getpid()
        r, w = os.pipe()
        # no Ctrl-C between the fork and the bookkeeping: the child would run the caller's code on, or go untracked
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            try:
                with warnings.catch_warnings():  # Python >= 3.12 warns of forking a threaded process; the child runs
                    warnings.simplefilter("ignore", DeprecationWarning)  # only TorchRec's planner, on one thread
                    pid = os.fork()
            except OSError:
                os.close(r)
                os.close(w)
                return
            if pid == 0:
                self._child(r, w, parent, blocked)
            os.close(w)
            self._pid, self._fd = pid, r
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _child(self, r: int, w: int, parent: int, blocked) -> None:
        code = 1
        try:
            gc.disable()  # its collections would copy every shared page they touch; what it leaves is freed at exit
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which kills this process
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            os.close(r)
            _die_with_parent()
            if os.getppid() != parent:  # the parent ended before the line above
                return
            import torch

            torch.set_num_threads(1)  # no OpenMP pool is inherited across a fork
            plan = torchrec_full_plan(*self._args)
            reply = {"plan": None if plan is None else parameter_specs(plan)}
            with os.fdopen(w, "wb") as f:
                f.write(json.dumps(reply).encode())
            code = 0
        finally:
            os._exit(code)  # never the parent's cleanup (atexit, pytest, process groups)

    def result(self):
        """TorchRec's `ShardingPlan`, or None where it finds none within memory."""
        if self._plan is _UNREAD:
            plan = self._collect() if self._pid is not None else _UNREAD
            self._plan = torchrec_full_plan(*self._args) if plan is _UNREAD else plan
        return self._plan

    def _collect(self):
        """The child's plan, or `_UNREAD` where it sent none that reads (it sends its reply whole, then exits) or
        stopped computing before it replied."""
        from torchrec.distributed.types import ShardingPlan

        data = self._read()
        if data is None:  # stuck: stopped, and the call is made here
            self.close()
            return _UNREAD
        self._reap()
        try:
            plan = json.loads(data)["plan"]
            if plan is None:
                return None
            plan = ShardingPlan({path: from_parameter_specs(spec, self._world) for path, spec in plan.items()})
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, UserError):
            return _UNREAD
        self.ran_in_background = True
        return plan

    def _read(self) -> bytes | None:
        """The child's reply, read to its end; None where the child used no CPU for `STALL_S` before it ended."""
        import select

        chunks, cpu, still = [], _cpu_ticks(self._pid), time.monotonic()
        while True:
            ready, _, _ = select.select([self._fd], [], [], 1.0)
            if ready:
                chunk = os.read(self._fd, 1 << 20)
                if not chunk:
                    fd, self._fd = self._fd, None
                    os.close(fd)
                    return b"".join(chunks)
                chunks.append(chunk)
                still = time.monotonic()
                continue
            now = _cpu_ticks(self._pid)
            if now is None or now != cpu:  # gone (its end of the pipe closes next) or computing
                cpu, still = now, time.monotonic()
            elif time.monotonic() - still > self.STALL_S:
                return None

    def close(self) -> None:
        """Stop the child where it still runs (the search failed or was interrupted, or the child is stuck)."""
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)  # not yet reaped (`background_ok`: this process reaps its
            except ProcessLookupError:              # children), so the pid is still the child's
                pass
            self._reap()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _reap(self) -> None:
        """Wait for the child's exit (none to wait for where a handler installed since the fork reaped it)."""
        try:
            os.waitpid(self._pid, 0)
        except ChildProcessError:
            pass
        self._pid = None


_UNREAD = object()


def _cpu_ticks(pid: int) -> int | None:
    """The process's user + system CPU time in clock ticks (/proc), or None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    except (OSError, IndexError, ValueError):
        return None


def background_ok() -> bool:
    """Whether TorchRec's call may run in a forked process beside the search: Linux, a second CPU for this process,
    no CUDA context (which a forked child cannot use), and SIGCHLD left to its default (this process reaps its own
    children: no other code reaps the child and frees its pid for reuse while it may still be signalled)."""
    if sys.platform != "linux" or not hasattr(os, "fork"):
        return False
    if len(os.sched_getaffinity(0)) < 2 or signal.getsignal(signal.SIGCHLD) != signal.SIG_DFL:
        return False
    import torch

    return not torch.cuda.is_initialized()


def _die_with_parent() -> None:
    """Linux's PR_SET_PDEATHSIG: the child is killed when the process that forked it ends."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def table_shapes(found: Enumeration) -> dict[tuple[str, str], tuple[int, int]]:
    """(module path, table name) -> (rows, dim) of the enumerated tables, as `parameter_specs` reads them."""
    return {(t.module_path, t.name): (int(r), int(d)) for t, r, d in zip(found.tables, found.task.rows,
                                                                       found.task.dims)}


def parameter_specs(plan, shapes: dict[tuple[str, str], tuple[int, int]] | None = None) -> dict[str, dict]:
    """A TorchRec `ShardingPlan` of tables of `shapes` ((module path, name) -> rows, dim) as JSON-able specs, one per
    module path, in the shape `collective_plan` sends and `NeuroShardPlanner._check_module` reads:
    {"torchrec": True, "tables": [{name, rows, dim, sharding_type, compute_kernel, ranks, shards: [{offsets,
    sizes, placement}]}]}; without `shapes`, no rows and dim (`from_parameter_specs` does not read them)."""
    specs = {}
    for path, module_plan in plan.plan.items():
        tables = []
        for name, ps in module_plan.items():
            shards = [{"offsets": [int(x) for x in m.shard_offsets], "sizes": [int(x) for x in m.shard_sizes],
                       "placement": str(m.placement)} for m in (ps.sharding_spec.shards if ps.sharding_spec else [])]
            shape = {} if shapes is None else dict(zip(("rows", "dim"), shapes[(path, name)]))
            tables.append({"name": name, **shape, "sharding_type": ps.sharding_type,
                           "compute_kernel": ps.compute_kernel, "ranks": [int(r) for r in ps.ranks or []],
                           "shards": shards})
        specs[path] = {"torchrec": True, "tables": tables}
    return specs


SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise",
                  "grid_shard")


def from_parameter_specs(spec: dict, world: int):
    """The `EmbeddingModuleShardingPlan` of one module's `parameter_specs` entry on `world` ranks; a damaged one (a
    field of the wrong kind, a rank or placement outside the world, sizes that are not whole numbers >= 0: TorchRec
    gives a row-wise table of fewer rows than ranks shards of 0 rows) is one `UserError`."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding

    def rank(x) -> int:
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < world:
            raise ValueError(x)
        return x

    def whole(xs, lo: int) -> list[int]:
        if not isinstance(xs, list) or len(xs) != 2 or not all(
                isinstance(x, int) and not isinstance(x, bool) and lo <= x < 2**40 for x in xs):
            raise ValueError(xs)
        return xs

    out = EmbeddingModuleShardingPlan()
    try:
        for t in spec["tables"]:
            if not isinstance(t["name"], str) or t["name"] in out or t["sharding_type"] not in SHARDING_TYPES or \
                    not isinstance(t["compute_kernel"], str):
                raise ValueError(t["name"])
            shards = []
            for s in t["shards"]:
                rank(placement_rank(s["placement"]))
                shards.append(ShardMetadata(shard_offsets=whole(s["offsets"], 0), shard_sizes=whole(s["sizes"], 0),
                                            placement=s["placement"]))
            out[t["name"]] = ParameterSharding(
                sharding_type=t["sharding_type"], compute_kernel=t["compute_kernel"],
                ranks=[rank(r) for r in t["ranks"]] or None,
                sharding_spec=EnumerableShardingSpec(shards) if shards else None)
    except (KeyError, TypeError, ValueError, RuntimeError, AssertionError, OverflowError) as e:
        raise UserError(f"the TorchRec plan received from rank 0 is damaged ({type(e).__name__}); run collective_plan "
                        "again") from None
    return out
