"""Probe (leaves the tree after its finding is written; docs/findings.md): which correction of the step cost,
fitted to random plans measured as TorchRec DMP steps, prices and ranks the plans users get? Run by hand:

    python benchmarks/step_forms.py measure 4 0.04 16 6 criteo_multihot_mlperf_dcnv2,criteo_terabyte_mlperf,criteo_kaggle
    python benchmarks/step_forms.py fit results/step_forms_4.json

`measure`: per set, the benchmark's user plans (benchmarks/torchrec_step.py) and 16 random plans, measured
interleaved in DMP steps; `fit`: each form fitted on the random plans (relative-error NNLS), judged on the user's.
"""
import sys, tempfile, json, time
from pathlib import Path
import numpy as np
from scipy.optimize import nnls
from scipy.stats import spearmanr
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
import torchrec_step as ts
from neuroshard.sharding.plan import Placement, apply_splits, can_split, fits_memory
from neuroshard.sharding.simulator import plan_group_sums
from neuroshard.sharding.search import plan_key
from neuroshard.core.types import Cluster


def random_plan(task, cluster, rng):
    dims = task.dims
    for _ in range(1000):
        p_split = rng.choice([0.0, 0.1, 0.3])
        splits, shards = [], apply_splits(dims, [])
        for t in range(len(dims)):
            if can_split(int(dims[t])) and rng.random() < p_split:
                splits.append(t)
        shards = apply_splits(dims, splits)
        # skewed device weights: some plans balanced, some not
        w = rng.dirichlet(np.full(cluster.num_devices, rng.choice([0.5, 2.0, 20.0])))
        dev = list(rng.choice(cluster.num_devices, size=len(shards), p=w))
        # column halves of a table on different devices (as TorchRec places them)
        p = Placement(cluster.num_devices, shards, [int(d) for d in dev], splits)
        if fits_memory(task, p, cluster):
            return p
    raise RuntimeError("no plan fits")

def measure_main(nd, mem, NR, rounds, sets):
    out = []
    for name in sets:
        a = ts.TorchRecStepConfig(ndevices=nd, max_mem=mem, rounds=rounds, warmup_iter=2, num_iter=5, emulated_rounds=0)
        rng = np.random.default_rng(1)
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            tl, plans, sim, batch = ts.user_plans(name, a, tmp)
            cluster = Cluster(nd, mem)
            cands = dict(plans)
            for i in range(NR):
                plans[f"random{i}"] = random_plan(tl.task, cluster, rng)
            t0 = time.time()
            rr, distinct, _ = ts.measure(tl, plans, a, batch, tmp)
            print(name, "measured", len(rr), "plans in", round(time.time() - t0), "s", flush=True)
        st = sim.with_cost("step")
        for k, v in rr.items():
            p = plans[distinct[k][0]]
            c = st.plan_cost(tl.task, p)
            dims, words = plan_group_sums(tl.task, p)
            comp = np.asarray(c.compute_ms); fw = np.asarray(c.fw_ms); bw = np.asarray(c.bw_ms)
            out.append(dict(set=name, plan="/".join(distinct[k]), held_out=not all(n.startswith("random") for n in distinct[k]),
                            rounds=[float(x) for x in v], sim=float(c.cost_ms), compute=comp.tolist(), fw=fw.tolist(), bw=bw.tolist(),
                            dims=dims.tolist(), words=words.tolist(), groups=int((dims.sum(1) > 0).sum())))
        Path(f"results/step_forms_{nd}.json").write_text(json.dumps(out))


def feats(r, form):
    c = np.array(r["compute"]); fw = np.array(r["fw"]); bw = np.array(r["bw"]); g = r["groups"]
    dims = np.array(r["dims"]); words = np.array(r["words"])
    if form == "scale": return [r["sim"]]
    if form == "scale+1": return [r["sim"], 1.0]
    if form == "scale+grp+1": return [r["sim"], g - 1, 1.0]
    if form == "cmax,csum,comm,grp,1": return [c.max(), c.sum(), (fw + bw).max(), g - 1, 1.0]
    if form == "cmax,csum,grp,1": return [c.max(), c.sum(), g - 1, 1.0]
    if form == "sim,csum,grp,1": return [r["sim"], c.sum(), g - 1, 1.0]
    if form == "cmax,csum,dimsum,words,grp,1": return [c.max(), c.sum(), dims.sum(), words.sum(), g - 1, 1.0]
    if form == "cmax,csum,dimmax,grp,1": return [c.max(), c.sum(), dims.sum(0).max(), g - 1, 1.0]
forms = ["scale", "scale+1", "scale+grp+1", "cmax,csum,grp,1", "sim,csum,grp,1", "cmax,csum,comm,grp,1", "cmax,csum,dimmax,grp,1", "cmax,csum,dimsum,words,grp,1"]

def fit_main(path):
    rows = json.load(open(path))
    for s in dict.fromkeys(r["set"] for r in rows):
        R = [r for r in rows if r["set"] == s]
        cal = [r for r in R if not r["held_out"]]; ho = [r for r in R if r["held_out"]]
        y = lambda rs: np.array([np.exp(np.mean(np.log(r["rounds"]))) for r in rs])
        yc, yh = y(cal), y(ho)
        print(f"== {s}: {len(cal)} calibration plans, {len(ho)} held out; raw sim Spearman held-out "
              f"{spearmanr([r['sim'] for r in ho], yh)[0]:.2f}, calib-set {spearmanr([r['sim'] for r in cal], yc)[0]:.2f}")
        for f in forms:
            X = np.array([feats(r, f) for r in cal]); Xh = np.array([feats(r, f) for r in ho])
            w, _ = nnls(X / yc[:, None], np.ones(len(yc)))  # relative error
            ph = Xh @ w; pc = X @ w
            split = np.array([r["groups"] > 1 for r in ho])
            err = ph / yh - 1
            print(f"  {f:32s} w={np.round(w,3)} calib relerr med {np.median(np.abs(pc/yc-1)):.3f} | held-out rho "
                  f"{spearmanr(ph, yh)[0]:.2f} sim/meas {ph.min()/1:.0f}.. ratio [{(ph/yh).min():.2f},{(ph/yh).max():.2f}] split err {np.round(err[split],2)}")


if __name__ == "__main__":
    if sys.argv[1] == "measure":
        measure_main(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6].split(","))
    else:
        fit_main(sys.argv[2])
