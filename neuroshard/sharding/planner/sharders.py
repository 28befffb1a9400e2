"""`RowWiseSharder`: TorchRec's `EmbeddingBagCollectionSharder` that offers `row_wise`, `table_row_wise` and
`grid_shard` on CPU ranks too.

TorchRec withholds the three on CPU only in its sharder's list of sharding types; the row-wise sharding itself
(bucketized input distribution, reduce-scatter of pooled partial sums) runs on gloo CPU ranks. Pass it to
`NeuroShardPlanner.plan` / `collective_plan` and to `DistributedModelParallel` alike, so that a CPU model can have
tables no rank holds in one piece:

    sharders = [RowWiseSharder()]
    plan = NeuroShardPlanner(topology=Topology(world_size=4, compute_device="cpu", ddr_cap=...)).collective_plan(
        model, sharders, pg)
    model = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
"""
from __future__ import annotations

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

ROW_WISE_TYPES = ("row_wise", "table_row_wise", "grid_shard")


class RowWiseSharder(EmbeddingBagCollectionSharder):
    """TorchRec's sharder with `row_wise`, `table_row_wise` and `grid_shard` on every device type."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = list(super().sharding_types(compute_device_type))
        return types + [t for t in ROW_WISE_TYPES if t not in types]
