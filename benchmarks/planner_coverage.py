"""Does NeuroShardPlanner plan wherever TorchRec's planner does, within memory as TorchRec counts it? (issue 64)

`--cases` random cases (`neuroshard.sharding.planner.coverage`: random tables, cpu and cuda topologies of each
`--ranks`, memory caps around what the tables need, batches, optimizers applied in backward), each planned by
`NeuroShardPlanner` (its defaults) and by TorchRec's `EmbeddingShardingPlanner` as the user calls it. Counts per
outcome (NeuroShard's own plan, TorchRec's plan handed out, both refused) and every violation: a refusal
where TorchRec plans, a plan over a rank's budget by TorchRec's storage estimator after its default reservation.
Writes `--out` (CSV, one row per case), its `.md` summary and `.json` record, provenance beside them.

python benchmarks/planner_coverage.py --cases 120 --models_dir models
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.artifacts import check_output_file, write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import flag  # noqa: E402
from neuroshard.core.errors import UserError, check_float, check_int  # noqa: E402
from neuroshard.core.optional_deps import require_torchrec  # noqa: E402
from neuroshard.core.tables import format_table  # noqa: E402
from neuroshard.models.loading import cost_model_paths  # noqa: E402

OUTCOMES = ("own", "torchrec's", "both refused")
SHARDERS = ("torchrec", "row_wise")


@dataclass
class PlannerCoverageConfig:
    """NeuroShardPlanner against TorchRec's planner on random cases (benchmarks/planner_coverage.py)."""

    cases: int = flag(120, "random cases")
    ranks: tuple[int, ...] = flag((4,), "rank counts (cost models for each in --models_dir)", parse="int_list")
    models_dir: str = flag("models", "compute.pt and comm_<N>_{fw,bw}.pt for each --ranks")
    seed: int = flag(0, "seed of the cases")
    sharder: str = flag("torchrec", "torchrec (TorchRec's EmbeddingBagCollectionSharder: row_wise on cuda only) or "
                                    "row_wise (neuroshard's RowWiseSharder: row_wise on cpu too), for both planners")
    constrained_share: float = flag(0.0, "the chance that a table's constraints allow a random subset of TorchRec's "
                                         "sharding types (0: all types, every table)")
    kernel_share: float = flag(0.0, "the chance that a table's constraints allow a random subset of TorchRec's compute "
                                    "kernels for the device (0: all kernels, every table)")
    odd_dim_share: float = flag(0.0, "the chance that a table's dim is 2 more than drawn (not a multiple of 4)")
    out: str = flag("results/planner_coverage.csv", "one row per case; .md and .json beside it")

    def check(self) -> "PlannerCoverageConfig":
        check_int("--cases", self.cases, 1, 100_000)
        check_int("--seed", self.seed, 0, 2**32 - 1)
        check_float("--constrained_share", self.constrained_share, 0.0, 1.0)
        check_float("--kernel_share", self.kernel_share, 0.0, 1.0)
        check_float("--odd_dim_share", self.odd_dim_share, 0.0, 1.0)
        if self.sharder not in SHARDERS:
            raise UserError(f"--sharder must be one of {', '.join(SHARDERS)}, got {self.sharder!r}")
        if not str(self.out).strip() or Path(self.out).parent.is_file():
            raise UserError(f"--out {self.out!r} must name a CSV file in a folder")
        for n in self.ranks:
            check_int("--ranks", n, 2, 64)
        check_output_file(self.out, "--out")
        return self

    def check_models(self) -> None:
        """Cost models for every --ranks, before any case is planned."""
        for n in self.ranks:
            missing = [p for p in cost_model_paths(self.models_dir, n) if not Path(p).is_file()]
            if missing:
                raise UserError(f"--models_dir {self.models_dir} has no cost models for {n} ranks ({missing[0]}); "
                                "train them (make reproduce) or pass --ranks of the models you have")


def main(argv=None) -> None:
    cfg = config_from_args(PlannerCoverageConfig, step_parser(PlannerCoverageConfig, __doc__.split("\n\n")[0])
                           .parse_args(argv)).check()
    require_torchrec()
    cfg.check_models()
    from neuroshard.sharding.planner.coverage import check_case, random_case
    from neuroshard.sharding.planner.incumbent import SHARDING_TYPES

    rng, rows = np.random.default_rng(cfg.seed), []
    for i in tqdm(range(cfg.cases), desc="cases"):
        world, device = cfg.ranks[i % len(cfg.ranks)], ("cuda", "cpu")[i % 2]
        case = random_case(rng, world, device, row_wise_sharder=cfg.sharder == "row_wise",
                           constrained_share=cfg.constrained_share, kernel_share=cfg.kernel_share,
                           odd_dim_share=cfg.odd_dim_share)
        result = check_case(case, cfg.models_dir)
        rows.append({"case": i, "ranks": world, "device": device, "tables": len(case.tables),
                     "cap_bytes": case.cap_bytes, "batch_size": case.batch_size, "optimizer": case.optimizer or "",
                     "sharding_types": ";".join(f"{n}={'+'.join(k)}" for n, k in (case.sharding_types or {}).items()),
                     "compute_kernels": ";".join(f"{n}={'+'.join(k)}" for n, k in (case.compute_kernels or {}).items()),
                     "dims": ";".join(str(d) for _, _, d, _ in case.tables),
                     "outcome": result.outcome, "used_share": result.used_share, "violation": result.violation or "",
                     "own_plan_types": "+".join(result.detail.get("types", [])) if result.outcome == "own" else ""})
    counts = {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}
    own = [r["used_share"] for r in rows if r["outcome"] == "own"]
    own_types = {k: sum(k in r["own_plan_types"].split("+") for r in rows) for k in SHARDING_TYPES}
    violations = [r for r in rows if r["violation"]]
    lines = format_table(["device", *OUTCOMES, "violations"],
                         [[d, *(sum(r["outcome"] == o and r["device"] == d for r in rows) for o in OUTCOMES),
                           sum(bool(r["violation"]) and r["device"] == d for r in rows)] for d in ("cpu", "cuda")])
    text = "\n".join(["# NeuroShardPlanner against TorchRec's planner on random cases", "", *lines, "",
                      f"{cfg.cases} cases; NeuroShard's own plans: the fullest rank holds a median "
                      f"{np.median(own) if own else float('nan'):.2f} (max {max(own, default=float('nan')):.2f}) of "
                      "its budget by TorchRec's storage estimator; own plans with each sharding type: "
                      + ", ".join(f"{k} {n}" for k, n in own_types.items()),
                      *(f"- case {r['case']}: {r['violation']}" for r in violations)]) + "\n"
    write_results(cfg.out, rows, markdown=text, record={"config": asdict(cfg), "counts": counts,
                                                         "violations": len(violations)}, **asdict(cfg))
    print(text, end="")
    print(f"wrote {cfg.out} and its .md, .json")


if __name__ == "__main__":
    run_main(main)
