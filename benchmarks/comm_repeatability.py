"""How repeatable are all-to-all times of 4 ranks on a small machine, with and without pinning each
rank to a core? (By hand, not in CI.)

python benchmarks/comm_repeatability.py [--ndevices 4] [--layouts 8] [--repeats 5]

Measures the same layouts (dim sums + straggler delays, drawn as the comm collector does) `--repeats`
times in each setting, interleaved, and prints per setting the median over layouts of the relative
spread (max - min) / median of the per-rank forward and backward times across repeats.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.hardware.comm_bench import layouts_rank, sample_comm  # noqa: E402
from neuroshard.hardware.launch import run_processes  # noqa: E402


def measure(layouts, n, batch, pin: bool) -> list:
    os.environ["NEUROSHARD_PIN"] = "1" if pin else "0"
    got = {}
    run_processes(layouts_rank, n, (layouts, batch, "cpu", 5, 10), lambda m: got.__setitem__(m[0], m[1:]),
                  group_device="cpu")
    return [np.concatenate(got[i]) for i in range(len(layouts))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--layouts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch_size", type=int, default=4096)
    a = p.parse_args()
    layouts = [sample_comm(i, 0, a.ndevices, (10, 30), 128, (1, 20)) for i in range(a.layouts)]
    runs = {True: [], False: []}
    for _ in range(a.repeats):
        for pin in (False, True):
            runs[pin].append(measure(layouts, a.ndevices, a.batch_size, pin))
    for pin in (False, True):
        x = np.array(runs[pin])  # [repeats, layouts, 2N]
        spread = (x.max(0) - x.min(0)) / np.median(x, 0)
        print(f"{'pinned  ' if pin else 'unpinned'}: median relative spread over repeats {100 * np.median(spread):.1f}%"
              f"  (90th pct {100 * np.percentile(spread, 90):.1f}%), median time {np.median(x):.2f} ms")


if __name__ == "__main__":
    main()
