"""NeuroShardPlanner: TorchRec's planner interface with NeuroShard's search. Plans for every
EmbeddingBagCollection of a model (nested too) within each rank's memory, honouring sharding_types;
DistributedModelParallel runs the collective plan on 2 gloo ranks with the unsharded model's outputs;
every input the planner cannot take is one clear UserError."""
import logging
import re
import subprocess
import sys
from dataclasses import replace

import pytest

pytest.importorskip("torchrec")

from neuroshard.core.errors import UserError  # noqa: E402
from neuroshard.hardware.launch import run_processes  # noqa: E402

import torchrec_planner_workers as w  # noqa: E402
from analytic_models import save_hand_models  # noqa: E402

ALL = w.TOP + w.TOWER
# bytes per rank, with nothing reserved (`w.NO_RESERVATION`): below "user" alone (129,024 as TorchRec's storage
# estimator counts it at 32 samples a rank), above half of all tables (103,520)
TIGHT = 116_000
WIDE = [("wide", 100, 256, 1.0), ("small", 50, 16, 2.0), ("tiny", 20, 8, 1.0)]  # splitting "wide" pays


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_hand_models(tmp_path_factory.mktemp("models"), 2, {"batch_size": 64})


def planner(models, mem_bytes=10**6, kinds=None, pooling=None, device="cuda", reserve=False, min_partition=None,
            **kw):
    from torchrec.distributed.planner import ParameterConstraints, Topology

    from neuroshard import NeuroShardPlanner

    kinds, pooling = kinds or {}, pooling or {}
    constraints = {n: ParameterConstraints(pooling_factors=[pooling.get(n, pf)], sharding_types=kinds.get(n, w.SHARDED),
                                           min_partition=(min_partition or {}).get(n)) for n, _, _, pf in ALL + WIDE}
    cap = {"hbm_cap": mem_bytes} if device == "cuda" else {"ddr_cap": mem_bytes}
    if not reserve:
        kw.setdefault("storage_reservation", w.no_reservation())
    return NeuroShardPlanner(Topology(world_size=2, compute_device=device, **cap), constraints=constraints,
                             models_dir=models, **kw)


def sharders():
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return [EmbeddingBagCollectionSharder()]


def placements(tr_plan):
    """{(module path, table): [(col_offset, width, rank)]} and bytes of weights per rank."""
    shards, per_rank = {}, {}
    for path, module_plan in tr_plan.plan.items():
        for name, ps in module_plan.items():
            for m in ps.sharding_spec.shards:
                (r0, c0), (rs, cs) = m.shard_offsets, m.shard_sizes
                assert r0 == 0
                shards.setdefault((path, name), []).append((c0, cs, m.placement.rank()))
                per_rank[m.placement.rank()] = per_rank.get(m.placement.rank(), 0) + rs * cs * 4
    return {k: sorted(v) for k, v in shards.items()}, per_rank


def test_import_neuroshard_does_not_import_torchrec():
    code = ("import sys, neuroshard; assert 'torchrec' not in sys.modules; "
            "from neuroshard import NeuroShardPlanner; print(NeuroShardPlanner.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "NeuroShardPlanner", proc.stderr


def test_plan_covers_both_collections_within_a_tight_cap(models, caplog):
    with caplog.at_level(logging.INFO, logger="neuroshard.sharding.planner"):
        tr_plan = planner(models, TIGHT).plan(w.TwoTowerModel(), sharders())
    shards, per_rank = placements(tr_plan)
    assert set(tr_plan.plan) == {"top", "tower.ebc"}  # the nested EBC under its module path
    assert {name for _, name in shards} == {n for n, *_ in ALL}
    dims = {n: d for n, _, d, _ in ALL}
    for (_, name), pieces in shards.items():  # every column exactly once
        cols = [c for c0, width, _ in pieces for c in range(c0, c0 + width)]
        assert sorted(cols) == list(range(dims[name])), name
    assert set(per_rank) == {0, 1} and max(per_rank.values()) <= TIGHT, per_rank
    assert sum(per_rank.values()) == sum(r * d * 4 for _, r, d, _ in ALL)
    assert {rank for *_, rank in shards[("top", "user")]} == {0, 1}  # too big for one rank: split
    assert tr_plan.plan["top"]["user"].sharding_type == "column_wise"
    assert all(ps.compute_kernel == "fused" for mp in tr_plan.plan.values() for ps in mp.values())
    out = caplog.text  # TorchRec-style stats through logging: one row per rank, memory and predicted ms
    assert "NeuroShard planner: 2 EmbeddingBagCollection(s), 5 tables" in out
    assert "HBM (MB)" in out and "compute (ms)" in out and "fw comm (ms)" in out and "tower.ebc.history" in out
    rank_rows = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("# 0 ", "# 1 "))]
    assert len(rank_rows) == 2, out


def test_a_looser_cap_keeps_tables_whole(models):
    """The same model with room on each rank for any table: the cap, not the search, forced the split."""
    p = planner(models, 200_000, debug=False)
    shards, _ = placements(p.plan(w.TwoTowerModel(), sharders()))
    assert all(len(p) == 1 for p in shards.values())
    assert max(p.last_result.plan.device_mem_gb(p.last_result.task)) * 2**30 > TIGHT


def test_handed_out_plan_is_never_rated_slower_than_torchrec_or_a_heuristic(models):
    """Default planner: the step cost, and the plan the user's own EmbeddingShardingPlanner call makes and the
    heuristics' scored beside NeuroShard's; the plan handed out has the lowest simulated step cost of them all, and
    the stats say so. Here TorchRec's planner cuts "small" and "tiny" into row blocks, which the search keeps whole:
    its plan is rated in tables cut as it cuts them (`torchrec_ms`; no `incumbent` in the search's tables). Kept
    whole and the rest as they are, TorchRec's plan is the `incumbent` and rated in the search's tables."""
    from neuroshard.sharding.candidates import candidate_plans

    for kinds, cut_otherwise in (({}, True), ({"small": ["table_wise"], "tiny": ["table_wise"]}, False)):
        p = planner(models, debug=False, kinds=kinds)
        assert p.simulator.cost == "step"
        p.plan(w.ebc(WIDE), sharders())
        res = p.last_result
        sim, task = p.simulator, res.task
        others = candidate_plans(task, res.cluster, sim, p.search, 64, 0, torchrec=False)
        assert {n for c in others for n in c.names} >= {"size_greedy", "lookup_greedy"}
        assert (res.incumbent is None) == cut_otherwise and res.torchrec_ms is not None, res.notes
        if not cut_otherwise:
            assert res.torchrec_ms == pytest.approx(sim.plan_cost(task, res.incumbent).cost_ms)
        mine, torchrec = sim.plan_cost(task, res.plan).cost_ms, res.torchrec_ms
        fastest = min([c.simulated_ms for c in others] + [torchrec])
        # the fastest rated, or TorchRec's plan when the fastest is less than min_gain (5%) cheaper than it
        assert mine == pytest.approx(torchrec if fastest > 0.95 * torchrec else fastest)
        assert mine <= torchrec
        note = next(n for n in res.notes if "simulated step cost (ms) of the candidate plans" in n)
        assert "torchrec" in note and "plan handed out" in note
        assert ("(its own row-wise and data-parallel tables)" in note) == cut_otherwise, note
    for bad in (1.5, float("nan")):  # named as the API caller sets it, not as a flag
        with pytest.raises(UserError, match=r"^NeuroShardPlanner: min_gain= must be a finite number >= 0 and < 1"):
            planner(models, min_gain=bad)
    # the paper's search plan splits "wide"; under the step cost the second sharding group is charged
    paper = planner(models, debug=False, cost="paper", compare=False)
    paper.plan(w.ebc(WIDE), sharders())
    split = paper.last_result.plan
    assert split.splits and sim.plan_cost(task, split).cost_ms > paper.simulator.plan_cost(task, split).cost_ms


