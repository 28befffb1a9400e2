"""The planner's statistics: one row per rank (tables, shards, memory, predicted compute and all-to-all) and
one per table (sharding type, columns and ranks), logged through `logging` as TorchRec's planner logs
its stats (`logging.basicConfig(level=logging.INFO)` shows them)."""
from __future__ import annotations

import logging
import textwrap

from ...core.tables import format_table
from .types import COLUMN_WISE_KINDS, DATA_PARALLEL, ROW_WISE_KINDS, TABLE_WISE, PlannerResult, Stats

NOTE_WIDTH = 100  # notes wrap at this many characters
logger = logging.getLogger(__name__)


class NeuroShardStats(Stats):
    def log(self, result: PlannerResult) -> None:
        for line in self.format(result).splitlines():
            logger.info(line)

    @staticmethod
    def format(result: PlannerResult) -> str:
        """The statistics as a box of text."""
        if result.plan is None:
            return _box(_torchrec_lines(result))
        plan, cost, task, N = result.plan, result.cost, result.task, result.cluster.num_devices
        cap_gb = result.cluster.max_mem_gb
        mem = plan.device_mem_gb(task)
        per_rank = [[int(s.table) for s in shards] for shards in plan.per_device()]
        name = [t.qualified_name for t in result.tables]
        unit, scale = ("GB", 1) if cap_gb >= 1 else ("MB", 1024)
        head = ["rank", "tables", "shards TW/CW/RW/DP", f"{result.memory_kind} ({unit})", "compute (ms)", "fw comm (ms)",
                "bw comm (ms)", "total (ms)"]
        body = []
        for r in range(N):
            kinds = [result.sharding_types[t] for t in per_rank[r]]
            body.append([f"{r}{' *' if r == cost.critical_device else ''}", str(len({name[t] for t in per_rank[r]})),
                         "/".join(str(sum(k in group for k in kinds)) for group in ((TABLE_WISE,), COLUMN_WISE_KINDS,
                                                                                    ROW_WISE_KINDS, (DATA_PARALLEL,))),
                         f"{mem[r] * scale:.3f} ({100 * mem[r] / cap_gb:.0f}%)",
                         *(f"{x:.3f}" for x in (cost.compute_ms[r], cost.fw_ms[r], cost.bw_ms[r],
                                                cost.per_device_ms[r]))])
        tbody, shown = [], {}
        for t, table in enumerate(result.tables):  # a row-wise table's blocks and a replicated one's copies: one row
            pieces = sorted((s.col_start, s.dim, d) for s, d in zip(plan.shards, plan.device_of) if s.table == t)
            where = " ".join(f"{c}:{c + w}@{d}" for c, w, d in pieces)
            if table.row_block >= 0 or table.replica >= 0:
                row = shown.get(name[t])
                if row is None:
                    row = shown[name[t]] = [name[t], [0, int(task.dims[t])], 0.0, result.sharding_types[t], []]
                    tbody.append(row)
                row[1][0] = row[1][0] + int(task.rows[t]) if table.row_block >= 0 else int(task.rows[t])
                if table.row_block >= 0:  # the blocks' shares add up to the table's; each replica has the table's
                    row[2] += float(task.pooling_factors[t])
                else:
                    row[2] = float(task.pooling_factors[t])
                row[4].append(f"rows {int(task.rows[t])}@{pieces[0][2]}" if table.row_block >= 0 else
                              f"{pieces[0][2]}")
                continue
            tbody.append([name[t], [int(task.rows[t]), int(task.dims[t])], float(task.pooling_factors[t]),
                          result.sharding_types[t], [where]])
        tbody = [[n, f"{r} x {d}", f"{pf:.4g}", kind, ("all@" if kind == DATA_PARALLEL else "") + " ".join(w)]
                 for n, (r, d), pf, kind, w in tbody]
        lines = [f"NeuroShard planner: {len(result.specs)} EmbeddingBagCollection(s), {len(set(name))} tables, "
                 f"{len(plan.splits)} column split(s), searched in {result.search_s:.2f} s",
                 f"{N} ranks x {cap_gb * scale:.3f} {unit} {result.memory_kind} for tables (storage as TorchRec counts it, "
                 "after its reservation)",
                 f"predicted embedding cost {cost.cost_ms:.3f} ms per step at global batch {result.model_batch or '?'} "
                 f"on {result.hardware} (* the slowest rank)",
                 "", *_columns(head, body), "",
                 *_columns(["table", "rows x dim", "pooling", "sharding", "columns@rank (row blocks, replicas)"], tbody),
                 "", *(part for note in result.notes for part in textwrap.wrap(note, NOTE_WIDTH, subsequent_indent="  "))]
        return _box(lines)


def _torchrec_lines(result: PlannerResult) -> list[str]:
    """The stats of a TorchRec plan handed out unchanged: per table its sharding, kernel and ranks, then the notes."""
    task, rows = result.task, []
    by_name = {(path, t["name"]): t for path, spec in result.specs.items() for t in spec["tables"]}
    for t, table in enumerate(result.tables):
        entry = by_name[(table.module_path, table.name)]
        rows.append([table.qualified_name, f"{int(task.rows[t])} x {int(task.dims[t])}", f"{task.pooling_factors[t]:g}",
                     result.sharding_types[t], " ".join(map(str, entry["ranks"]))])
    return [f"NeuroShard planner: {len(result.specs)} EmbeddingBagCollection(s), {task.num_tables} tables: TorchRec's "
            "plan, unchanged", "", *_columns(["table", "rows x dim", "pooling", "sharding (kernel)", "ranks"], rows), "",
            *(part for note in result.notes for part in textwrap.wrap(note, NOTE_WIDTH, subsequent_indent="  "))]


def _box(lines: list[str]) -> str:
    width = max(map(len, lines)) + 4
    bar = "#" * width
    return "\n".join([bar, *(f"# {line.ljust(width - 4)} #" for line in lines), bar])


def _columns(head: list[str], body: list[list[str]]) -> list[str]:
    """A text table with its first and last columns left-aligned, the numbers between right-aligned."""
    return format_table(head, body, "text", "l" + "r" * (len(head) - 2) + "l")
