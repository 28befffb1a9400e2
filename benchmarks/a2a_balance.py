"""What does balancing the columns over the ranks buy the all-to-all? (issue 16; by hand, not in CI.)

python benchmarks/a2a_balance.py [--ndevices 4] [--total_dim 1024] [--mp_keep 0.05] [--reps 6]

A plan changes the all-to-all only through each rank's column count W_r (its dim sum). This measures,
for one total of columns, layouts from perfectly balanced to one heavy rank (that rank holding 1x, 1.75x
and 2.5x the mean; the others share the rest), with no straggler delay, for DCT-MP's compressed
all-to-all (`--mp_keep`) and the uncompressed one. Cost of a layout = max over ranks of forward +
backward (median of `--num_iter`), as the simulator and `eval.py` count it. The layouts are measured
in `--reps` interleaved repetitions (order reversed every other one); printed: the median cost per
layout and its paired ratio to the balanced layout with a bootstrap 95% interval over repetitions.
Writes --out (JSON).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.artifacts import atomic_write_text, check_output_file, provenance  # noqa: E402
from neuroshard.core.cli import run_main  # noqa: E402
from neuroshard.core.config import check_mp_keep  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from neuroshard.experiments.calibrate import measure_layouts  # noqa: E402
from neuroshard.experiments.stats import paired  # noqa: E402

HEAVY = (1.0, 1.75, 2.5)  # the heavy rank's W as a multiple of the mean


def layouts_for(total_dim: int, n: int) -> list[np.ndarray]:
    """One rank holds `h` x the mean columns, the others share the rest evenly (multiples of 4); a multiple
    that leaves the others fewer than 4 columns each is skipped."""
    out = []
    for h in HEAVY:
        heavy = int(round(h * total_dim / n / 4)) * 4
        rest = total_dim - heavy
        if rest < 4 * (n - 1):
            continue
        others = np.full(n - 1, rest // (n - 1) // 4 * 4, dtype=np.int64)
        others[: (rest - int(others.sum())) // 4] += 4
        out.append(np.concatenate([[heavy], others]).astype(np.int64))
    return out


def measure(layouts, n: int, batch: int, mp_keep, warmup: int, iters: int) -> list[float]:
    """Per layout (no delays), the slowest rank's forward + backward ms."""
    fw, bw = measure_layouts([(d, np.zeros(n)) for d in layouts], n, batch, "cpu", warmup, iters, mp_keep)
    return [float(v) for v in (fw + bw).max(axis=1)]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--total_dim", type=int, default=1024, help="columns over all ranks (multiple of 4 x ranks)")
    p.add_argument("--mp_keep", type=float, default=0.05)
    p.add_argument("--batch_size", type=int, default=4096)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--warmup_iter", type=int, default=3)
    p.add_argument("--num_iter", type=int, default=10)
    p.add_argument("--out", default="results/a2a_balance.json")
    a = p.parse_args(argv)
    check_int("--ndevices", a.ndevices, 2, 64)
    check_int("--reps", a.reps, 2, 10_000)
    check_int("--num_iter", a.num_iter, 1, 100_000)
    check_int("--warmup_iter", a.warmup_iter, 0, 100_000)
    check_int("--batch_size", a.batch_size, a.ndevices, 10_000_000)
    check_int("--total_dim", a.total_dim, 4 * a.ndevices * 3, 1_000_000)
    if a.total_dim % (4 * a.ndevices):
        raise UserError(f"--total_dim must be a multiple of 4 x --ndevices ({4 * a.ndevices}), got {a.total_dim}")
    if a.batch_size % a.ndevices:
        raise UserError(f"--batch_size must be divisible by --ndevices ({a.ndevices}), got {a.batch_size}")
    mp = check_mp_keep(a.mp_keep)
    if mp is None:
        raise UserError("--mp_keep 1 is the uncompressed all-to-all, which is measured anyway; give K < 1")
    check_output_file(a.out, "--out")
    layouts = layouts_for(a.total_dim, a.ndevices)
    kinds = {f"compressed (mp_keep {mp:g})": mp, "uncompressed": None}
    costs = {k: [[] for _ in layouts] for k in kinds}
    with tqdm(total=a.reps * len(kinds), desc="repetitions") as bar:
        for rep in range(a.reps):
            order = list(range(len(layouts)))[:: 1 if rep % 2 == 0 else -1]
            for kind, keep in kinds.items():
                got = measure([layouts[i] for i in order], a.ndevices, a.batch_size, keep, a.warmup_iter, a.num_iter)
                for j, i in enumerate(order):
                    costs[kind][i].append(got[j])
                bar.update()
    rows = []
    print("| all-to-all | dim sums per rank | heavy rank / mean | median ms | vs balanced [95% CI] |")
    print("|---|---|---:|---:|---:|")
    for kind in kinds:
        base = dict(enumerate(costs[kind][0]))
        for i, d in enumerate(layouts):
            st = paired(dict(enumerate(costs[kind][i])), base)
            rows.append({"all_to_all": kind, "dim_sums": d.tolist(), "heavy_over_mean": float(d.max() / d.mean()),
                         "median_ms": float(np.median(costs[kind][i])), "ms_per_rep": costs[kind][i], "vs_balanced": st})
            print(f"| {kind} | {'/'.join(map(str, d))} | {d.max() / d.mean():.2f} | {np.median(costs[kind][i]):.2f} | "
                  f"{st['ratio']:.3f} [{st['ci_lo']:.3f}, {st['ci_hi']:.3f}] |")
    out = {"settings": vars(a), "rows": rows, "provenance": provenance()}
    atomic_write_text(a.out, json.dumps(out, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    run_main(main)