def test_planner_takes_models_already_loaded(models, tmp_path):
    """simulator=: models already in memory (e.g. a calibration) replace the files; the notes say so; the wrong
    object or models for another world size are one line."""
    from analytic_models import analytic_simulator

    sim = analytic_simulator(2)
    p = planner(tmp_path / "no_models_here", simulator=sim, debug=False, min_gain=0.0)
    p.plan(w.ebc(WIDE), sharders())
    assert p.simulator.compute is sim.compute and p.simulator.cost == "step"
    assert any("the simulator given" in n for n in p.last_result.notes)
    assert not any("fitted to TorchRec steps" in n for n in p.last_result.notes)
    from neuroshard.core.costs import StepFit

    fitted = planner(tmp_path / "no_models_here", simulator=sim.with_step_fit(StepFit(1.5, 20.0)), debug=False,
                     min_gain=0.0)
    fitted.plan(w.ebc(WIDE), sharders())  # a calibration's step fit (--calibrate_dmp) is named, and ranks the same
    assert any("fitted to TorchRec steps (x 1.500 + 20.00 ms)" in n for n in fitted.last_result.notes)
    assert fitted.last_result.plan.to_dict() == p.last_result.plan.to_dict()
    with pytest.raises(UserError, match="simulator must be a neuroshard Simulator"):
        planner(models, simulator="models/compute.pt")
    with pytest.raises(UserError, match="trained for 4 devices"):
        planner(models, simulator=analytic_simulator(4))
    with pytest.raises(UserError, match=r"^NeuroShardPlanner: cost= must be one of paper, step, got 'fast'$"):
        planner(models, cost="fast")


def test_sharding_types_are_honoured(models):
    model = w.ebc(WIDE)
    free = planner(models, debug=False, cost="paper", compare=False)  # the paper's search alone
    shards, _ = placements(free.plan(model, sharders()))
    assert len(shards[("", "wide")]) > 1, "the search splits the wide table when it may"
    tw_only = planner(models, kinds={"wide": ["table_wise"], "tiny": ["column_wise"]}, debug=False)
    tr_plan = tw_only.plan(model, sharders())
    shards, _ = placements(tr_plan)
    assert shards[("", "wide")] == [(0, 256, shards[("", "wide")][0][2])]  # whole, one rank
    assert tr_plan.plan[""]["wide"].sharding_type == "table_wise"
    assert tr_plan.plan[""]["tiny"].sharding_type == "column_wise"  # table-wise forbidden: one column block
    assert not any(tw_only.last_result.plan.shards[i].table == 0 for i in tw_only.last_result.plan.splits)
    # dim 256 of 280 is above 1.5 x the mean dim sum: the paper's thresholds are widened to place it whole
    assert any("thresholds widened to 1-1.83" in note for note in tw_only.last_result.notes)


def test_every_constraint_field_is_honoured_or_refused(models):
    """min_partition bounds the column shards; the fields TorchRec's planner copies into each ParameterSharding are
    copied as given (and the notes say which the cost models do not price); a device group, an SSD or virtual table
    and per-feature batch sizes the planner cannot honour are one line each, naming the field."""
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import BoundsCheckMode, CacheParams, DataType, KeyValueParams

    model = w.ebc(WIDE)
    free = placements(planner(models, debug=False, cost="paper", compare=False).plan(model, sharders()))[0]
    assert [width for _, width, _ in free[("", "wide")]] == [128, 128]
    bounded = planner(models, debug=False, cost="paper", compare=False)
    bounded.constraints["wide"] = ParameterConstraints(pooling_factors=[1.0], min_partition=160)
    got = placements(bounded.plan(model, sharders()))[0][("", "wide")]
    assert [width for _, width, _ in got] == [256], got  # no halving is 160 wide or more
    with pytest.raises(UserError, match=r"^table 'user' .* needs 129,024 bytes whole .*; lower its min_partition \(64\), "
                                        "raise the topology's memory, or allow row_wise in its ParameterConstraints"):
        planner(models, TIGHT, debug=False, min_partition={"user": 64}, compare=False,
                kinds={"user": ["table_wise", "column_wise"]}).plan(w.TwoTowerModel(), sharders())
    # with row_wise allowed (TorchRec's sharder offers it on cuda) the table no rank holds goes row-wise
    rw_planner = planner(models, TIGHT, debug=False, min_partition={"user": 64}, compare=False)
    assert rw_planner.plan(w.TwoTowerModel(), sharders()).plan["top"]["user"].sharding_type == "row_wise"
    stats = rw_planner.stats.format(rw_planner.last_result)  # one row for the table, its blocks' rows and ranks
    assert re.search(r"# top\.user +400 x 64 +20 +row_wise +rows 200@0 rows 200@1 ", stats), stats
    assert "5 tables" in stats

    given = dict(cache_params=CacheParams(load_factor=0.3), enforce_hbm=True, stochastic_rounding=False,
                 bounds_check_mode=BoundsCheckMode.NONE, output_dtype=DataType.FP16)
    p = planner(models, debug=False)
    p.constraints["wide"] = ParameterConstraints(pooling_factors=[1.0], is_weighted=True, **given)
    ps = p.plan(model, sharders()).plan[""]
    assert {f: getattr(ps["wide"], f) for f in given} == given
    assert ps["small"].stochastic_rounding is None and ps["small"].output_dtype is None
    assert any("carries wide (is_weighted, output_dtype) as given" in n for n in p.last_result.notes)

    for bad, fragment in [(dict(device_group="cpu"), r"device_group='cpu' differs from the topology's compute_device"),
                          (dict(key_value_params=KeyValueParams()), "key_value_params / use_virtual_table ask for an SSD"),
                          (dict(use_virtual_table=True), "key_value_params / use_virtual_table ask for an SSD"),
                          (dict(batch_sizes=[7]), r"batch_sizes=\[7\] differ from the planner's batch_size 32"),
                          (dict(min_partition=0), "min_partition must be a whole number >= 1"),
                          (dict(min_partition="8"), "min_partition must be a whole number >= 1")]:
        p = planner(models, debug=False)
        p.constraints["wide"] = ParameterConstraints(pooling_factors=[1.0], **bad)
        with pytest.raises(UserError, match=f"^table 'wide' of EmbeddingBagCollection '<root>': ParameterConstraints.*"
                                            f"{fragment}"):
            p.plan(model, sharders())


