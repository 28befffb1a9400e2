"""The one greedy placement that serves every greedy heuristic and NeuroShard's table-wise step.

Items are taken in the given order; each goes to the allowed device with the lowest current cost
(tie: smaller memory used, then lower device id) among devices where it fits `max_mem_gb`.
`device_cost(items)` returns a device's cost for the whole set of items it holds and is
re-evaluated after each placement, so it may be additive (heuristics) or not (a cost model). An item with a
`pinned` rank (a row block of a row-wise table, a replica of a data-parallel one) goes to that rank alone, past
the dim-sum cap.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..core.costs import MEM_TOL_GB


def greedy_place(order: Sequence[int], sizes_gb: np.ndarray, num_devices: int, max_mem_gb: float,
                 device_cost: Callable[[list[int]], float],
                 dims: np.ndarray | None = None, max_dim_sum: float = np.inf,
                 pinned: np.ndarray | None = None) -> list[int] | None:
    """Device of every item, or None when some item fits on no device."""
    cost = np.array([device_cost([]) for _ in range(num_devices)], dtype=np.float64)
    mem = np.zeros(num_devices)
    dim_sum = np.zeros(num_devices)
    items: list[list[int]] = [[] for _ in range(num_devices)]
    device_of = [-1] * len(sizes_gb)
    for i in order:
        ok = mem + sizes_gb[i] <= max_mem_gb + MEM_TOL_GB
        if pinned is not None and pinned[i] >= 0:
            ok &= np.arange(num_devices) == pinned[i]
        elif dims is not None:
            ok &= dim_sum + dims[i] <= max_dim_sum + MEM_TOL_GB
        if not ok.any():
            return None
        cand = np.flatnonzero(ok)
        r = int(cand[np.lexsort((cand, mem[cand], cost[cand]))[0]])
        device_of[i] = r
        items[r].append(int(i))
        mem[r] += sizes_gb[i]
        if dims is not None:
            dim_sum[r] += dims[i]
        cost[r] = device_cost(items[r])
    return device_of


def largest_first(keys: np.ndarray) -> np.ndarray:
    """Order of items by key, largest first (stable: equal keys keep their task order)."""
    return np.argsort(-np.asarray(keys, dtype=np.float64), kind="stable")
