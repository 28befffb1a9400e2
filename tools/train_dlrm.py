"""Hybrid-parallel DLRM training with Dynamic Communication Thresholding (DCT, DESIGN.md §5).

Embeddings model-parallel (sharded by --alg, pooled per rank, all-to-all), MLPs data-parallel under
DDP; --dct compresses the DP gradient exchange (dp), the embedding all-to-all (mp), or both.
"""
from __future__ import annotations

from neuroshard.core.cli import ArgumentParser, run_main
from neuroshard.training.train import DCT_MODES, TrainConfig, train_dlrm


def main(argv=None) -> int:
    d = TrainConfig()
    p = ArgumentParser(description=__doc__)
    p.add_argument("--dataset", default=d.dataset, help="movielens (MovieLens-100K) or synthetic")
    p.add_argument("--ndevices", type=int, default=d.ndevices, help="ranks (gloo processes)")
    p.add_argument("--alg", default=d.alg, help="sharding algorithm for the embedding tables")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch_size", type=int, default=d.batch_size, help="global batch")
    p.add_argument("--dct", default=d.dct, choices=DCT_MODES)
    p.add_argument("--dp_keep", type=float, default=d.dp_keep, help="share of DP gradient entries sent")
    p.add_argument("--dp_refresh", type=int, default=d.dp_refresh, help="iterations between threshold updates")
    p.add_argument("--mp_keep", type=float, default=d.mp_keep, help="share of pooled-embedding entries sent")
    p.add_argument("--error_feedback", default="on", choices=["on", "off"])
    p.add_argument("--emb_dim", type=int, default=d.emb_dim)
    p.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate of the MLPs")
    p.add_argument("--emb_lr", type=float, default=d.emb_lr, help="SGD learning rate of the embeddings")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max_mem", type=float, default=d.max_mem, help="GB per device for the sharding plan")
    p.add_argument("--num_samples", type=int, default=None, help="synthetic: samples (default 200000)")
    p.add_argument("--results_csv", default="results/dct.csv")
    p.add_argument("--compute_model", default=None)
    p.add_argument("--fw_comm_model", default=None)
    p.add_argument("--bw_comm_model", default=None)
    a = p.parse_args(argv)
    cfg = TrainConfig(a.dataset, a.ndevices, a.alg, a.steps, a.batch_size, a.dct, a.dp_keep, a.dp_refresh, a.mp_keep,
                      a.error_feedback == "on", a.emb_dim, a.lr, a.emb_lr, a.seed, a.max_mem,
                      num_samples=a.num_samples)
    r = train_dlrm(cfg, a.results_csv, (a.compute_model, a.fw_comm_model, a.bw_comm_model))
    print(f"test AUC {r['test_auc']:.4f}  log loss {r['test_logloss']:.4f}  ({r['num_test']} test samples)")
    print(f"per step: {r['step_ms']:.2f} ms = compute {r['compute_ms']:.2f} + MP comm {r['mp_comm_ms']:.2f} + "
          f"DP comm {r['dp_comm_ms']:.2f} (medians)")
    print(f"bytes per step: MP {r['mp_bytes_per_step']:,.0f}  DP {r['dp_bytes_per_step']:,.0f}")
    if a.results_csv:
        print(f"appended to {a.results_csv}")
    return 0


if __name__ == "__main__":
    run_main(main, interrupted="interrupted: every rank stopped; nothing was written (training does not resume)")