def test_a_whole_column_wise_only_table_is_priced_in_the_group_torchrec_runs_it_in(models):
    """TorchRec runs a column_wise-only table in its column-wise sharding group even when it stays whole, so the
    step cost charges that group's collectives (one rule, `ShardingTask.column_wise_shards`, for the search, the
    simulator and the sharding types handed out)."""
    from dataclasses import replace

    from neuroshard.sharding.simulator import plan_group_sums

    p = planner(models, kinds={"wide": ["table_wise"], "tiny": ["column_wise"]}, debug=False)
    tr_plan = p.plan(w.ebc(WIDE), sharders())
    r = p.last_result
    tiny = [t.name for t in r.tables].index("tiny")
    assert [s.dim for s in r.plan.shards if s.table == tiny] == [8]  # whole
    assert tr_plan.plan[""]["tiny"].sharding_type == "column_wise" and r.sharding_types[tiny] == "column_wise"
    dims, _ = plan_group_sums(r.task, r.plan)
    assert dims[1].sum() == 8 and dims[0].sum() == 256 + 16  # tiny alone in the column-wise group
    priced_as_table_wise = p.simulator.plan_cost(replace(r.task, column_wise=None), r.plan).cost_ms
    assert r.cost.cost_ms == p.simulator.plan_cost(r.task, r.plan).cost_ms > priced_as_table_wise


def test_no_room_is_one_line(models):
    """Storage as TorchRec's estimator counts it (129,024 bytes for "user", of which 102,400 are weights) against the
    budget left after the reservation; each refusal names the table, both counts, the budget and the fixes."""
    with pytest.raises(UserError, match="^table 'user' of EmbeddingBagCollection 'top' needs 129,024 bytes whole "
                                        r"as TorchRec counts its storage \(weights 102,400 bytes\), more than one rank's "
                                        "116,000 bytes of DDR left after TorchRec's FixedPercentageStorageReservation "
                                        r"\(0%\); allow column_wise sharding of it, or raise the topology's memory; "
                                        "TorchRec's EmbeddingShardingPlanner finds no plan either$"):
        planner(models, TIGHT, kinds={"user": ["table_wise"]}, device="cpu").plan(w.TwoTowerModel(), sharders())
    with pytest.raises(UserError, match="^table 'user' .* needs 17,664 bytes even in column shards of 4 .*more than one "
                                        "rank's 17,000 bytes of HBM .*; raise the topology's memory, or allow row_wise in "
                                        "its ParameterConstraints, or plan it with TorchRec's EmbeddingShardingPlanner, "
                                        r"which can place tables on UVM caching \(NeuroShardPlanner does not price that\)$"):
        planner(models, 17_000, compare=False, kinds={"user": ["table_wise", "column_wise"]}).plan(w.TwoTowerModel(),
                                                                                                  sharders())
    with pytest.raises(UserError, match="^row block 0 of table 'user' .* needs 72,704 bytes whole .*more than one "
                                        "rank's 17,000 bytes of HBM .*; raise the topology's memory, add ranks, or plan "
                                        "it with TorchRec's EmbeddingShardingPlanner, which can place tables on UVM "
                                        r"caching \(NeuroShardPlanner does not price that\)$"):
        planner(models, 17_000, compare=False).plan(w.TwoTowerModel(), sharders())
    with pytest.raises(UserError, match="found no plan for 207,040 bytes of tables .as TorchRec counts them. within 2 "
                                        "ranks x 100,000 bytes of DDR left after.*; TorchRec's EmbeddingShardingPlanner "
                                        "finds no plan either$"):
        planner(models, 100_000, device="cpu").plan(w.TwoTowerModel(), sharders())


@pytest.mark.parametrize("kinds, fragment", [
    ({"item": ["grid_shard"]}, "table 'item' of EmbeddingBagCollection 'top': it allows only grid_shard of the types "
                               "NeuroShardPlanner places, which it places on a topology of one host only"),
    ({"tags": ["table_column_wise", "grid_shard"]}, "table 'tags' of EmbeddingBagCollection 'tower.ebc': it allows "
                                                    "only grid_shard and table_column_wise of the types"),
])
def test_a_table_allowing_no_type_placed_gets_torchrecs_plan_or_one_line(models, kinds, fragment):
    """Only types the search does not place (those of one host, on two): TorchRec's planner places the table, and
    its plan is handed out unchanged, with the reason in the notes; without compare it is one line."""
    from torchrec.distributed.planner import Topology

    def two_hosts(**kw):
        p = planner(models, kinds=kinds, **kw)
        p.topology = p.enumerator.topology = Topology(world_size=2, local_world_size=1, compute_device="cuda",
                                                      hbm_cap=10**6)
        return p

    p = two_hosts(debug=False)
    plan = p.plan(w.TwoTowerModel(), sharders())
    (table, allowed), = kinds.items()
    path = "top" if table == "item" else "tower.ebc"
    assert p.last_result.plan is None and plan.plan[path][table].sharding_type in allowed
    assert any(re.search(fragment, n) for n in p.last_result.notes), p.last_result.notes
    with pytest.raises(UserError, match=fragment):
        two_hosts(compare=False).plan(w.TwoTowerModel(), sharders())


