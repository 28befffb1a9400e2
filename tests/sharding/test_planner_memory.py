"""NeuroShardPlanner counts memory as TorchRec does: every shard's storage by TorchRec's own storage estimator,
against each rank's memory after TorchRec's default storage reservation. Over random tables and topologies (cpu
and cuda, 2 and 4 ranks) it hands out no plan over that budget as TorchRec counts it, and refuses none where
TorchRec's planner, given the same sharding types, finds a plan."""
import math

import numpy as np
import pytest

pytest.importorskip("torchrec")

from neuroshard.core.errors import UserError  # noqa: E402

from analytic_models import save_hand_models  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return {n: save_hand_models(tmp_path_factory.mktemp(f"models{n}"), n, {"batch_size": 128}) for n in (2, 4)}


def case(tables, world, device, cap, batch):
    """(module, topology, constraints, sharders) of tables on the meta device (`coverage.build`)."""
    from neuroshard.sharding.planner.coverage import CoverageCase, build

    return build(CoverageCase(tables, world, device, cap, batch))


def kinds(plan) -> dict[str, tuple[str, str]]:
    return {name: (ps.sharding_type, ps.compute_kernel) for name, ps in plan.plan[""].items()}


def test_no_plan_over_memory_and_no_refusal_where_torchrec_plans(models):
    """14 random cases (`coverage.random_case`: cpu and cuda, 2 and 4 ranks, optimizers in backward), 4 on cpu
    with RowWiseSharder, 6 more whose tables' constraints allow random sharding types and 6 with random compute
    kernels and dims: no violation (a refusal where TorchRec plans, a plan over the budget or outside the
    constraints), and cases where the budget binds were drawn."""
    from neuroshard.sharding.planner.coverage import check_case, random_case

    rng = np.random.default_rng(7)
    results = [check_case(random_case(rng, (2, 4)[i % 2], ("cuda", "cpu")[(i // 2) % 2]), models[(2, 4)[i % 2]])
               for i in range(14)]
    # and cpu ranks with RowWiseSharder for both planners (row_wise offered on cpu too)
    row_wise = [check_case(random_case(rng, 2, "cpu", row_wise_sharder=True), models[2]) for _ in range(4)]
    # and tables whose constraints allow random subsets of TorchRec's sharding types (table_column_wise, grid_shard...)
    typed = [random_case(rng, 2, ("cpu", "cuda")[i % 2], row_wise_sharder=True, constrained_share=0.8) for i in range(6)]
    assert {k for c in typed for kinds in c.sharding_types.values() for k in kinds} >= {"table_column_wise",
                                                                                          "grid_shard"}
    row_wise += [check_case(c, models[2]) for c in typed]
    # and tables whose constraints allow random compute kernels (UVM ones on cuda), some of dims the models do not
    # price: TorchRec's plan where the search cannot price a table, never a refusal where TorchRec plans
    kernels = [random_case(rng, 2, ("cuda", "cpu")[i % 2], kernel_share=0.7, odd_dim_share=0.3) for i in range(6)]
    assert any("fused" not in k for c in kernels for k in c.compute_kernels.values())
    assert any(d % 4 for c in kernels for _, _, d, _ in c.tables)
    row_wise += [check_case(c, models[2]) for c in kernels]
    assert [r.violation for r in results + row_wise if r.violation] == []
    own = [r for r in results if r.outcome == "own"]
    assert len(own) >= 5 and sum(r.used_share > 0.8 for r in own) >= 2, [(r.outcome, r.used_share) for r in results]


def test_a_model_filling_hbm_with_weights_gets_torchrecs_plan(models):
    """The issue's case: 26 tables x dim 64 whose fp32 weights are 95% of 4 ranks' 1 GiB. Counting weights alone
    it fits; with TorchRec's reservation and I/O buffers no table_wise/column_wise plan does. TorchRec's planner
    places the tables row_wise and on UVM caching: that plan is handed out unchanged, and the stats say why; with
    compare=False (NeuroShard's search alone) it is one line."""
    from neuroshard import NeuroShardPlanner

    from neuroshard.sharding.planner.incumbent import from_parameter_specs, torchrec_full_plan
    from neuroshard.sharding.planner.storage import default_reservation

    rows = math.floor(0.95 * 4 * 2**30 / (26 * 64 * 4))
    module, topology, constraints, sharders = case([(f"t{i}", rows, 64, 4.0) for i in range(26)], 4, "cuda", 2**30, 32)
    planner = NeuroShardPlanner(topology, constraints=constraints, models_dir=models[4], debug=False)
    assert planner.batch_size == 32  # the models' batch of 128 over 4 ranks
    plan = planner.plan(module, sharders)
    theirs = torchrec_full_plan(topology, 32, constraints, default_reservation(), module, sharders)
    assert kinds(plan) == kinds(theirs) and {k for k, _ in kinds(plan).values()} >= {"row_wise"}
    assert plan.plan[""]["t0"].sharding_spec.shards == theirs.plan[""]["t0"].sharding_spec.shards
    spec = planner.last_result.specs[""]  # what collective_plan sends the other ranks, as JSON
    good = spec["tables"][0]
    shard = good["shards"][0]
    for damage in ({"tables": [{"name": "t0"}]}, {"tables": [{**good, "shards": [{"offsets": "x"}]}]},
                   {"tables": None}, {"tables": [{**good, "ranks": [float("inf")]}]},
                   {"tables": [{**good, "ranks": [7]}]}, {"tables": [{**good, "sharding_type": "bogus"}]},
                   {"tables": [{**good, "shards": [{**shard, "placement": "garbage"}]}]},
                   {"tables": [{**good, "shards": [{**shard, "placement": "rank:9/cuda:0"}]}]},
                   {"tables": [{**good, "shards": [{**shard, "sizes": [10**30, 64]}]}]}, {"tables": [good, good]}):
        with pytest.raises(UserError, match="^the TorchRec plan received from rank 0 is damaged"):
            from_parameter_specs(damage, 4)
    assert from_parameter_specs(spec, 4) == plan.plan[""]
    stats = planner.stats.format(planner.last_result)
    assert "TorchRec's plan, unchanged" in stats and "handed out TorchRec's EmbeddingShardingPlanner plan" in stats
    with pytest.raises(UserError, match=r"^NeuroShardPlanner found no plan for .* of tables \(as TorchRec counts them\) "
                                        r"within 4 ranks x 0\.8\d\d GB of HBM left after TorchRec's "
                                        r"HeuristicalStorageReservation \(15%\)"):
        NeuroShardPlanner(topology, constraints=constraints, models_dir=models[4], debug=False, compare=False).plan(
            module, sharders)


def test_a_bad_storage_reservation_is_one_line(models):
    """Not a reservation, a class, one whose reserve() fails, returns no topology, gives a rank more than it has or
    a NaN: one line each, naming storage_reservation."""
    import copy

    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import Storage

    from neuroshard import NeuroShardPlanner

    module, topology, constraints, sharders = case([("t0", 100, 8, 1.0)], 2, "cuda", 10**6, 64)

    def make(r):
        return NeuroShardPlanner(topology, constraints=constraints, models_dir=models[2], storage_reservation=r,
                                 debug=False)

    for bad, fragment in [(0.15, "got float"), (FixedPercentageStorageReservation, "got FixedPercentageStorageReservation "
                                                                                  r"\(a class\)")]:
        with pytest.raises(UserError, match=f"^storage_reservation must be a TorchRec StorageReservation.*{fragment}"):
            make(bad)

    class Reserves:
        def __init__(self, change):
            self.change = change

        def reserve(self, topology, batch_size, module, sharders, constraints=None):
            out = copy.deepcopy(topology)
            return self.change(out)

    def scaled(factor):
        def change(t):
            for d in t.devices:
                d.storage = Storage(hbm=d.storage.hbm * factor, ddr=d.storage.ddr)
            return t
        return change

    def fails(t):
        raise ZeroDivisionError("boom")

    reduced = r"Reserves.reserve\(\) must return the topology with each of its 2 ranks' HBM reduced"
    for change, fragment in [(fails, r"Reserves.reserve\(topology=.*failed \(ZeroDivisionError: boom\)"),
                             (lambda t: None, reduced), (scaled(1000), reduced), (scaled(float("nan")), reduced)]:
        with pytest.raises(UserError, match=f"^storage_reservation {fragment}"):
            make(Reserves(change)).plan(module, sharders)
    assert make(Reserves(scaled(0.5))).plan(module, sharders) is not None


def test_more_tables_go_row_wise_where_the_search_plan_is_over_memory_once_exported(models):
    """A case of the coverage benchmark: the search's first plan fits by its halvings but not as TorchRec's equal
    column blocks. The planner then shards more tables row-wise (as TorchRec's own plan of it does) until a plan fits
    as exported, and hands out its own plan within the budget, where it handed out TorchRec's before."""
    from neuroshard.sharding.planner.coverage import CoverageCase, check_case

    tables = [("t0", 18708, 8, 7.66), ("t1", 13711, 32, 16.64), ("t2", 18219, 32, 2.58), ("t3", 17110, 16, 15.91)]
    result = check_case(CoverageCase(tables, 4, "cuda", 2_505_853, 64, "sgd"), models[4])
    assert result.outcome == "own" and result.violation is None and result.used_share <= 1, result
    assert result.detail["types"] == ["row_wise"], result.detail
