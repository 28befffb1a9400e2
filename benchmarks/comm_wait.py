"""Does the forward comm model hold beyond the straggler spreads it was trained on? The paper's model
against the same model with the wait term (`--fw_wait_term`), paired. (By hand, not in CI.)

python benchmarks/comm_wait.py --train data/cost_data [--train DIR ...] --test DIR [--test DIR ...]
    [--ndevices 4] [--epochs 500] [--seeds 0,1,2]

Each DIR holds comm_cost_data_<N>.pkl (collect_comm_cost_data.py; give the test files another --seed).
First the structure: per test file, measured fw minus each rank's wait for the last-ready rank
(max delay - its delay): if that residual is a small transfer at every spread, a rank's fw is wait +
transfer. Then, for every training file and seed, both forms are trained on the same split with the
same seed and epochs, and each test file's fw MAPE is given over all ranks, over the last-ready rank
(which waits for nobody) and over the others, with the paired difference (wait term - paper) over seeds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.cli import run_main  # noqa: E402
from neuroshard.core.config import comm_data_path  # noqa: E402
from neuroshard.core.errors import UserError  # noqa: E402
from neuroshard.hardware.collect import load_cost_data  # noqa: E402
from neuroshard.hardware.comm_bench import COMM_DATA_KIND  # noqa: E402
from neuroshard.models.cost_models import CommCostModel, comm_training_arrays  # noqa: E402
from neuroshard.models.trainer import regression_metrics  # noqa: E402

FORMS = {"paper": False, "wait term": True}


def load(dir_: str, n: int):
    meta, samples = load_cost_data(comm_data_path(dir_, n, None), COMM_DATA_KIND)
    x, y = comm_training_arrays(samples, "fw")
    return meta, x, y


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", action="append", required=True)
    p.add_argument("--test", action="append", required=True)
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--epochs", type=int, default=500)
    p.add_argument("--seeds", default="0,1,2")
    a = p.parse_args(argv)
    n = a.ndevices
    try:
        seeds = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        raise UserError(f"--seeds takes comma-separated integers, got {a.seeds!r}") from None
    tests = {d: load(d, n) for d in a.test}
    trains = {d: load(d, n) for d in a.train}  # every file read and checked before any output
    print("structure: measured fw - wait for the last-ready rank (ms)")
    for d, (meta, x, y) in tests.items():
        delays = x[:, n:]
        wait = delays.max(1, keepdims=True) - delays
        r = y - wait
        print(f"  {d} (sleep_range {meta.get('sleep_range')}, {len(y)} layouts): median {np.median(r):.2f}, "
              f"10-90% {np.percentile(r, 10):.2f}-{np.percentile(r, 90):.2f}; wait median {np.median(wait):.1f}, "
              f"max {wait.max():.1f}")
    print("\nfw MAPE on the test files (mean over seeds; paired difference wait term - paper, min..max over seeds)")
    print("| trained on | tested on | ranks | paper | wait term | difference |\n|---|---|---|---:|---:|---:|")
    for td, (tmeta, tx, ty) in trains.items():
        res = {}  # (form, test, ranks) -> [mape per seed]
        for seed in seeds:
            for form, wait_term in FORMS.items():
                torch.manual_seed(seed)  # the initial weights too: both forms start alike, whatever ran before
                model = CommCostModel(n, "fw", {"fw_wait_term": wait_term})
                model.fit((tx,), ty, epochs=a.epochs, seed=seed, progress=False)
                for d, (_, x, y) in tests.items():
                    pred = model.predict_np(x)
                    delays = x[:, n:]
                    last = delays == delays.max(1, keepdims=True)
                    for ranks, mask in (("all", np.ones_like(last)), ("last-ready", last), ("others", ~last)):
                        res.setdefault((form, d, ranks), []).append(regression_metrics(pred[mask], y[mask])["mape"])
        for d in a.test:
            for ranks in ("all", "last-ready", "others"):
                p_, w_ = np.array(res[("paper", d, ranks)]), np.array(res[("wait term", d, ranks)])
                diff = w_ - p_
                print(f"| {td} ({tmeta.get('sleep_range')}) | {d} | {ranks} | {100 * p_.mean():.1f}% | "
                      f"{100 * w_.mean():.1f}% | {100 * diff.mean():+.1f} ({100 * diff.min():+.1f}..{100 * diff.max():+.1f}) |")


if __name__ == "__main__":
    run_main(main)