@pytest.mark.parametrize("kind", ["table_row_wise", "grid_shard"])
def test_a_table_row_wise_only_table_goes_row_wise_on_one_host(models, kind):
    """table_row_wise (or grid_shard) alone: on a topology of one host TorchRec cuts it into the row blocks of
    row_wise (grid: of each column block, here one), and NeuroShard places its blocks so and hands them out as that
    type (priced in a group of their own, as the row-wise group's); over two hosts it cuts it over one
    host's ranks, which the search does not place, so TorchRec's plan is handed out (and without compare it is one
    line)."""
    from torchrec.distributed.planner import Topology

    kinds = {"user": [kind]}
    one = planner(models, kinds=kinds, debug=False)
    plan = one.plan(w.TwoTowerModel(), sharders())
    ps, res = plan.plan["top"]["user"], one.last_result
    assert ps.sharding_type == kind and res.plan is not None
    assert [(m.shard_offsets, m.shard_sizes, m.placement.rank()) for m in ps.sharding_spec.shards] == [
        ([0, 0], [200, 64], 0), ([200, 0], [200, 64], 1)]
    blocks = [t.name == "user" for t in res.tables]
    assert list(res.task.type_group) == [{"grid_shard": 5, "table_row_wise": 6}[kind] if b else -1 for b in blocks]
    # its own group: alone, it costs what the row-wise group would
    as_rw = replace(res.task, type_group=None)
    assert one.simulator.plan_cost(res.task, res.plan).cost_ms == one.simulator.plan_cost(as_rw, res.plan).cost_ms
    two = planner(models, kinds=kinds, debug=False)
    two.topology = Topology(world_size=2, local_world_size=1, compute_device="cuda", hbm_cap=10**6)
    two.enumerator.topology = two.topology
    assert two.plan(w.TwoTowerModel(), sharders()).plan["top"]["user"].sharding_type == kind
    assert two.last_result.plan is None and any("places on a topology of one host only" in n
                                                for n in two.last_result.notes), two.last_result.notes


def test_a_table_column_wise_only_table_goes_in_its_own_group_on_one_host(models):
    """table_column_wise alone: on one host NeuroShard cuts its column halvings and hands them out as
    table_column_wise, priced in a sharding group of their own (the same plan with the table column_wise is priced
    the column-wise group's collectives once, here twice); over two hosts TorchRec's plan is handed out."""
    from torchrec.distributed.planner import Topology

    kinds = {"user": ["table_column_wise"], "geo": ["column_wise"]}
    one = planner(models, TIGHT, kinds=kinds, debug=False)
    plan = one.plan(w.TwoTowerModel(), sharders())
    ps, res = plan.plan["top"]["user"], one.last_result
    assert ps.sharding_type == "table_column_wise" and res.plan is not None and res.chosen == "neuroshard"
    assert plan.plan["top"]["geo"].sharding_type == "column_wise"
    assert sorted((m.shard_offsets[1], m.shard_sizes[1]) for m in ps.sharding_spec.shards) == [(0, 32), (32, 32)]
    user = [t.name for t in res.tables].index("user")
    assert list(res.task.type_group) == [4 if t == user else -1 for t in range(len(res.tables))]
    as_cw = replace(res.task, column_wise=res.task.column_wise | (res.task.type_group == 4), type_group=None)
    sim = one.simulator
    assert sim.plan_cost(res.task, res.plan).cost_ms > sim.plan_cost(as_cw, res.plan).cost_ms
    two = planner(models, TIGHT, kinds=kinds, debug=False)
    two.topology = Topology(world_size=2, local_world_size=1, compute_device="cuda", hbm_cap=TIGHT)
    two.enumerator.topology = two.topology
    assert two.plan(w.TwoTowerModel(), sharders()).plan["top"]["user"].sharding_type == "table_column_wise"
    assert two.last_result.plan is None and any("places on a topology of one host only" in n
                                                for n in two.last_result.notes), two.last_result.notes


def test_a_data_parallel_only_table_is_replicated(models):
    """A table whose constraints allow only data_parallel is replicated whatever its size (TorchRec would place it
    so), under the paper's cost too; the statistics show it in one row, on every rank, at its table's pooling."""
    for cost in ("step", "paper"):
        p = planner(models, kinds={"user": ["data_parallel"]}, debug=False, cost=cost)
        plan = p.plan(w.TwoTowerModel(), sharders())
        assert plan.plan["top"]["user"].sharding_type == "data_parallel", cost
        assert plan.plan["top"]["item"].sharding_type in ("table_wise", "column_wise"), cost
        stats = p.stats.format(p.last_result)
        assert re.search(r"# top\.user +400 x 64 +20 +data_parallel +all@0 1 ", stats), stats


def test_a_row_wise_only_table_needs_a_sharder_offering_it(models):
    """row_wise alone: on cuda TorchRec's sharder offers it and the table goes row-wise; on cpu it does not, and the
    line names the sharder that does."""
    assert planner(models, kinds={"item": ["row_wise"]}, debug=False).plan(
        w.TwoTowerModel(), sharders()).plan["top"]["item"].sharding_type == "row_wise"
    with pytest.raises(UserError, match="^table 'item' .*: its sharder EmbeddingBagCollectionSharder offers none of "
                                        "row_wise on cpu; .*RowWiseSharder"):
        planner(models, kinds={"item": ["row_wise"]}, device="cpu").plan(w.TwoTowerModel(), sharders())


def test_modules_the_planner_cannot_take(models):
    import torch
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    p = planner(models)
    with pytest.raises(UserError, match="no EmbeddingBagCollection to plan in the Linear"):
        p.plan(torch.nn.Linear(3, 4), sharders())
    with pytest.raises(UserError, match="at top, tower.ebc have no sharder.*EmbeddingBagCollectionSharder"):
        p.plan(w.TwoTowerModel(), [])
    model = w.TwoTowerModel()
    model.seq = EmbeddingCollection(tables=[EmbeddingConfig(name="s", embedding_dim=8, num_embeddings=10,
                                                            feature_names=["s"])], device=torch.device("meta"))
    with pytest.raises(UserError, match="module 'seq' is a EmbeddingCollection"):
        p.plan(model, sharders() + [EmbeddingCollectionSharder()])
    with pytest.raises(UserError, match="sharders must be a list"):
        p.plan(model, "EmbeddingBagCollectionSharder")
    with pytest.raises(UserError, match="its dim 6 is not a multiple of 4 between 4 and 4096"):  # compare=True
        planner(models, compare=False).plan(w.ebc([("odd", 10, 6, 1.0)]), sharders())  # hands out TorchRec's


@pytest.mark.parametrize("pooling, fragment", [
    ({"item": float("nan")}, "table 'item' .*pooling_factors must be finite numbers >= 0"),
    ({"item": -1.0}, "table 'item' .*pooling_factors must be finite numbers >= 0"),
    ({"item": "many"}, "table 'item' .*pooling_factors .*must be lists of numbers"),
])
def test_bad_pooling_factors_name_the_table(models, pooling, fragment):
    with pytest.raises(UserError, match=fragment):
        planner(models, pooling=pooling).plan(w.TwoTowerModel(), sharders())


