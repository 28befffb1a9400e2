"""Probe: what prices TorchRec's input distribution best? (findings.md)

TorchRec's sharded EmbeddingBagCollection sends each rank the ids and lengths of the features its shards read:
`KJTAllToAll` (one all-to-all of the splits, then one per tensor: lengths, ids). The step cost prices it with the
backward comm model on input words (2 x pooling + 2 per shard and sample). This probe measures the real
`KJTAllToAll` on N gloo ranks for random layouts (features per rank, pooling 1 or 2..120) and for layouts of the
public sets' tables placed at random, and compares, on held-out layouts and paired per layout, the backward model on
words with a model of the same form trained on input-distribution measurements.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuroshard.core.stats import paired_interval  # noqa: E402
from neuroshard.hardware.launch import run_processes  # noqa: E402
from neuroshard.models.cost_models import CommCostModel  # noqa: E402
from neuroshard.sharding.simulator import input_words  # noqa: E402

SETS = ("criteo_kaggle", "criteo_terabyte_mlperf", "criteo_multihot_mlperf_dcnv2")


def random_layout(rng, N):
    return [[1 if rng.random() < 0.4 else int(rng.integers(2, 121)) for _ in range(int(rng.integers(1, 13)))]
            for _ in range(N)]


def set_layout(rng, N, pooling):
    ranks = [[] for _ in range(N)]
    for p in pooling:
        ranks[int(rng.integers(N))].append(int(p))
    for r in range(N):  # every rank holds at least one feature, as TorchRec's splits need
        if not ranks[r]:
            ranks[r].append(1)
    return ranks


def rank_fn(rank, world, emit, layouts, batch, warmup, iters):
    import torch
    import torch.distributed as dist
    from torchrec.distributed.dist_data import KJTAllToAll
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    bn = batch // world
    for i, layout in enumerate(layouts):
        pools = [p for r in layout for p in r]
        lengths = torch.cat([torch.full((bn,), p, dtype=torch.int64) for p in pools])
        kjt = KeyedJaggedTensor(keys=[f"f{j}" for j in range(len(pools))],
                                values=torch.randint(0, 1000, (int(lengths.sum()),), dtype=torch.int64),
                                lengths=lengths)
        a2a = KJTAllToAll(dist.group.WORLD, [len(r) for r in layout])
        times = []
        for it in range(warmup + iters):
            dist.barrier()
            t0 = time.perf_counter()
            a2a(kjt).wait().wait()
            if it >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        out = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(out, torch.tensor([float(np.median(times))], dtype=torch.float64))
        if rank == 0:
            emit((i, [float(o) for o in out]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--random", type=int, default=150)
    ap.add_argument("--per_set", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--ndevices", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--out", default="results/input_dist_probe.json")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    N = a.ndevices
    layouts = [random_layout(rng, N) for _ in range(a.random)]
    kinds = ["random"] * a.random
    for name in SETS:
        pooling = [t["pooling_factor"] for t in json.loads((ROOT / f"benchmarks/real_tables/{name}.json").read_text())["tables"]]
        layouts += [set_layout(rng, N, pooling) for _ in range(a.per_set)]
        kinds += [name] * a.per_set
    order = rng.permutation(len(layouts))  # interleave the kinds in time
    measured = [None] * len(layouts)
    from tqdm import tqdm
    bar = tqdm(total=len(layouts))

    def on(msg):
        i, v = msg
        measured[int(order[i])] = v
        bar.update()

    run_processes(rank_fn, N, ([layouts[j] for j in order], a.batch, a.warmup, a.iters), on, group_device="cpu")
    bar.close()
    words = np.array([[input_words(np.array(r, float)).sum() for r in lay] for lay in layouts])
    y = np.array(measured)
    bw = CommCostModel.load(ROOT / f"models/comm_{N}_bw.pt")
    pred_bw = bw.predict_np(words)
    kinds = np.array(kinds)
    rand = np.where(kinds == "random")[0]
    tr, te_r = rand[: 2 * len(rand) // 3], rand[2 * len(rand) // 3:]
    own = CommCostModel(N, "bw", {"batch_size": a.batch})
    own.fit((words[tr].astype(np.float32),), y[tr].astype(np.float32), epochs=a.epochs, batch_size=64, lr=1e-3,
            train_ratio=0.75, valid_ratio=0.15, seed=0, progress=False)
    pred_own = own.predict_np(words)
    # the fixed part: one least-squares line of measured on words over the train layouts
    A = np.stack([words[tr].ravel(), np.ones(words[tr].size)], 1)
    coef = np.linalg.lstsq(A, y[tr].ravel(), rcond=None)[0]
    pred_lin = coef[0] * words + coef[1]
    report = {"coef_ms_per_word": coef[0], "intercept_ms": coef[1], "n_train": len(tr)}
    for kind in ["random"] + list(SETS):
        idx = te_r if kind == "random" else np.where(kinds == kind)[0]
        ape = {k: (np.abs(p[idx] - y[idx]) / y[idx]).mean(1) for k, p in
               (("bw_on_words", pred_bw), ("own", pred_own), ("line", pred_lin))}
        ratio = {k: (p[idx].max(1) / y[idx].max(1)) for k, p in
                 (("bw_on_words", pred_bw), ("own", pred_own), ("line", pred_lin))}
        row = {"n": len(idx), "measured_ms_median": float(np.median(y[idx])),
               "words_max": float(words[idx].max())}
        for k in ape:
            row[f"mape_{k}"] = float(ape[k].mean())
            row[f"slowest_ratio_{k}"] = [float(np.min(ratio[k])), float(np.median(ratio[k])), float(np.max(ratio[k]))]
        for k in ("own", "line"):
            est, lo, hi = paired_interval(ape[k], ape["bw_on_words"], ratio=False)[:3]
            row[f"ape_{k}_minus_bw"] = [float(est), float(lo), float(hi)]
        report[kind] = row
    report["layouts"] = [{"kind": k, "words": w.tolist(), "ms": m} for k, w, m in zip(kinds.tolist(), words, measured)]
    Path(a.out).write_text(json.dumps(report, indent=1, default=float))
    print(json.dumps({k: v for k, v in report.items() if k != "layouts"}, indent=1, default=float))


if __name__ == "__main__":
    main()
