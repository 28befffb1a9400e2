"""Hybrid-parallel DLRM training with Dynamic Communication Thresholding (DCT, DESIGN.md §5).

Embeddings model-parallel (sharded by --alg, pooled per rank, all-to-all), MLPs data-parallel under
DDP; --dct compresses the DP gradient exchange (dp), the embedding all-to-all (mp), or both.
Spawns its --ndevices ranks itself, or runs as one rank of a group launched by torchrun, e.g.
    torchrun --standalone --nproc_per_node 4 tools/train_dlrm.py
(--ndevices defaults to torchrun's world size there; torchrun's RANK, WORLD_SIZE, LOCAL_RANK and
MASTER_PORT are checked at start, and a rank that waits more than --rendezvous_timeout_s for the
others stops with one line.)
"""
from __future__ import annotations

import argparse
from dataclasses import fields

from neuroshard.core.cli import ArgumentParser, run_main
from neuroshard.core.errors import UserError
from neuroshard.hardware.launch import in_torchrun, torchrun_env
from neuroshard.training.train import ARCHS, DCT_MODES, DENSE_OPTIMIZERS, TrainConfig, train_dlrm


def on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"must be on or off, got {text!r}")
    return text == "on"


def main(argv=None) -> int:
    d = TrainConfig()
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=d.dataset, help="movielens (MovieLens-100K) or synthetic")
    p.add_argument("--ndevices", type=int, default=None,
                   help=f"ranks (gloo processes); default {d.ndevices}, or under torchrun its world size (another value "
                        "is refused)")
    p.add_argument("--alg", default=d.alg, help="sharding algorithm for the embedding tables")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch_size", type=int, default=d.batch_size, help="global batch")
    p.add_argument("--dct", default=d.dct, choices=DCT_MODES)
    p.add_argument("--dp_keep", type=float, default=d.dp_keep, help="share of DP gradient entries sent")
    p.add_argument("--dp_refresh", type=int, default=d.dp_refresh, help="iterations between threshold updates")
    p.add_argument("--dp_drift", type=float, default=d.dp_drift,
                   help="re-estimate the DP threshold early once it would send more than this times the target")
    p.add_argument("--mp_keep", type=float, default=None,
                   help=f"with --dct mp or both: share of pooled-embedding entries sent (default {d.mp_keep:g})")
    p.add_argument("--mp_scope", default=d.mp_scope,
                   help="DCT-MP's top-k: table (default: each table shard keeps its own ceil(mp_keep * width) entries) "
                        "or rank (one top-k over a rank's whole width)")
    p.add_argument("--dp_adam_freeze_after", type=int, default=d.dp_adam_freeze_after,
                   help="with --dense_opt adam and DCT-DP: dense DP for this many steps, then Adam's second moment "
                        "frozen (floored) while DCT-DP compresses; 0 (default): off")
    p.add_argument("--dp_adam_floor", type=float, default=d.dp_adam_floor,
                   help="floor of the frozen second moment, as a share of its mean per parameter (default 0.1)")
    p.add_argument("--error_feedback", type=on_off, default=d.error_feedback, metavar="{on,off}")
    p.add_argument("--dp_sync", type=on_off, default=d.dp_sync, metavar="{on,off}",
                   help="off (default): the DP hooks' collectives are asynchronous and overlap the rest of backward "
                        "(as DDP's own hook); on: blocking collectives, identical gradients (a reference for tests "
                        "and timing)")
    p.add_argument("--arch", default=d.arch, choices=list(ARCHS),
                   help="MLP shape: tiny (64-32 / 64-32, dim 16) or mlperf (512-256 / 1024-1024-512-256, dim 128)")
    p.add_argument("--bottom_mlp", default=d.bottom_mlp, help="hidden widths of the bottom MLP, e.g. 512-256")
    p.add_argument("--top_mlp", default=d.top_mlp, help="hidden widths of the top MLP, e.g. 1024-1024-512-256")
    p.add_argument("--emb_dim", type=int, default=d.emb_dim, help="embedding dim (default: the --arch's)")
    p.add_argument("--dense_opt", default=d.dense_opt, choices=list(DENSE_OPTIMIZERS),
                   help="the MLPs' optimizer (the embeddings always take SGD)")
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate of the MLPs (default: sgd 1.0, adam 1e-3)")
    p.add_argument("--emb_lr", type=float, default=d.emb_lr, help="SGD learning rate of the embeddings")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max_mem", type=float, default=d.max_mem, help="GB per device for the sharding plan")
    p.add_argument("--log_every", type=int, default=d.log_every, help="steps per point of the loss curve")
    p.add_argument("--num_samples", type=int, default=d.num_samples, help="synthetic: samples (default 200000)")
    p.add_argument("--max_rows", type=int, default=d.max_rows, help="synthetic: rows of the largest table")
    p.add_argument("--evaluate", type=on_off, default=d.evaluate, metavar="{on,off}",
                   help="predict the test set at the end (AUC, log loss)")
    p.add_argument("--eval_every", type=int, default=d.eval_every,
                   help="0 (default): score the test set once, at the end; N: hold out the last tenth of the "
                        "training split for validation, score validation and test every N steps, and also report "
                        "the test scores at the step of the best validation AUC")
    p.add_argument("--rendezvous_timeout_s", type=float, default=d.rendezvous_timeout_s,
                   help="under torchrun: seconds to wait for every rank to join before giving up in one line")
    p.add_argument("--results_csv", default="results/dct.csv")
    p.add_argument("--compute_model", default=None)
    p.add_argument("--fw_comm_model", default=None)
    p.add_argument("--bw_comm_model", default=None)
    a = p.parse_args(argv)
    if a.mp_keep is not None and a.dct not in ("mp", "both"):
        raise UserError(f"--mp_keep sets DCT-MP, which --dct {a.dct} does not run; pass --dct mp (or both), or drop "
                        "--mp_keep")
    a.mp_keep = d.mp_keep if a.mp_keep is None else a.mp_keep
    if a.ndevices is None:  # under torchrun: its world size (checked with the rest of its environment)
        a.ndevices = torchrun_env()[1] if in_torchrun() else d.ndevices
    cfg = TrainConfig(**{f.name: getattr(a, f.name) for f in fields(TrainConfig)})
    r = train_dlrm(cfg, a.results_csv, (a.compute_model, a.fw_comm_model, a.bw_comm_model))
    if r is None:  # a torchrun rank other than 0: rank 0 reports
        return 0
    print(f"test AUC {r['test_auc']:.4f}  log loss {r['test_logloss']:.4f}  ({r['num_test']} test samples)")
    if "best_step" in r:
        print(f"best validation AUC {r['best_valid_auc']:.4f} at step {r['best_step']}: test AUC "
              f"{r['test_auc_at_best']:.4f}  log loss {r['test_logloss_at_best']:.4f}")
    dp_what = "time in the blocking collectives" if r["dp_sync"] else "the wait after backward's last gradient"
    print(f"per step: {r['step_ms']:.2f} ms = compute {r['compute_ms']:.2f} + DP codec {r['dp_codec_ms']:.2f} + "
          f"MP comm {r['mp_comm_ms']:.2f} + DP comm {r['dp_comm_ms']:.2f} (medians; DP comm: {dp_what})")
    print(f"bytes per step: MP {r['mp_bytes_per_step']:,.0f}  DP {r['dp_bytes_per_step']:,.0f}")
    if a.results_csv:
        print(f"appended to {a.results_csv}")
    return 0


if __name__ == "__main__":
    run_main(main, interrupted="interrupted: every rank stopped; nothing was written (training does not resume)")
