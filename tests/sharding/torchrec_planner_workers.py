"""A model with two EmbeddingBagCollections (one nested) and rank functions for the NeuroShardPlanner
tests (importable by spawned ranks)."""
import torch

# (name, rows, dim, pooling factor) of each EBC's tables: 148,160 bytes of fp32 weights in all, "user"
# alone 102,400, so a cap below that on 2 ranks forces a column split of it
TOP = [("user", 400, 64, 20.0), ("item", 120, 32, 4.0), ("geo", 30, 8, 1.0)]
TOWER = [("history", 200, 32, 12.0), ("tags", 60, 16, 2.0)]


# the sharding types the tests of sharded plans allow by default: not data_parallel, which NeuroShardPlanner picks
# for these small tables (fewer rows than the global batch) and which `test_data_parallel...` tests on its own
SHARDED = ["table_wise", "column_wise", "row_wise"]


def configs(tables):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    return [EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[n]) for n, r, d, _ in tables]


def ebc(tables, device="meta"):
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return EmbeddingBagCollection(tables=configs(tables), device=torch.device(device))


class Tower(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        self.ebc = ebc(TOWER, device)


class TwoTowerModel(torch.nn.Module):
    """Pooled embeddings of both EBCs, concatenated: [batch, sum of dims]."""

    def __init__(self, device="meta"):
        super().__init__()
        self.top = ebc(TOP, device)
        self.tower = Tower(device)

    def forward(self, top_kjt, tower_kjt):
        top, tower = self.top(top_kjt).to_dict(), self.tower.ebc(tower_kjt).to_dict()
        return torch.cat([top[n] for n, *_ in TOP] + [tower[n] for n, *_ in TOWER], dim=1)


def weight(rows, dim, name):
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    return torch.randn(rows, dim, generator=g)


def kjt(tables, batch, g):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths = torch.randint(0, 4, (len(tables) * batch,), generator=g)
    values = torch.cat([torch.randint(0, r, (int(lengths[i * batch:(i + 1) * batch].sum()),), generator=g)
                        for i, (_, r, _, _) in enumerate(tables)])
    return KeyedJaggedTensor(keys=[t[0] for t in tables], values=values, lengths=lengths)


def load_weights(dmp) -> dict:
    """Every table's `weight` into the sharded model's shards: {table: [(row offset, rows, col offset, cols)]} this
    rank holds."""
    state = dmp.state_dict()
    held = {}
    for key, value in state.items():
        name = key.split(".")[-2]
        rows, dim = next((r, d) for n, r, d, _ in TOP + TOWER if n == name)
        full = weight(rows, dim, name)
        if not hasattr(value, "local_shards"):  # a data-parallel table: a whole replica on every rank
            value.copy_(full)
            held.setdefault(name, []).append((0, rows, 0, dim))
            continue
        for shard in value.local_shards():
            (r0, c0), (rs, cs) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            shard.tensor.copy_(full[r0:r0 + rs, c0:c0 + cs])
            held.setdefault(name, []).append((r0, rs, c0, cs))
    dmp.load_state_dict(state)
    return held


def unsharded_outputs(rank: int, batch: int):
    """This rank's inputs (top and tower KJTs) and the unsharded model's pooled outputs on them."""
    g = torch.Generator().manual_seed(rank)
    top, tower = kjt(TOP, batch, g), kjt(TOWER, batch, g)
    ref = TwoTowerModel("cpu")
    with torch.no_grad():
        for collection, tables in ((ref.top, TOP), (ref.tower.ebc, TOWER)):
            for n, r, d, _ in tables:
                collection.embedding_bags[n].weight.copy_(weight(r, d, n))
        return top, tower, ref(top, tower)


def no_reservation():
    """A storage reservation that keeps nothing back, so a test's cap is the tables' budget to the byte."""
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    return FixedPercentageStorageReservation(percentage=0.0)


def make_planner(models_dir, world, mem_bytes, kinds, min_partition=None, **kw):
    """A planner for the CPU ranks; `kinds` maps table names to their allowed sharding types, `min_partition` to
    their narrowest column shards; `kw` to NeuroShardPlanner."""
    from torchrec.distributed.planner import ParameterConstraints, Topology

    from neuroshard import NeuroShardPlanner

    constraints = {n: ParameterConstraints(pooling_factors=[pf], sharding_types=kinds.get(n, SHARDED),
                                           min_partition=(min_partition or {}).get(n)) for n, _, _, pf in TOP + TOWER}
    topology = Topology(world_size=world, compute_device="cpu", ddr_cap=mem_bytes)
    return NeuroShardPlanner(topology=topology, constraints=constraints, models_dir=models_dir,
                             storage_reservation=no_reservation(), **kw)


def dmp_matches_unsharded(rank, world, emit, models_dir, mem_bytes, kinds, bad_kinds, batch):
    """First a collective_plan that rank 0 refuses (`bad_kinds`), then one where rank 1's model lacks a
    table: every rank must get a UserError. Then plan with collective_plan, shard with
    DistributedModelParallel (gloo) and compare pooled outputs with the unsharded model's."""
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from neuroshard.core.errors import UserError

    sharders = [EmbeddingBagCollectionSharder()]
    errors = []
    other = TwoTowerModel()
    if rank == 1:
        other.tower.ebc = ebc(TOWER[:1])
    for model, kinds_now in ((TwoTowerModel(), bad_kinds), (other, kinds)):
        try:
            make_planner(models_dir, world, mem_bytes, kinds_now).collective_plan(model, sharders, dist.group.WORLD)
            errors.append(None)
        except UserError as e:
            errors.append(str(e))
    model = TwoTowerModel("meta")
    planner = make_planner(models_dir, world, mem_bytes, kinds)
    plan = planner.collective_plan(model, sharders, dist.group.WORLD)
    dmp = DistributedModelParallel(model, plan=plan, device=torch.device("cpu"), sharders=sharders)
    held = {name: [c for _, _, c0, cs in pieces for c in range(c0, c0 + cs)] for name, pieces in load_weights(dmp).items()}
    top, tower, expect = unsharded_outputs(rank, batch)
    with torch.no_grad():
        got = dmp(top, tower)
    types = {path: {n: ps.sharding_type for n, ps in module_plan.items()} for path, module_plan in plan.plan.items()}
    specs = planner.last_result.specs if rank == 0 else None
    emit((rank, errors, float((got - expect).abs().max()), tuple(got.shape), held, types, specs))


def row_wise_dmp_matches_unsharded(rank, world, emit, models_dir, mem_bytes, batch, kinds):
    """"user" kept whole by its min_partition and too big for one rank goes row-wise (`RowWiseSharder` offers
    row_wise on cpu), and the tables `kinds` allows every type may go data-parallel: DistributedModelParallel on
    gloo ranks gives the unsharded model's pooled outputs, each rank holding the rows of its block, and a backward
    step runs."""
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from neuroshard.sharding.planner.sharders import RowWiseSharder

    sharders = [RowWiseSharder()]
    model = TwoTowerModel("meta")
    planner = make_planner(models_dir, world, mem_bytes, kinds, {"user": 64}, compare=False)
    plan = planner.collective_plan(model, sharders, dist.group.WORLD)
    dmp = DistributedModelParallel(model, plan=plan, device=torch.device("cpu"), sharders=sharders)
    held = load_weights(dmp)
    top, tower, expect = unsharded_outputs(rank, batch)
    got = dmp(top, tower)
    got.sum().backward()  # the fused kernel applies its optimizer in backward
    types = {path: {n: ps.sharding_type for n, ps in module_plan.items()} for path, module_plan in plan.plan.items()}
    emit((rank, float((got.detach() - expect).abs().max()), held, types,
          planner.last_result.cost.cost_ms if rank == 0 else None))
