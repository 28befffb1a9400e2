"""Rank function for the TorchRec export test (importable by spawned ranks)."""
import torch


def weight(rows, dim, name):
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    return torch.randn(rows, dim, generator=g)


def dmp_matches_unsharded(rank, world, emit, spec, batch, plan_path):
    """Shard an EBC with the plan file written by the export, as a user loads it (`load_torchrec_plan`), in
    DistributedModelParallel on gloo ranks, and compare pooled outputs with the unsharded module's."""
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from neuroshard.sharding.torchrec_export import load_torchrec_plan, make_ebc

    dmp = DistributedModelParallel(module=make_ebc(spec, "meta"), env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   plan=load_torchrec_plan(plan_path, device_type="cpu"), device=torch.device("cpu"),
                                   sharders=[EmbeddingBagCollectionSharder()])
    state = dmp.state_dict()
    held = {}
    for key, value in state.items():
        name = key.split(".")[-2]
        t = next(t for t in spec["tables"] if t["name"] == name)
        full = weight(t["rows"], t["dim"], name)
        for shard in value.local_shards():
            (r0, c0), (rs, cs) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            shard.tensor.copy_(full[r0:r0 + rs, c0:c0 + cs])
            held.setdefault(name, []).append((c0, cs))
    dmp.load_state_dict(state)
    g = torch.Generator().manual_seed(rank)
    names = [t["name"] for t in spec["tables"]]
    lengths = torch.randint(0, 4, (len(names) * batch,), generator=g)
    values = torch.cat([torch.randint(0, t["rows"], (int(lengths[i * batch:(i + 1) * batch].sum()),), generator=g)
                        for i, t in enumerate(spec["tables"])])
    kjt = KeyedJaggedTensor(keys=names, values=values, lengths=lengths)
    out = dmp(kjt)
    out = out.wait() if hasattr(out, "wait") else out
    ref = make_ebc(spec, "cpu")
    with torch.no_grad():
        for t in spec["tables"]:
            ref.embedding_bags[t["name"]].weight.copy_(weight(t["rows"], t["dim"], t["name"]))
    with torch.no_grad():
        expect = ref(kjt)
        emit((rank, {n: float((out[n] - expect[n]).abs().max()) for n in names}, held))
