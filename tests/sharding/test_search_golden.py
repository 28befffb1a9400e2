"""The search returns the plans and simulated costs it returned before it was made faster (issue 36).

`search_golden.json` was written by `python tests/sharding/test_search_golden.py` with the search of commit
166bff1 (before batching, caching and single-threaded BLAS): fixed tasks of 8-120 tables on 2-16 devices,
the paper's search parameters, the real network shapes with random weights and the analytic models. Any
change to the search that moves one plan, one split or one simulated nanosecond fails here; rewrite the file
only for a change that is meant to change plans, and say so in CHANGELOG.md."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from neuroshard.core.costs import Cluster
from neuroshard.sharding.search import neuroshard_search, neuroshard_top_plans

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from test_search import random_neural_simulator, random_task  # noqa: E402
from analytic_models import analytic_simulator  # noqa: E402

GOLDEN = Path(__file__).with_name("search_golden.json")
CASES = [  # (tables, devices, memory slack over an even split, simulator, seed)
    (8, 2, 1.5, "neural", 1), (16, 4, 1.2, "neural", 2), (30, 4, 1.3, "neural", 3), (60, 4, 1.3, "neural", 4),
    (60, 8, 1.1, "neural", 5), (120, 16, 1.4, "neural", 6), (12, 3, 1.6, "analytic", 7),
    (40, 4, 1.2, "analytic", 8), (60, 8, 1.05, "neural", 9),
    # the step cost (the user's default), added at commit d9395de's search: (..., seed, cost)
    (16, 4, 1.2, "neural", 2, "step"), (60, 8, 1.1, "neural", 5, "step"), (40, 4, 1.2, "analytic", 8, "step"),
]


def run_case(T, N, slack, kind, seed, cost="paper") -> dict:
    rng = np.random.default_rng(seed)
    task = random_task(rng, T)
    sim = (random_neural_simulator(N, seed) if kind == "neural" else analytic_simulator(N)).with_cost(cost)
    cluster = Cluster(N, max(task.sizes_gb().sum() / N * slack, task.sizes_gb().max()))
    plan = neuroshard_search(sim, task, cluster)
    top = neuroshard_top_plans(sim, task, cluster, 4)
    return {"case": [T, N, slack, kind, seed] + ([cost] if cost != "paper" else []),
            "plan": None if plan is None else {"splits": plan.splits, "device_of": plan.device_of,
                                               "cost_ms": sim.plan_cost(task, plan).cost_ms},
            "top": [[cost, p.splits, p.device_of] for cost, p in top]}


@pytest.fixture(scope="module")
def golden():
    return {tuple(c["case"]): c for c in json.loads(GOLDEN.read_text())}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}t{c[1]}d-{c[3]}" + "".join(f"-{x}" for x in c[5:]))
def test_same_plans_and_costs_as_before(case, golden):
    assert run_case(*case) == golden[tuple(case)]


if __name__ == "__main__":  # writes the cases not in the file yet; rewrite a case only to change its plans
    have = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else []
    known = {tuple(c["case"]) for c in have}
    GOLDEN.write_text(json.dumps(have + [run_case(*c) for c in CASES if tuple(c) not in known]) + "\n")
    print(f"wrote {GOLDEN}")
