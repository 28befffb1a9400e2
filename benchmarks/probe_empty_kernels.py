"""Probe: which fused kernels of tables with no rows FBGEMM's CPU operator (fbgemm-gpu-cpu 1.8.0) trains.

Each kernel (a list of table row counts, as TorchRec fuses a rank's row blocks of one sharding type) runs 200
forward + backward steps with exact row-wise Adagrad, one id a bag where a table has rows; the script prints how
many steps failed and with which errors. The finding is in docs/findings.md; this script leaves the tree next.
"""
import argparse

import torch


def failures(rows: list[int], steps: int, dim: int = 8, bags: int = 16) -> tuple[int, set]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice,
                                                                        SplitTableBatchedEmbeddingBagsCodegen)

    op = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(r, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for r in rows],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01, pooling_mode=PoolingMode.SUM,
        device=torch.device("cpu"))
    failed, errors = 0, set()
    for _ in range(steps):
        ids, offsets = [], [0]
        for r in rows:
            for _ in range(bags):
                ids += [int(torch.randint(0, r, ()))] if r else []
                offsets.append(len(ids))
        try:
            op(torch.tensor(ids, dtype=torch.int64), torch.tensor(offsets, dtype=torch.int64)).sum().backward()
        except RuntimeError as e:
            failed += 1
            errors.add(str(e).splitlines()[0][:120])
    return failed, errors


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    for rows in ([5, 0], [0, 5], [2, 2, 0], [1, 0, 0], [0, 2, 0], [0, 0, 5], [0], [0, 0]):
        n, errors = failures(rows, args.steps)
        print(f"rows {rows}: {n} of {args.steps} steps failed {sorted(errors)}", flush=True)