def test_bad_construction_is_one_line(models, tmp_path):
    from torchrec.distributed.planner import Topology

    from neuroshard import NeuroShardPlanner

    topo = Topology(world_size=2, compute_device="cuda", hbm_cap=10**6)
    with pytest.raises(UserError, match=r"^NeuroShardPlanner: cost models not found: .*none/compute.pt, .*none/comm_2_fw"
                                        r".pt, .*none/comm_2_bw.pt; train them with .*train_compute_cost_model.py"):
        NeuroShardPlanner(topo, models_dir=tmp_path / "none")  # one line for all, as shard_tables says it
    four = save_hand_models(tmp_path / "four", 4)
    with pytest.raises(UserError, match="trained for 4 devices, the task asks for 2"):
        NeuroShardPlanner(topo, compute_model=four / "compute.pt", fw_comm_model=four / "comm_4_fw.pt",
                          bw_comm_model=four / "comm_4_bw.pt")
    (tmp_path / "junk.pt").write_bytes(b"\x80\x04not a model")
    with pytest.raises(UserError, match="NeuroShardPlanner: .*junk.pt"):
        NeuroShardPlanner(topo, compute_model=tmp_path / "junk.pt", models_dir=models)
    with pytest.raises(UserError, match="needs topology="):
        NeuroShardPlanner(4, models_dir=models)
    for world in (0, 1):  # a world the comm models cannot describe: said as such, not as a wrong type
        with pytest.raises(UserError, match=rf"2 or more ranks .*got Topology\(world_size={world}\); a single rank"):
            NeuroShardPlanner(Topology(world_size=world, compute_device="cpu", ddr_cap=10**6), models_dir=models)
    with pytest.raises(UserError, match=r"constraints\['user'\] is a dict"):
        NeuroShardPlanner(topo, constraints={"user": {"pooling_factors": [3.0]}}, models_dir=models)
    with pytest.raises(UserError, match="batch_size must be a whole number"):
        NeuroShardPlanner(topo, batch_size=0, models_dir=models)
    with pytest.raises(UserError, match="no DDR for embedding tables"):
        NeuroShardPlanner(Topology(world_size=2, compute_device="cpu", ddr_cap=0), models_dir=models)
    with pytest.raises(UserError, match=r"more than 1e\+06 GB; pass Topology\(\.\.\., hbm_cap=BYTES\)"):
        NeuroShardPlanner(Topology(world_size=2, compute_device="cuda", hbm_cap=2**70), models_dir=models)
    for bad in (5, b"m.pt", ""):  # a model path that is not one
        with pytest.raises(UserError, match="input_comm_model must be a file path"):
            NeuroShardPlanner(topo, models_dir=models, input_comm_model=bad)
    with pytest.raises(UserError, match="NeuroShardPlanner: input-distribution model not found"):
        NeuroShardPlanner(topo, models_dir=models, input_comm_model=tmp_path / "no_input.pt")
    from analytic_models import hand_comm_model

    hand_comm_model(2, "bw").save(tmp_path / "bw_as_input.pt")  # another direction's model in its place
    with pytest.raises(UserError, match=r"is the backward comm model, but the input-distribution one .*\(made by "
                                        r"train_comm_cost_model.py --input_dist\)"):
        NeuroShardPlanner(topo, models_dir=models, input_comm_model=tmp_path / "bw_as_input.pt")


def test_collective_plan_needs_a_matching_process_group(models, tmp_path):
    import torch.distributed as dist

    p = planner(models)
    with pytest.raises(UserError, match="needs torch.distributed.init_process_group"):
        p.collective_plan(w.TwoTowerModel(), sharders())
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(UserError, match="process group has 1 ranks but the topology 2"):
            p.collective_plan(w.TwoTowerModel(), sharders())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("geo_kind", ["column_wise", "table_column_wise"])
def test_collective_plan_runs_in_distributed_model_parallel(models, geo_kind):
    """2 gloo ranks: a model rank 0 refuses gives every rank the same error, and so does a rank whose model
    differs from rank 0's (no rank waits forever); then DistributedModelParallel(model,
    plan=planner.collective_plan(model, sharders, pg)) gives the unsharded model's pooled outputs, each
    rank holding exactly the columns the plan gives it ("geo" table_column_wise: a sharding group beside
    "user"'s column_wise one)."""
    got = {}
    kinds, bad = {"geo": [geo_kind]}, {"item": ["row_wise"]}
    run_processes(w.dmp_matches_unsharded, 2, (str(models), TIGHT, kinds, bad, 6),
                  lambda m: got.__setitem__(m[0], m[1:]), group_device="cpu")
    assert set(got) == {0, 1}
    specs = got[0][-1]
    for rank, (errors, err, shape, held, types, _) in got.items():
        assert "table 'item' of EmbeddingBagCollection 'top'" in errors[0], (rank, errors)
        assert ("this rank's model differs" if rank == 1 else "another rank's model differs") in errors[1], errors
        assert err < 1e-5 and shape == (6, sum(d for _, _, d, _ in ALL)), (rank, err, shape)
        want = {t["name"]: sorted(c for s in t["shards"] if s["rank"] == rank
                                  for c in range(s["col_offset"], s["col_offset"] + s["width"]))
                for spec in specs.values() for t in spec["tables"]}
        assert {n: sorted(c) for n, c in held.items()} == {n: c for n, c in want.items() if c}, rank
        assert types["top"]["geo"] == geo_kind and types["top"]["user"] == "column_wise"
    assert set(specs) == {"top", "tower.ebc"}


@pytest.mark.parametrize("user_kinds", [None, ["table_row_wise"], ["grid_shard"]])
def test_row_wise_and_data_parallel_tables_run_in_distributed_model_parallel(models, user_kinds):
    """2 gloo CPU ranks with `RowWiseSharder`, the search's plan (`compare=False`): "user", kept whole by its
    min_partition and over a rank's budget, is planned row-wise (rank r holding rows [200 r, 200 r + 200) of all 64
    columns; table_row_wise or grid_shard where only that is allowed, on this one host), "geo" and "tags", which
    allow only data_parallel, are replicated, and the others follow "user" row-wise where the step cost rates it
    cheaper (here both; not beside a table_row_wise or grid_shard "user", whose group is apart);
    DistributedModelParallel runs the plan's forward (the unsharded model's outputs) and backward."""
    got = {}
    kinds = {"geo": ["data_parallel"], "tags": ["data_parallel"], **({"user": user_kinds} if user_kinds else {})}
    run_processes(w.row_wise_dmp_matches_unsharded, 2, (str(models), 125_000, 6, kinds),
                  lambda m: got.__setitem__(m[0], m[1:]), group_device="cpu")
    assert set(got) == {0, 1}
    for rank, (err, held, types, _) in got.items():
        assert err < 1e-5, (rank, err)
        assert types["top"]["user"] == (user_kinds or ["row_wise"])[0], types
        assert held["user"] == [(200 * rank, 200, 0, 64)], (rank, held)
        assert types["top"]["geo"] == types["tower.ebc"]["tags"] == "data_parallel", types
        assert held["geo"] == [(0, 30, 0, 8)] and held["tags"] == [(0, 60, 0, 16)], held
        if user_kinds:  # row-wise tables would be a group beside "user"'s (TorchRec runs one per type): not cheaper
            assert types["top"]["item"] == types["tower.ebc"]["history"] == "table_wise", types
            continue
        # the step cost (hand models) rates the rest cheaper row-wise too (row_wise_by_cost): no table-wise group
        assert types["top"]["item"] == types["tower.ebc"]["history"] == "row_wise", types
        assert held["item"] == [(60 * rank, 60, 0, 32)] and held["history"] == [(100 * rank, 100, 0, 32)], held
    assert got[0][3] > 0


