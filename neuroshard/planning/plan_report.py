"""What `shard_tables` prints of a plan: per device (memory, shards, predicted cost parts) and per table (its
shards' column ranges and devices), and how a plan's name and record are formed for plan.json."""
from __future__ import annotations

from ..core.tables import format_table
from ..core.costs import Cluster, Cost
from ..data.table_list import TableList
from ..sharding.plan import Placement
from ..sharding.simulator import Simulator


def device_report(tl: TableList, plan: Placement, cluster: Cluster, cost: Cost | None) -> str:
    mem = plan.device_mem_gb(tl.task)
    per_dev = plan.per_device()
    crit = cost.critical_device if cost else None
    rows = []
    for r in range(cluster.num_devices):
        c = ([f"{cost.compute_ms[r]:.3f}", f"{cost.fw_ms[r]:.3f}", f"{cost.bw_ms[r]:.3f}",
              f"{cost.per_device_ms[r]:.3f}"] if cost else ["-"] * 4)
        rows.append([f"{r}{' *' if r == crit else ''}", f"{mem[r]:.4f} / {cluster.max_mem_gb:g}", str(len(per_dev[r])),
                     *c])
    lines = format_table(["device", "memory (GB)", "shards", "compute (ms)", "fw comm (ms)", "bw comm (ms)",
                          "total (ms)"], rows, style="text")
    fit = cost.step_fit if cost is not None else None
    if fit is not None:
        lines.append(f"total = (compute + fw + bw) x {fit.scale:.3f} + {fit.overhead_ms:.2f} ms: the step cost "
                     "fitted to TorchRec training steps measured on these ranks (--calibrate_dmp)")
    return "\n".join(lines)



def table_report(tl: TableList, plan: Placement) -> str:
    rows = []
    for t, name in enumerate(tl.names):
        shards = sorted((s.col_start, s.dim, d) for s, d in zip(plan.shards, plan.device_of) if s.table == t)
        ranges: list[list[int]] = []  # adjacent shards on one device shown as one column range
        for c, w, d in shards:
            if ranges and ranges[-1][2] == d and ranges[-1][1] == c:
                ranges[-1][1] = c + w
            else:
                ranges.append([c, c + w, d])
        rows.append([name, str(tl.rows[t]), str(int(tl.task.dims[t])), str(len(shards)),
                     ",".join(str(d) for d in sorted({d for _, _, d in shards})),
                     " ".join(f"{lo}:{hi}@{d}" for lo, hi, d in ranges)])
    return "\n".join(format_table(["table", "rows", "dim", "shards", "devices", "columns@device"], rows, style="text"))



def predicted_record(cost: Cost | None, batch: int) -> dict | None:
    if cost is None:
        return None
    out = {"batch_size": batch, "cost_ms": cost.cost_ms, "compute_ms": cost.compute_ms.tolist(),
           "fw_ms": cost.fw_ms.tolist(), "bw_ms": cost.bw_ms.tolist()}
    if cost.step_fit is not None:
        out["step_fit"] = cost.step_fit.to_dict()
    return out



def print_plan(title: str, tl: TableList, plan: Placement, cluster: Cluster, cost: Cost | None,
               sim: Simulator | None) -> None:
    """The plan per device and per table under `title`, and where a layout lies outside the comm models' data."""
    print(title)
    print(device_report(tl, plan, cluster, cost))
    print("\nper table\n" + table_report(tl, plan))
    note = sim.comm_coverage_note(plan.device_dim_sums(), cost) if sim is not None and cost is not None else None
    if note:
        print(note)
