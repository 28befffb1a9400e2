"""Why a multi-hot table costs more in company: its backward slows with the width of the fused output
(by hand, not in CI).

python benchmarks/backward_width.py [--rows 40000] [--dim 128] [--pooling 100] [--widths 64,128,256,512,768,1024]
                                    [--batch_size 4096] [--reps 21] [--backend auto]

One fused embedding operator (the one compute-cost data is measured with: FBGEMM's TBE, or the pure-PyTorch
backend) holds the heavy table alone, or the heavy table plus one 100-row one-hot table of width w; the
one-hot table is also timed alone. Ids are Zipf (exponent 1.1), lengths uniform 1..2p-1, one thread, as a
compute-cost worker runs. Every case is timed once per round, rounds interleaved; medians of forward and of
backward per case, and per round each pair's time against the two tables' times alone (geometric mean,
paired 95% interval). Writes results/backward_width.{md,json}.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.artifacts import write_results  # noqa: E402
from neuroshard.core.cli import run_main  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from neuroshard.data.families import zipf_ids  # noqa: E402
from neuroshard.experiments.calibrate import MEASURE_LIMIT_GB  # noqa: E402
from neuroshard.experiments.stats import paired  # noqa: E402
from neuroshard.hardware.backends import make_fused, resolve_hardware  # noqa: E402

TINY_ROWS = 100


def fused_case(tables, batch_size: int, hw, rng):
    """(op, prepared inputs, output gradient) for tables given as (rows, dim, pooling)."""
    op = make_fused([(r, d) for r, d, _ in tables], hw)
    ids, offsets, base = [], [np.zeros(1, dtype=np.int64)], 0
    for rows, _, pooling in tables:
        lengths = rng.integers(1, max(1, 2 * pooling - 1) + 1, batch_size)
        ids.append(zipf_ids(rng, rows, int(lengths.sum()), 1.1))
        offsets.append(np.cumsum(lengths) + base)
        base += int(lengths.sum())
    prepared = op.prepare(torch.from_numpy(np.concatenate(ids)), torch.from_numpy(np.concatenate(offsets)))
    grad = torch.ones(batch_size, sum(d for _, d, _ in tables), device=hw.device)
    return op, prepared, grad


def timed(op, prepared, grad) -> tuple[float, float]:
    """(forward ms, backward ms) of one training step of the operator."""
    t0 = time.perf_counter()
    out = op.forward(prepared)
    t1 = time.perf_counter()
    out.backward(grad)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=40000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--pooling", type=int, default=100)
    p.add_argument("--widths", default="64,128,256,512,768,1024")
    p.add_argument("--batch_size", type=int, default=4096)
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--backend", default="auto", choices=("auto", "fbgemm", "torch"))
    p.add_argument("--out_dir", default="results")
    a = p.parse_args(argv)
    for name in ("rows", "dim", "batch_size", "reps"):
        check_int(f"--{name}", getattr(a, name), 1)
    check_int("--pooling", a.pooling, 1, 10_000)  # ids of a batch: batch_size * pooling on average
    try:
        widths = [int(w) for w in a.widths.split(",")]
    except ValueError:
        widths = []
    if not widths or min(widths) < 1:
        raise UserError(f"--widths must be positive whole numbers separated by commas, got {a.widths!r}")
    # the heavy table, the widest tiny table and the output gradient are all allocated at once
    size_gb = 4 * (a.rows * a.dim + TINY_ROWS * max(widths) + a.batch_size * (a.dim + max(widths))) / 1e9
    if size_gb > MEASURE_LIMIT_GB:
        raise UserError(f"--rows, --dim, --widths and --batch_size allocate {size_gb:.3g} GB, more than "
                        f"{MEASURE_LIMIT_GB:g} GB; make them smaller")
    torch.set_num_threads(1)
    hw = resolve_hardware("cpu", a.backend)
    rng = np.random.default_rng(0)
    heavy = (a.rows, a.dim, a.pooling)
    cases = {"heavy": [heavy]}
    for w in widths:
        cases[f"heavy+{w}"] = [heavy, (TINY_ROWS, w, 1)]
        cases[f"tiny{w}"] = [(TINY_ROWS, w, 1)]
    built = {k: fused_case(v, a.batch_size, hw, rng) for k, v in cases.items()}
    for case in built.values():  # warm-up
        for _ in range(3):
            timed(*case)
    times = {k: [] for k in cases}
    for _ in tqdm(range(a.reps), desc="rounds"):
        for k, case in built.items():
            times[k].append(timed(*case))
    med = {k: np.median(np.array(v), axis=0) for k, v in times.items()}

    def vs_alone(w: int, part: int) -> str:
        """Per round, the pair's time against the two tables' times alone: geo-mean and paired 95% CI."""
        both = {r: t[part] for r, t in enumerate(times[f"heavy+{w}"])}
        alone = {r: times["heavy"][r][part] + times[f"tiny{w}"][r][part] for r in both}
        st = paired(both, alone)
        return f"{st['ratio']:.2f} [{st['ci_lo']:.2f}, {st['ci_hi']:.2f}]"

    lines = [f"Heavy table: {a.rows} rows, dim {a.dim}, pooling {a.pooling}; batch {a.batch_size}; {hw.backend}/cpu, "
             f"1 thread; medians of {a.reps} interleaved rounds; vs the two alone: per-round ratios, geometric "
             "mean [paired 95% CI].", "",
             "| fused output width | forward ms | backward ms | forward vs the two alone | backward vs the two alone |",
             "|---:|---:|---:|---:|---:|",
             f"| {a.dim} | {med['heavy'][0]:.1f} | {med['heavy'][1]:.1f} | - | - |"]
    for w in widths:
        fw, bw = med[f"heavy+{w}"]
        lines.append(f"| {a.dim + w} | {fw:.1f} | {bw:.1f} | {vs_alone(w, 0)} | {vs_alone(w, 1)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(a.out_dir, "backward_width", text, {
        "settings": vars(a), "hardware": hw.describe(),
        "median_ms": {k: {"forward": float(v[0]), "backward": float(v[1])} for k, v in med.items()},
        "rounds_ms": {k: [[float(f), float(b)] for f, b in v] for k, v in times.items()}})


if __name__ == "__main__":
    run_main(main)
