"""How much of the DLRM's dot interaction survives DCT-MP (benchmarks/mp_interaction.py).

DCT-MP sends, per sample, the k largest-magnitude pooled-embedding entries of each rank (`hardware.mp_wire`).
The top MLP sees the dot products of every pair of features (the bottom MLP's output z and every table's
pooled embedding). A table-table dot product is non-zero only where the two tables' kept columns overlap;
with k of a rank's W_r columns kept independently per sample, they rarely do. `mp_interaction_fidelity`
measures this on real data at a run's initial weights (the same plan, embeddings and bottom MLP that
`train_dlrm` would start from at that seed): per kind of pair (z-table, table-table), the share of
dot products that are exactly zero under DCT-MP, the median over pairs of the Pearson correlation of
the compressed and the uncompressed dot product across samples, and the relative error of all of them.
"""
from __future__ import annotations

import numpy as np
import torch

from ..hardware import mp_wire
from .dlrm import ShardedEmbeddings
from .train import TrainConfig, shard_training_tables


def _pair_stats(full: torch.Tensor, kept: torch.Tensor) -> dict:
    """full, kept: [samples, pairs] dot products -> zero share, median correlation, relative error."""
    corr = []
    for j in range(full.shape[1]):
        a, b = full[:, j].double(), kept[:, j].double()
        corr.append(float(torch.corrcoef(torch.stack([a, b]))[0, 1]) if a.std() > 0 and b.std() > 0 else 0.0)
    return {"pairs": int(full.shape[1]), "zero_share": float((kept == 0).double().mean()),
            "median_corr": float(np.median(corr)),
            "rel_error": float((kept - full).norm() / full.norm().clamp_min(1e-30))}


def mp_interaction_fidelity(data, cfg: TrainConfig, num_samples: int = 4096) -> dict:
    """The dot interaction of the first `num_samples` training samples, uncompressed vs under DCT-MP at
    `cfg.mp_keep`, at the initial weights of `cfg.seed` on `cfg.ndevices` ranks (no training)."""
    cfg = cfg.check().resolved()
    n = min(num_samples, data.num_train) // cfg.ndevices * cfg.ndevices
    x, sparse, _ = data.batch(torch.arange(n))
    T, D = len(data.num_rows), cfg.emb_dim
    rank_shards = shard_training_tables(data, cfg)
    layout = mp_wire.WireLayout([sum(w for _, _, w in s) for s in rank_shards], cfg.mp_keep, n)
    full, kept = torch.zeros(n, T, D), torch.zeros(n, T, D)
    with torch.no_grad():
        for r, shards in enumerate(rank_shards):
            pooled = ShardedEmbeddings(shards, data.num_rows, D, cfg.seed)(sparse, n)
            _, idx = mp_wire.encode(pooled, layout, r)  # the entries DCT-MP sends, as fp16
            sent = torch.zeros_like(pooled).scatter(1, idx, pooled.gather(1, idx).half().float())
            c0 = 0
            for t, c, w in shards:
                full[:, t, c:c + w], kept[:, t, c:c + w] = pooled[:, c0:c0 + w], sent[:, c0:c0 + w]
                c0 += w
        torch.manual_seed(cfg.seed)  # the DenseArch train_rank starts from at this seed
        z = cfg.dense_arch(data.dense.shape[1], T).bottom(x)
        dots = [torch.bmm(f, f.transpose(1, 2)) for f in (torch.cat([z.unsqueeze(1), e], 1) for e in (full, kept))]
    iu = torch.triu_indices(T + 1, T + 1, offset=1)
    z_pairs, table_pairs = iu[:, iu[0] == 0], iu[:, iu[0] > 0]
    return {"samples": n, "kept_per_sample": layout.ks, "widths": layout.widths,
            **{kind: _pair_stats(*(d[:, p[0], p[1]] for d in dots))
               for kind, p in (("z_table", z_pairs), ("table_table", table_pairs))}}
