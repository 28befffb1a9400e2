"""Does the compression-aware plan train faster with DCT-MP on a slow network? (issue 16 item 4; by hand,
not in CI; needs root.)

sudo python benchmarks/mp_aware_training.py [--dataset synthetic] [--arch mlperf] [--gbit 1] [--mp_keep 0.05]
                                            [--dct mp|both] [--reps 6] [--dense_opt sgd]

The training tables are sharded twice by NeuroShard, with the same compute model and search: once
with the comm models of the uncompressed all-to-all (models/comm_<N>_{fw,bw}.pt, the "dense-comm
plan") and once with those of DCT-MP's compressed one (models/comm_<N>_mp<K>_{fw,bw}.pt, the
"mp-aware plan"), exactly as `tools/train_dlrm.py --alg neuroshard --dct mp` picks them. Both plans
then train with `--dct mp` (or `--dct both`) inside a private network namespace whose loopback is shaped to --gbit
(hardware/netns.py, as benchmarks/dct_network.py), in --reps interleaved reps (each rep runs both
plans on one group of ranks, the order alternating). Per run: median step time and its split into
compute / MP comm / DP comm. The ratio mp-aware / dense-comm of each rep is paired; the table gives
the geometric mean with its 95% Student-t interval over reps. If the two plans coincide it says so
and measures nothing. Runs already in the CSV are kept (rerun to go on); --fresh starts over.
Writes results/mp_aware_training_<dct>.{csv,md}.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.artifacts import atomic_write_text  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import CostModelFiles, flag  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from neuroshard.core.tables import format_table  # noqa: E402
from neuroshard.hardware import netns  # noqa: E402
from neuroshard.training.dct_results import ratio_ci, runs_done, step_part_cells, step_parts  # noqa: E402
from neuroshard.training.train import TrainConfig, append_result, shard_training_tables, train_runs  # noqa: E402

PLANS = ("dense-comm", "mp-aware")
SCRIPT = "benchmarks/mp_aware_training.py"


@dataclass
class MpAwareTrainingConfig:
    """Training on the plan made for DCT-MP against the dense-comm plan (benchmarks/mp_aware_training.py)."""

    dataset: str = flag("synthetic", choices=("synthetic", "movielens"))
    arch: str = flag("mlperf")
    ndevices: int = flag(4)
    mp_keep: float = flag(TrainConfig.mp_keep, "DCT-MP's share of pooled entries sent (0 < K < 1)")
    dct: str = flag("mp", "mp: the issue's --dct mp (DP gradients uncompressed); both: DCT-DP too, so MP and compute "
                          "weigh more", choices=("mp", "both"))
    gbit: float = flag(1.0, "loopback bandwidth in Gbit/s (0 = unshaped)")
    steps: int = flag(10, "steps per run (the first 10%% are not timed)")
    batch_size: int = flag(512)
    num_samples: int = flag(40_000, "synthetic: samples")
    max_rows: int = flag(200_000, "synthetic: rows of the largest table")
    max_mem: float = flag(4.0, "GB per rank the plans must fit")
    reps: int = flag(6)
    dense_opt: str = flag(TrainConfig.dense_opt, "the MLPs' optimizer: sgd or adam")
    out_dir: str = flag("results")
    fresh: bool = flag(False, "drop the runs already in the CSV")

    def train_config(self) -> TrainConfig:
        """The TrainConfig both plans train with, checked."""
        synthetic = self.dataset == "synthetic"
        return TrainConfig(dataset=self.dataset, arch=self.arch, ndevices=self.ndevices, alg="neuroshard",
                           dct=self.dct, mp_keep=self.mp_keep, steps=self.steps, batch_size=self.batch_size, seed=0,
                           max_mem=self.max_mem, log_every=self.steps, evaluate=False, dense_opt=self.dense_opt,
                           num_samples=self.num_samples if synthetic else None,
                           max_rows=self.max_rows if synthetic else None).check()

    def check(self) -> "MpAwareTrainingConfig":
        if not 0 <= self.gbit <= 1000:  # also refuses nan and inf
            raise UserError(f"--gbit must be a number of Gbit/s from 0 (unshaped) to 1000, got {self.gbit:g}")
        check_int("--reps", self.reps, 1)
        self.train_config()
        if not 0 < self.mp_keep < 1:
            raise UserError(f"--mp_keep must be in (0, 1) (1 sends everything: nothing to plan for), got "
                            f"{self.mp_keep:g}")
        return self


def main(argv=None) -> None:
    C = MpAwareTrainingConfig
    run(config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)))


def run(a: MpAwareTrainingConfig) -> None:
    cfg = a.check().train_config()
    files = CostModelFiles()
    for mp in (None, a.mp_keep):
        missing = [str(f) for f in files.paths(a.ndevices, mp) if not f.exists()]
        if missing:
            raise UserError(f"missing cost model {missing[0]}; run the quick pipeline (make reproduce), then "
                            f"collect_comm_cost_data.py --ndevices {a.ndevices} --mp_keep {a.mp_keep:g} and "
                            f"train_comm_cost_model.py --ndevices {a.ndevices} --mp_keep {a.mp_keep:g}")
    if not netns.inside():
        sys.exit(netns.run_in_namespace(SCRIPT))
    netns.setup_loopback()
    from neuroshard.sharding.simulator import Simulator
    from neuroshard.training.data import load_data

    data = load_data(cfg.dataset, cfg.seed, cfg.num_samples, cfg.max_rows)
    plans = {}
    for name, mp in zip(PLANS, (None, a.mp_keep)):
        sim = Simulator.from_files(files, a.ndevices, mp)
        plans[name] = shard_training_tables(data, cfg.resolved(), sim)
    desc = describe(plans, data)
    print("\n".join(desc))
    csv = Path(a.out_dir) / f"mp_aware_training_{a.dct}.csv"
    md_path = csv.with_suffix(".md")
    title = (f"# Training with --dct {a.dct} (mp_keep {a.mp_keep:g}) on the plan made for DCT-MP: {cfg.dataset}, arch {cfg.arch}, "
             f"{cfg.ndevices} gloo ranks, batch {cfg.batch_size}, {_link(a.gbit)}")
    if plans["dense-comm"] == plans["mp-aware"]:
        atomic_write_text(md_path, "\n".join([title, "", *desc, "",
                                              "The two plans coincide: nothing to measure.", ""]))
        print("the two plans coincide: nothing to measure")
        return
    done = runs_done(csv, a.fresh, {"gbit": a.gbit, "dataset": cfg.dataset, "arch": cfg.arch, "mp_keep": a.mp_keep,
                                    "steps": cfg.steps, "batch_size": cfg.batch_size, "ndevices": cfg.ndevices,
                                    "dense_opt": cfg.dense_opt},
                     ("rep", "plan"))
    netns.shape(a.gbit)
    for rep in range(a.reps):
        order = [n for n in (PLANS if rep % 2 == 0 else PLANS[::-1]) if (rep, n) not in done]
        if not order:
            continue
        results = train_runs([cfg] * len(order), data, shards=[plans[n] for n in order])
        for name, r in zip(order, results):
            append_result(csv, {"rep": rep, "plan": name, "gbit": a.gbit,
                                **{k: v for k, v in r.items() if not k.startswith("_")}})
            print(f"rep {rep} {name:<10} {step_parts(r)}", flush=True)
    netns.shape(0)
    md = [title, "", *desc, "", *report(pd.read_csv(csv)), ""]
    atomic_write_text(md_path, "\n".join(md))
    print("\n".join(md))


def _link(gbit: float) -> str:
    return f"loopback shaped to {gbit:g} Gbit/s" if gbit > 0 else "unshaped loopback"


def describe(plans: dict, data) -> list[str]:
    """Each plan's shards per rank and the spread of the ranks' dim sums and lookups."""
    names = data.table_names
    out = format_table(["plan", "rank", "shards (table[columns])", "dim sum"],
                       [[name, r, ", ".join(f"{names[t]}[{c}:{c + w}]" for t, c, w in shards) or "-",
                         sum(w for _, _, w in shards)]
                        for name, plan in plans.items() for r, shards in enumerate(plan)])
    for name, plan in plans.items():
        dims = np.array([sum(w for _, _, w in s) for s in plan], np.float64)
        out.append(f"\n{name}: {sum(len(s) for s in plan)} shards, dim sum per rank max/mean "
                   f"{dims.max() / dims.mean():.2f}")
    return out


def report(df: pd.DataFrame) -> list[str]:
    rows = []
    base = df[df.plan == PLANS[0]].set_index("rep").step_ms
    for name in PLANS:
        g = df[df.plan == name]
        mine = g.set_index("rep").step_ms
        reps = [r for r in mine.index if r in base.index]
        sp = ratio_ci(mine[reps] / base[reps])
        rows.append({"plan": name, "reps": len(reps), **step_part_cells(g, 0),
                     "MP MB/step": f"{g.mp_bytes_per_step.mean() / 1e6:.3f}",
                     "step time vs dense-comm plan [95% CI]": f"{sp[0]:.3f} [{sp[1]:.3f}, {sp[2]:.3f}]"})
    return ["Times are medians per step in ms (averaged over ranks); ratio = mp-aware / dense-comm step time in the "
            "same rep (below 1: the compression-aware plan is faster), geometric mean and 95% Student-t interval "
            "over reps.", "", *format_table(list(rows[0]), [list(r.values()) for r in rows])]


if __name__ == "__main__":
    run_main(main)
