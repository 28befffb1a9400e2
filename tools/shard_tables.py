"""Plan your own tables: a table list (CSV/JSON) or real ids in, a sharding plan out (plan.json), optionally
measured on hardware and exported as a TorchRec ShardingPlan."""
from __future__ import annotations

from neuroshard.core.cli import ArgumentParser, add_sharder_args, run_main, search_params
from neuroshard.experiments.plan_tables import shard_tables


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tables", default=None, help="CSV or JSON: name,rows,dim,pooling_factor[,bin_0..bin_16]")
    src.add_argument("--ids", default=None, help="real ids in the raw DLRM format (.pt / .pt.gz); needs --dims")
    p.add_argument("--dims", default=None, help="with --ids: one dim per table (comma-separated) or one for all")
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--max_mem", type=float, default=4.0, help="memory per device, GB")
    p.add_argument("--alg", default="neuroshard", help="any sharding algorithm (default neuroshard)")
    p.add_argument("--out", default="plan.json")
    p.add_argument("--torchrec_plan", default=None, help="also write the plan as a TorchRec ShardingPlan (JSON)")
    p.add_argument("--measure", action="store_true", help="measure the plan and the heuristics' plans on hardware")
    p.add_argument("--warmup_iter", type=int, default=10)
    p.add_argument("--num_iter", type=int, default=100)
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", default="auto")
    p.add_argument("--seed", type=int, default=0)
    add_sharder_args(p)
    a = p.parse_args(argv)
    shard_tables(a.tables, a.ids, a.dims, a.ndevices, a.max_mem, a.alg, a.out, a.compute_model, a.fw_comm_model,
                 a.bw_comm_model, "models", a.torchrec_plan, a.measure, a.warmup_iter, a.num_iter, a.device,
                 a.backend, a.seed, search_params(a))
    return 0


if __name__ == "__main__":
    run_main(main, interrupted="interrupted: nothing was written")
