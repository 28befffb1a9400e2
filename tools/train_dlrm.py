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

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import TrainDLRMConfig
from neuroshard.core.errors import UserError
from neuroshard.hardware.launch import default_ndevices
from neuroshard.training.dct_results import step_parts
from neuroshard.training.train import train_dlrm


def main(argv=None) -> int:
    a = step_parser(TrainDLRMConfig, __doc__, raw_doc=True).parse_args(argv)
    for flag, value, mode in (("--mp_keep", a.mp_keep, "mp"), ("--dp_keep", a.dp_keep, "dp")):
        if value is not None and a.dct not in (mode, "both"):
            raise UserError(f"{flag} sets DCT-{mode.upper()}, which --dct {a.dct} does not run; pass --dct {mode} (or "
                            f"both), or drop {flag}")
    default_ndevices(a)
    run = config_from_args(TrainDLRMConfig, a)
    r = train_dlrm(run.train, run.results_csv, run.models)
    if r is None:  # a torchrun rank other than 0: rank 0 reports
        return 0
    print(f"test AUC {r['test_auc']:.4f}  log loss {r['test_logloss']:.4f}  ({r['num_test']} test samples)")
    if "best_step" in r:
        print(f"best validation AUC {r['best_valid_auc']:.4f} at step {r['best_step']}: test AUC "
              f"{r['test_auc_at_best']:.4f}  log loss {r['test_logloss_at_best']:.4f}")
    dp_what = "time in the blocking collectives" if r["dp_sync"] else "the wait after backward's last gradient"
    print(f"per {step_parts(r, 2)} (medians; DP comm: {dp_what})")
    print(f"bytes per step: MP {r['mp_bytes_per_step']:,.0f}  DP {r['dp_bytes_per_step']:,.0f}")
    if run.results_csv:
        print(f"appended to {run.results_csv}")
    return 0


if __name__ == "__main__":
    run_main(main, interrupted="interrupted: every rank stopped; nothing was written (training does not resume)")
