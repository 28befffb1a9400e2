"""Probe: does the input-distribution model hold on ranks that receive nothing (as a column-wise group leaves
them)? Its data always gives every rank a feature. 40 small groups (1-3 tables on 1-3 of 4 ranks each), TorchRec's
KJTAllToAll measured on 4 gloo ranks at batch 4096 against models/comm_4_input.pt (docs/findings.md)."""
import numpy as np, sys
from neuroshard.hardware.launch import run_processes
from neuroshard.hardware.comm_bench import measure_input
from neuroshard.data.features import input_words
from neuroshard.models.cost_models import CommCostModel
rng = np.random.default_rng(5)
L = []
for i in range(40):
    k = int(rng.integers(1, 4))  # a small group: 1-3 features on some ranks, others empty
    lay = [[] for _ in range(4)]
    for _ in range(k):
        p = 1 if rng.random() < 0.4 else int(rng.integers(2, 121))
        for r in rng.choice(4, int(rng.integers(1, 4)), replace=False):  # a column-wise table on 1-3 ranks
            lay[int(r)].append(p)
    L.append(lay)
def fn(rank, world, emit):
    for i, lay in enumerate(L):
        ms = measure_input(rank, lay, 4096, "cpu", 3, 15)
        if rank == 0: emit((i, ms.tolist()))
if __name__ == "__main__":
    out = {}
    run_processes(fn, 4, (), lambda m: out.__setitem__(m[0], m[1]), group_device="cpu")
    y = np.array([out[i] for i in range(len(L))])
    w = np.array([[float(input_words(np.array(r, float)).sum()) if r else 0.0 for r in lay] for lay in L])
    m = CommCostModel.load("models/comm_4_input.pt")
    p = m.predict_np(w)
    ape = np.abs(p - y) / y
    empty = w == 0
    print("measured median busy", np.median(y[~empty]), "empty", np.median(y[empty]))
    print("MAPE busy ranks", ape[~empty].mean(), "empty ranks", ape[empty].mean())
    print("slowest-rank ratio pred/meas", np.percentile(p.max(1) / y.max(1), [0, 50, 100]))