def test_components_are_replaceable_and_a_misspelt_constraint_is_a_warning(models, caplog):
    """The caller's partitioner and stats are the ones used (TorchRec's planner takes its components the same
    way); the plan is the same as with the defaults; a constraint naming no table is logged as a warning."""
    from torchrec.distributed.planner import ParameterConstraints

    from neuroshard.sharding.planner import GridSearchPartitioner, NeuroShardStats

    class CountingPartitioner(GridSearchPartitioner):
        calls = 0

        def partition(self, *args):
            CountingPartitioner.calls += 1
            return super().partition(*args)

    class KeptStats(NeuroShardStats):
        def log(self, result):
            self.kept = self.format(result)

    default = planner(models, TIGHT, debug=False)
    stats = KeptStats()
    custom = planner(models, TIGHT, partitioner=CountingPartitioner(default.simulator), stats=stats)
    custom.constraints["usr"] = ParameterConstraints(pooling_factors=[3.0])  # misspelt "user"
    custom.enumerator.constraints = custom.constraints
    with caplog.at_level(logging.WARNING, logger="neuroshard.sharding.planner"):
        got = placements(custom.plan(w.TwoTowerModel(), sharders()))
    assert got == placements(default.plan(w.TwoTowerModel(), sharders()))
    assert CountingPartitioner.calls >= 2  # the unsplit shards, then every depth of the beam
    assert "NeuroShard planner: 2 EmbeddingBagCollection(s)" in stats.kept and "note: cost models: " in stats.kept
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("unused: small, tiny, usr, wide;" in m for m in warned), warned


def test_the_planner_takes_a_saved_calibration_and_names_it(models, tmp_path):
    """`simulator=read_calibration(path)`: the pair the reader returns is taken as it is, and the notes name the
    calibration by its fingerprint; a missing file or another object is one line."""
    from neuroshard.planning.calibration_file import read_calibration, save_calibration
    from neuroshard.sharding.simulator import Simulator

    sim = Simulator.load(models / "compute.pt", models / "comm_2_fw.pt", models / "comm_2_bw.pt", num_devices=2)
    path = tmp_path / "plan.calibration.pt"
    save_calibration(path, sim, {"made_for": {"tables": "the user's"}})
    pair = read_calibration(path)
    assert isinstance(pair[0], Simulator) and len(pair[1]["fingerprint"]) == 16
    p = planner(models, simulator=pair, debug=False)
    p.plan(w.ebc(WIDE), sharders())
    assert any(f"the calibration given (fingerprint {pair[1]['fingerprint']})" in n for n in p.last_result.notes)
    with pytest.raises(UserError, match="no such calibration; make one with tools/shard_tables.py --calibrate"):
        read_calibration(tmp_path / "absent.calibration.pt")
    with pytest.raises(UserError, match="simulator must be a neuroshard Simulator or the .Simulator, report. pair"):
        planner(models, simulator=(object(), {}))


def test_the_planner_refuses_costs_that_cannot_be_true(models, tmp_path):
    """A compute bias of 1e30, in model files or in a calibration given (one without measurements, which
    read_calibration cannot check): no plan is handed out, one line names the models and the parameter to change."""
    import shutil

    import torch

    from neuroshard.planning.calibration_file import read_calibration, save_calibration
    from neuroshard.sharding.simulator import Simulator

    bad = tmp_path / "bad"
    shutil.copytree(models, bad)
    obj = torch.load(bad / "compute.pt", weights_only=True)
    obj["state_dict"]["head.2.bias"] += 1e30
    torch.save(obj, bad / "compute.pt")
    with pytest.raises(UserError, match=r"^NeuroShardPlanner: the cost models \(.*compute.pt.*\) predict a compute "
                                        r"cost that cannot be true \(1e\+30 ms.* pass a calibration of these tables"):
        planner(bad, debug=False).plan(w.ebc(WIDE), sharders())
    path = tmp_path / "plan.calibration.pt"
    save_calibration(path, Simulator.load(bad / "compute.pt", bad / "comm_2_fw.pt", bad / "comm_2_bw.pt"),
                     {"made_for": {"tables": "the user's"}})
    with pytest.raises(UserError, match=r"^NeuroShardPlanner: the calibration given \(fingerprint .*\) predict a "
                                        r"compute cost that cannot be true .*calibrate them again"):
        planner(models, simulator=read_calibration(path), debug=False).plan(w.ebc(WIDE), sharders())


def test_the_perf_model_ranks_the_proposals(models):
    """The perf model rates every placement the search makes and every plan compared, so another perf model makes
    other decisions: one that takes 1 s off for each column split splits more than the default."""
    from neuroshard.sharding.planner import NeuralPerfModel

    class SplitsPay(NeuralPerfModel):
        def rate_placements(self, shards, placements):
            splits = placements.items.shape[1] - len(WIDE)  # shards beyond one a table
            return super().rate_placements(shards, placements) - 1000.0 * splits

    default = planner(models, debug=False, cost="paper", compare=False)
    default.plan(w.ebc(WIDE), sharders())
    assert default.last_result.plan.splits, "the default perf model splits the wide table"
    custom = planner(models, debug=False, cost="paper", compare=False, perf_model=SplitsPay(default.simulator))
    custom.plan(w.ebc(WIDE), sharders())
    assert len(custom.last_result.plan.splits) > len(default.last_result.plan.splits)


def test_the_thresholds_are_widened_once_per_plan(models, monkeypatch):
    """`fitting_thresholds` runs once on the planner's path: the proposer searches the thresholds it is given."""
    from neuroshard.sharding import search
    from neuroshard.sharding.planner import planners

    calls, widen = [], search.fitting_thresholds

    def counted(*args, **kw):
        calls.append(args)
        return widen(*args, **kw)

    monkeypatch.setattr(planners, "fitting_thresholds", counted)
    monkeypatch.setattr(search, "fitting_thresholds", counted)
    p = planner(models, kinds={"wide": ["table_wise"]}, debug=False)
    p.plan(w.ebc(WIDE), sharders())
    assert len(calls) == 1 and any("thresholds widened" in n for n in p.last_result.notes)


def test_ids_measure_each_row_blocks_share_and_histogram(models):
    """ids= given: a table's reuse histogram is measured from them, and so is each of its row blocks' share of the
    lookups. "user" (400 rows, row-wise in blocks of 200 on 2 ranks) read only in its first 200 rows puts all 20
    lookups a sample on rank 0's block, and the compute the perf model predicts for rank 0 rises accordingly."""
    import numpy as np
    import torch

    from neuroshard.data.features import reuse_histogram

    hot = torch.tensor([0] * 30 + [1] * 5 + list(range(2, 120)))  # all in block 0, a skewed histogram
    spread = hot * 3  # 0..357: both blocks, in the same counts
    got = {}
    for name, ids in (("hot", hot), ("spread", spread), ("none", None)):
        p = planner(models, TIGHT, debug=False, min_partition={"user": 64}, compare=False,
                    ids=None if ids is None else {"user": ids, "geo": torch.tensor([0, 0, 1])})
        assert p.plan(w.TwoTowerModel(), sharders()).plan["top"]["user"].sharding_type == "row_wise"
        got[name] = p.last_result
    res = got["hot"]
    blocks = [i for i, t in enumerate(res.tables) if t.name == "user"]
    assert [res.tables[i].row_block for i in blocks] == [0, 1]
    assert res.task.data_features[blocks, 1].tolist() == [20.0, 0.0]  # all of the table's lookups in block 0
    _, counts = np.unique(hot.numpy(), return_counts=True)
    assert np.allclose(res.task.data_features[blocks[0], 2:], reuse_histogram(counts))
    assert not res.task.data_features[blocks[1], 2:].any()
    geo = next(i for i, t in enumerate(res.tables) if t.name == "geo")
    assert np.allclose(res.task.data_features[geo, 2:], reuse_histogram(np.array([2, 1])))
    assert any("user 1.00/0.00" in n for n in res.notes), res.notes
    spread_blocks = got["spread"].task.data_features[blocks, 1].tolist()
    assert spread_blocks == [20.0 * np.mean(spread.numpy() < 200), 20.0 * np.mean(spread.numpy() >= 200)]
    assert got["none"].task.data_features[blocks, 1].tolist() == [10.0, 10.0]  # no ids: spread evenly over rows
    assert any("published DLRM" in n for n in got["none"].notes)
    # rank 0 does all of "user"'s lookups: its predicted compute is above any rank's where they spread evenly
    assert res.cost.compute_ms[0] > max(got["none"].cost.compute_ms) + 1.0, (res.cost, got["none"].cost)


@pytest.mark.parametrize("ids, fragment", [
    ([1, 2], r"^ids must be a dict \{table name: 1-D tensor"),
    ({3: [1]}, r"^ids\[.3.\]: keys must be table names"),
    ({"user": [1, 2]}, r"^ids\['user'\]: pass a 1-D torch tensor or numpy array"),
    ({"user": "torch.zeros(2, 2, dtype=torch.long)"}, r"^ids\['user'\]: pass a non-empty 1-D tensor .* shape \(2, 2\)"),
    ({"user": "torch.zeros(0, dtype=torch.long)"}, r"^ids\['user'\]: pass a non-empty 1-D tensor .* shape \(0,\)"),
    ({"user": "torch.tensor([0.5])"}, r"^ids\['user'\]: ids must be integers, got dtype float32"),
    ({"user": "torch.tensor([-1, 3])"}, r"^ids\['user'\]: ids must be row numbers .*got -1"),
    ({"user": "np.array([2**64 - 1], np.uint64)"}, r"^ids\['user'\]: ids must be row numbers"),
])
def test_bad_ids_are_one_line_at_construction(models, ids, fragment):
    import numpy as np
    import torch

    env = {"np": np, "torch": torch}  # the parameters' tensors, made here
    if isinstance(ids, dict):
        ids = {k: eval(v, env) if isinstance(v, str) else v for k, v in ids.items()}
    with pytest.raises(UserError, match=fragment):
        planner(models, ids=ids)


def test_ids_out_of_a_tables_rows_or_of_no_table_are_one_line_at_plan(models):
    import torch

    from neuroshard.sharding.planner.enumerators import EmbeddingBagEnumerator

    with pytest.raises(UserError, match=r"^table 'geo' .*: ids\['geo'\] holds id 30, beyond its 30 rows"):
        planner(models, ids={"geo": torch.tensor([0, 30])}).plan(w.TwoTowerModel(), sharders())
    with pytest.raises(UserError, match=r"^ids= names table\(s\) no planned EmbeddingBagCollection has: usr"):
        planner(models, ids={"usr": torch.tensor([0])}).plan(w.TwoTowerModel(), sharders())
    with pytest.raises(UserError, match=r"^ids= reaches NeuroShardPlanner's own enumerator"):
        planner(models, ids={"geo": torch.tensor([0])}, enumerator=EmbeddingBagEnumerator({}, "cuda", None, 32, "HBM"))


def test_replicas_are_dropped_before_the_search_gives_up(models):
    """A replica of a small table costs memory on every rank. At 112,000 bytes a rank the search finds no plan with
    the replicas the data-parallel rule picks ("geo", "tags"), however many tables go row-wise; without them it
    does, and that plan is handed out (not TorchRec's). At 120,000 the replicas fit, and the search runs with and
    without them and keeps the plan rated cheaper: the one it hands out is rated as the cheaper of the plan that
    keeps them (their constraints allowing only data_parallel) and the one without (allowing every other type), and
    replicates them exactly where that one does."""
    kinds = {n: w.SHARDED + ["data_parallel"] for n, *_ in ALL}
    tight = planner(models, 112_000, kinds=kinds, debug=False)
    tight.plan(w.TwoTowerModel(), sharders())
    res = tight.last_result
    assert res.plan is not None and not any("handed out TorchRec" in n for n in res.notes), res.notes
    assert not any(k.startswith("data_parallel") for k in res.sharding_types), res.sharding_types
    rated, replicated = {}, {}
    for case, forced in (("rule", {}), ("with", {"geo": ["data_parallel"], "tags": ["data_parallel"]}),
                         ("without", {"geo": w.SHARDED, "tags": w.SHARDED})):
        roomy = planner(models, 120_000, kinds={**kinds, **forced}, debug=False, compare=False)
        roomy.plan(w.TwoTowerModel(), sharders())
        kinds_of = dict(zip([t.name for t in roomy.last_result.tables], roomy.last_result.sharding_types))
        replicated[case] = kinds_of["geo"] == kinds_of["tags"] == "data_parallel"
        rated[case] = roomy.last_result.cost.cost_ms
    assert replicated["with"] and not replicated["without"] and rated["with"] != rated["without"], rated
    cheaper = "with" if rated["with"] < rated["without"] else "without"
    assert rated["rule"] == pytest.approx(rated[cheaper]) and replicated["rule"] == replicated[cheaper], (rated, replicated)


def test_more_tables_go_row_wise_where_the_step_is_rated_cheaper(models, tmp_path):
    """Where a table already goes row-wise, others follow it where the perf model rates the step cheaper. With
    collectives' costs that make a row-wise group nearly free, every table that may go row-wise does (no table-wise
    group left to pay for), each round rated cheaper than the last; without a row-wise table to start from, none
    does (the rounds run only where memory or constraints put tables row-wise). The search's plans (`compare=False`:
    TorchRec's planner cuts every table row-wise here, which the cheap collectives rate fastest)."""
    import shutil

    from neuroshard.models.collective_models import CollectiveCost, CollectiveModels
    from neuroshard.sharding.planner import planners

    cheap = tmp_path / "models"
    shutil.copytree(models, cheap)
    CollectiveModels(2, 64, {k: CollectiveCost(0.001, 1e-6) for k in ("reduce_scatter", "all_gather", "all_reduce")},
                     {}).save(cheap / "comm_2_collectives.json")
    rated = {}
    for rounds in (0, planners.ROW_WISE_ROUNDS):
        pl = planner(cheap, kinds={"user": ["row_wise"]}, debug=False, row_wise_by_cost=rounds > 0, compare=False)
        pl.plan(w.TwoTowerModel(), sharders())
        res = pl.last_result
        kinds = dict(zip([t.name for t in res.tables], res.sharding_types))
        rated[rounds] = res.cost.cost_ms
        if rounds == 0:
            assert kinds["user"] == "row_wise" and kinds["item"] in ("table_wise", "column_wise"), kinds
        else:
            assert set(kinds.values()) == {"row_wise"}, kinds
            assert any("or the step costs less" in n for n in res.notes), res.notes
    assert rated[planners.ROW_WISE_ROUNDS] < rated[0]
    pl = planner(cheap, debug=False, compare=False)
    pl.plan(w.TwoTowerModel(), sharders())
    assert "row_wise" not in pl.last_result.sharding_types, pl.last_result.sharding_types
    with pytest.raises(UserError, match="^NeuroShardPlanner: row_wise_by_cost= must be True or False, got 'yes'"):
        planner(cheap, row_wise_by_cost="yes")


def test_tables_the_cost_models_cannot_price_get_torchrecs_plan_not_a_refusal(models):
    """Where a table's constraints leave out the fused kernel (only UVM kernels, or only dense, sharded) or its
    dim is not a multiple of 4 in 4..4096, the search cannot price it: TorchRec's planner's plan is handed out
    unchanged (it was refused in one line where TorchRec plans). `compute_kernels=[]` constrains nothing, as in
    TorchRec; dense allowed with data_parallel keeps the table replicated by the search."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    from neuroshard import NeuroShardPlanner

    def both(tables, constraints, device="cuda"):
        topology = Topology(world_size=2, compute_device=device,
                            **({"hbm_cap": 10**6} if device == "cuda" else {"ddr_cap": 10**6}))
        ours = NeuroShardPlanner(topology, constraints=constraints, models_dir=models,
                                 storage_reservation=w.no_reservation())
        mine = ours.plan(w.ebc(tables), sharders()).plan[""]
        theirs = EmbeddingShardingPlanner(topology=topology, batch_size=ours.batch_size, constraints=constraints,
                                          storage_reservation=w.no_reservation()).plan(w.ebc(tables), sharders())
        kinds = {n: (ps.sharding_type, ps.compute_kernel, ps.ranks) for n, ps in mine.items()}
        return kinds, {n: (ps.sharding_type, ps.compute_kernel, ps.ranks) for n, ps in theirs.plan[""].items()}, \
            ours.last_result

    tables = [("a", 400, 16, 2.0), ("b", 100, 32, 1.0)]
    for kernels in (["fused_uvm_caching"], ["fused_uvm"]):
        mine, theirs, res = both(tables, {"a": ParameterConstraints(pooling_factors=[2.0], compute_kernels=kernels)})
        assert mine == theirs and mine["a"][1] in kernels and res.chosen == "torchrec"
        assert any("exclude 'fused'" in n for n in res.notes), res.notes
    mine, theirs, res = both(tables, {"a": ParameterConstraints(pooling_factors=[2.0], compute_kernels=[])})
    assert mine["a"][1] == "fused" and res.chosen != "torchrec"
    mine, _, res = both(tables, {"a": ParameterConstraints(pooling_factors=[2.0], compute_kernels=["dense"])}, "cpu")
    assert mine["a"][:2] == ("data_parallel", "dense") and res.chosen != "torchrec"
    mine, theirs, res = both([("a", 400, 6, 2.0), ("b", 100, 32, 1.0)], {})
    assert mine == theirs and res.chosen == "torchrec"
    assert any("its dim 6 is not a multiple of 4 between 4 and 4096" in n for n in res.notes), res.notes


def test_more_inputs_the_planner_refuses_in_one_line_or_takes(models):
    """A NaN memory cap, ids on the meta device, models_dir=None without the three model files and a bad
    num_poolings are one line naming them; a constraints key that names no table (an int here) is only warned
    about, as a misspelt name is."""
    import torch
    from torchrec.distributed.planner import ParameterConstraints, Topology

    from neuroshard import NeuroShardPlanner

    def make(topology=None, **kw):
        return NeuroShardPlanner(topology or Topology(world_size=2, compute_device="cuda", hbm_cap=10**6),
                                 models_dir=kw.pop("models_dir", models), storage_reservation=w.no_reservation(), **kw)

    with pytest.raises(UserError, match=r"the topology gives rank 0 nan bytes of HBM; pass Topology\(\.\.\., hbm_cap"):
        make(Topology(world_size=2, compute_device="cuda", hbm_cap=float("nan")))
    with pytest.raises(UserError, match=r"ids\['a'\]: a tensor on the meta device holds no ids"):
        make(ids={"a": torch.zeros(4, dtype=torch.long, device="meta")})
    with pytest.raises(UserError, match="models_dir=None needs compute_model, fw_comm_model and bw_comm_model"):
        make(models_dir=None)
    bad = {"user": ParameterConstraints(pooling_factors=[2.0], num_poolings=[float("nan")])}
    with pytest.raises(UserError, match=r"num_poolings must be finite numbers >= 0, one per pooling factor \(1\), "
                                        r"got \[nan\]"):
        make(constraints=bad).plan(w.ebc(w.TOP), sharders())
    plan = make(constraints={1: ParameterConstraints(pooling_factors=[2.0])}).plan(w.ebc(w.TOP), sharders())
    assert set(plan.plan[""]) == {n for n, *_ in w.TOP}
