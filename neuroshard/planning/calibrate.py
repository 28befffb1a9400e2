"""Calibrate the pre-trained cost models to a user's tables and hardware (DESIGN.md §8).

Pre-train, **calibrate**, search, verify. `calibrate`:
1. builds the user's tables on this machine: their real ids (`--ids`) or ids synthesised from each
   table's rows, pooling factor and reuse histogram (`user_tables_dataset`);
2. measures `num_shards` (K) shards of those tables (`sample_user_shards`: the few tables with the most
   lookups x dim each alone, then random shards of 1..2T/N tables, each at its dim or a column shard of
   it, within a device's memory) exactly as the collector does
   (one worker, one thread, cache flushed, median of `num_iter` after `warmup_iter`);
3. fine-tunes the pre-trained compute model on 2/3 of them (`ComputeCostModel.fine_tune`) and
   reports the error on the held-out third before and after;
4. checks the comm models on `comm_layouts` all-to-all layouts of the user's dims, measured on the all-to-all
   the comm models were trained on (DCT-MP's compressed one for `--mp_keep` models) (random
   table-wise placements; straggler delays up to `MIN_SPREAD_MS` in half of them and up to the slowest
   shard measured in step 2 in the other half) on N ranks, fine-tunes them the same way and reports held-out error
   before and after. The delays are where a plan's forward all-to-all waits for its slowest device:
   a device that finishes its compute early spends the difference inside the collective, so the
   range must reach the compute differences the user's plans have (tens of ms for multi-hot tables,
   beyond the pre-training's 1-20 ms). With an input-distribution model, as many layouts of TorchRec's input
   distribution (`input_layouts`: random table-wise placements of the user's tables, their pooling factors; at
   least one table a rank) are measured as its collector measures them and fine-tune it the same way.
A fine-tuned model is kept only where its held-out error is not worse than the pre-trained one's.
5. keeps a drift reference (`drift_reference`): the held-out shards in groups of N, one per rank, with their
   measured compute and the backward all-to-all of each group's dims (measured with the layouts).
   `--measure` measures one group in every round beside the candidates, so a machine that got faster or
   slower between calibrating and measuring shows as a ratio, and the simulated costs can be read net of it.
The calibrated models are saved beside the plan (`calibration_path`) with what they were made for
(`calibration_inputs`: the tables themselves, digests of the ids and pre-trained model files, hardware, batch,
device count, memory and method), everything measured (`measured`) and a digest of both; a later run made
for the same inputs reuses them without measuring (`find_calibration`), one made for other inputs is told
what differs, and a file edited after saving is refused.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.artifacts import atomic_torch_save, load_torch, provenance
from ..core.config import (CALIBRATE_DMP_ROUNDS, CALIBRATE_NUM_ITER, CALIBRATE_WARMUP_ITER, DEFAULT_CALIBRATE_COMM,
                           DEFAULT_CALIBRATE_K, MEASURE_NUM_ITER, MEASURE_WARMUP_ITER, check_calibrate, check_iters)
from ..core.errors import UserError, check_int
from ..core.types import Cluster, StepFit, implausible_ms
from ..data.features import can_split, table_size_gb, with_dim
from ..hardware.comm_bench import CommRankSettings, comm_rank, torchrec_available
from ..models.cost_models import CommCostModel, ComputeCostModel
from ..models.trainer import regression_metrics
from ..sharding.simulator import Simulator
from .step_fit import fit_to_steps, measure_plans_dmp, sample_user_plans

CALIBRATION_KIND = "neuroshard.calibration"
MEASURE_LIMIT_GB = 4.0  # building the user's tables allocates every table: refuse more than this in total
MIN_HELD_OUT = 5
HEAVY_ALONE = 5  # calibration shards that are one heavy table alone (see sample_user_shards)
MIN_SPREAD_MS = 10.0  # comm layouts' straggler spread reaches at least this (see comm_layouts)
# How `calibrate` measures and fine-tunes; part of the fingerprint, so a calibration saved by an earlier method
# is measured again rather than reused. Change it whenever the sampler or the fine-tuning changes.
CALIBRATION_METHOD = ("v5: heaviest tables alone + random shards; relative squared error, full-batch Adam; "
                      "comm delays up to 10 ms in half the layouts, up to the slowest measured shard in the other half; "
                      "a drift reference of held-out shards; comm layouts measured on the comm models' own all-to-all "
                      "(DCT-MP's for --mp_keep models)")


@dataclass(frozen=True)
class CalibrationConfig:
    """Settings of `--calibrate K` and the fine-tuning behind it."""

    num_shards: int = DEFAULT_CALIBRATE_K       # K compute samples; a third held out
    comm_layouts: int = DEFAULT_CALIBRATE_COMM  # all-to-all layouts of the user's dims; a third held out
    warmup_iter: int = CALIBRATE_WARMUP_ITER
    num_iter: int = CALIBRATE_NUM_ITER
    steps: int = 500              # fine-tuning: full-batch Adam steps on the relative error, from the pre-trained
    lr: float = 1e-3              # weights (`CostModel.fine_tune`)
    seed: int = 0
    dmp_plans: int = 0            # random plans measured as TorchRec steps, to fit the step cost (`step_fit.py`)
    dmp_rounds: int = CALIBRATE_DMP_ROUNDS

    def check(self) -> "CalibrationConfig":
        check_calibrate(self.num_shards, self.comm_layouts, self.dmp_plans, self.dmp_rounds)
        check_iters(self.warmup_iter, self.num_iter)
        check_int("--seed", self.seed, 0)
        return self


def user_tables_dataset(tl, batch_size: int, seed: int, out_dir: Path, ids_path=None):
    """The user's tables as a processed dataset: real ids (`ids_path`) or synthesised ones."""
    from ..data.dataset import process_raw
    from ..data.raw import load_raw
    from ..data.synthetic import synthesize_tables

    if tl.task.total_size_gb() > MEASURE_LIMIT_GB:
        raise UserError(f"--measure and --calibrate allocate every table on this machine: {tl.task.total_size_gb():.2f} "
                        f"GB is more than {MEASURE_LIMIT_GB:g} GB; measure a scaled-down copy of the table list")
    if ids_path is not None:
        indices, offsets, lengths = load_raw(ids_path)
        if lengths.shape[1] < batch_size:
            raise UserError(f"{ids_path} holds {lengths.shape[1]} samples per table; the cost models were trained at "
                            f"batch {batch_size}: give ids for at least {batch_size} samples")
        raw = (indices, offsets, lengths)
        source = {"source": "ids", "ids": str(ids_path)}
    else:
        raw = synthesize_tables(tl.rows, tl.task.pooling_factors, tl.task.data_features[:, 2:], batch_size, seed,
                                progress=False)
        source = {"source": "table list", "tables": tl.source, "seed": seed}
    return process_raw(*raw, out_dir=Path(out_dir) / "user_tables", source=source, progress=False)


def heaviest_tables(task, k: int) -> np.ndarray:
    """Positions of the task's k tables with the most lookups x dim (ties: the earlier table first)."""
    return np.argsort(-(task.pooling_factors * task.dims), kind="stable")[:k]


def sample_user_shards(task, cluster: Cluster, num_shards: int, seed: int,
                       max_tries: int = 100_000) -> list[tuple[np.ndarray, np.ndarray]]:
    """Shards (table positions, dims) of the task's tables that fit one device.

    First the `HEAVY_ALONE` tables with the most lookups x dim, each alone at its dim (halved until it fits),
    at most num_shards // 8 of them: without them every shard that holds such a table has company, and the
    fine-tuned model puts the company's cost on the table. Then random shards: 1..ceil(2T/N) tables (at most
    64), each at its dim or halved once or twice (a column shard)."""
    rng = np.random.default_rng([seed, 31])
    T, N = task.num_tables, cluster.num_devices
    hi = max(1, min(64, int(np.ceil(2 * T / N))))
    rows = task.rows
    out = []
    heavy = heaviest_tables(task, min(HEAVY_ALONE, num_shards // 8))
    for t in heavy:
        dim = int(task.dims[t])
        while table_size_gb(rows[t], dim) > cluster.max_mem_gb and can_split(dim):
            dim //= 2
        if table_size_gb(rows[t], dim) <= cluster.max_mem_gb:
            out.append((np.array([t], dtype=np.int64), np.array([dim], dtype=np.int64)))
    for _ in range(max_tries):
        if len(out) == num_shards:
            return out
        n = int(rng.integers(1, hi + 1))
        tabs = rng.choice(T, n, replace=n > T)
        dims = task.dims[tabs].astype(np.int64).copy()
        for i in range(n):
            for _ in range(int(rng.integers(0, 3))):
                if can_split(dims[i]):
                    dims[i] //= 2
        if table_size_gb(rows[tabs], dims).sum() <= cluster.max_mem_gb:
            out.append((tabs.astype(np.int64), dims))
    raise UserError(f"could not draw {num_shards} shards of these tables within {cluster.max_mem_gb:g} GB; "
                    "raise --max_mem")


def _split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fine-tune, held-out) positions: a third held out, at least MIN_HELD_OUT."""
    perm = np.random.default_rng([seed, 32]).permutation(n)
    k = max(MIN_HELD_OUT, n // 3)
    return np.sort(perm[k:]), np.sort(perm[:k])


def _err(pred, y) -> dict:
    m = regression_metrics(pred, y)
    return {"mape": m["mape"], "spearman": m["spearman"], "r2": m["r2"]}


def _fine_tune_kept(model, inputs, y, tune, held, cfg: CalibrationConfig, copy_of) -> tuple[object, dict]:
    """Fine-tune a copy of `model`; keep it only if its held-out MAPE is not worse. Returns (model, report)."""
    before = _err(model.predict(*(x[held] for x in inputs)), y[held])
    tuned = copy_of(model)
    # the loss is relative: a cost below the timer's microsecond counts as one microsecond
    tuned.fine_tune(tuple(x[tune] for x in inputs), np.maximum(y[tune], 1e-3), steps=cfg.steps, lr=cfg.lr,
                    seed=cfg.seed)
    after = _err(tuned.predict(*(x[held] for x in inputs)), y[held])
    kept = after["mape"] <= before["mape"]
    return (tuned if kept else model), {"before": before, "after": after, "kept": kept,
                                        "samples": {"fine_tune": int(len(tune)), "held_out": int(len(held))}}


def fine_tune_compute(model, task, shards, costs_ms, cfg: CalibrationConfig) -> tuple[object, dict]:
    """The compute half of `calibrate`: fine-tune on two thirds of the measured shards, keep the result only if
    its MAPE on the held-out third is not worse. Returns (model, report)."""
    tune, held = _split(len(shards), cfg.seed)
    return _fine_tune_kept(model, compute_arrays(task.data_features, shards), np.asarray(costs_ms, dtype=np.float32),
                           tune, held, cfg, _copy)


def _copy(model):
    clone = type(model)._build(dict(model.meta))
    clone.net.load_state_dict(model.net.state_dict())
    return clone


def compute_arrays(data_features: np.ndarray, shards) -> tuple[np.ndarray, np.ndarray]:
    """The compute model's inputs for shards ((tables, dims) each) of tables with these data features."""
    T = max(len(d) for _, d in shards)
    feats = np.zeros((len(shards), T, 20), dtype=np.float32)
    mask = np.zeros((len(shards), T), dtype=np.float32)
    for i, (tabs, dims) in enumerate(shards):
        feats[i, :len(tabs)] = with_dim(data_features[tabs], dims)
        mask[i, :len(tabs)] = 1
    return feats, mask


def comm_layouts(task, N: int, count: int, seed: int, max_spread_ms: float = MIN_SPREAD_MS
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(dim sums, delays ms) of random table-wise placements of the user's tables on N ranks. A layout's
    delays are uniform up to a spread drawn uniformly up to `MIN_SPREAD_MS` (even layouts: the small
    delays of balanced plans stay covered) or up to `max_spread_ms` (odd layouts: the long waits of
    unbalanced ones)."""
    rng = np.random.default_rng([seed, 33])
    out = []
    for i in range(count):
        dev = rng.integers(0, N, task.num_tables)
        dims = np.bincount(dev, weights=task.dims, minlength=N).astype(np.int64)
        bound = max_spread_ms if i % 2 else MIN_SPREAD_MS
        delays = rng.uniform(0, rng.uniform(0, bound), N)
        out.append((dims, delays - delays.min()))
    return out


def input_layouts(task, N: int, count: int, seed: int) -> list[list[list[float]]]:
    """Per layout and rank the pooling factors of the user's tables placed there: random table-wise placements
    with at least one table per rank (the input distribution's layouts; needs N tables or more)."""
    rng = np.random.default_rng([seed, 35])
    T = task.num_tables
    out = []
    for _ in range(count):
        dev = np.empty(T, np.int64)
        perm = rng.permutation(T)
        dev[perm[:N]] = np.arange(N)
        dev[perm[N:]] = rng.integers(0, N, T - N)
        out.append([[float(task.pooling_factors[t]) for t in np.flatnonzero(dev == r)] for r in range(N)])
    return out


def measure_input_layouts(layouts, N: int, batch_size: int, hw, warmup: int, iters: int
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Per layout every rank's input words and TorchRec input-distribution ms ([len, N] each), on N ranks, as the
    input-distribution collector measures them (`comm_bench.comm_rank`)."""
    from ..hardware.launch import run_processes

    got: dict[int, dict] = {}
    settings = CommRankSettings(list(range(len(layouts))), {"seed": 0, "T_range": (1, 2)}, batch_size, hw.device,
                                warmup, iters, None, True, tuple(layouts))
    run_processes(comm_rank, N, (settings,), lambda m: got.__setitem__(int(m["index"]), m), group_device=hw.device)
    return (np.array([got[i]["input_words"] for i in range(len(layouts))], np.float64),
            np.array([got[i]["input_ms"] for i in range(len(layouts))], np.float64))


def drift_reference(shards, costs_ms, held: np.ndarray, N: int, seed: int) -> list[dict]:
    """The held-out shards in groups of N, one shard per rank (the last group filled up from the first shards):
    per group {"devices": per rank [[table, dim], ...], "compute_ms": [N]}. `--measure` measures one group a
    round, in turn, so the reference spans the held-out shards as calibration measured them."""
    order = np.random.default_rng([seed, 34]).permutation(np.asarray(held))
    G = -(-len(order) // N)
    groups = []
    for g in range(G):
        pick = [int(order[(g * N + r) % len(order)]) for r in range(N)]
        groups.append({"devices": [[[int(t), int(d)] for t, d in zip(*shards[i])] for i in pick],
                       "compute_ms": [float(costs_ms[i]) for i in pick]})
    return groups


def reference_layouts(groups: list[dict]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each reference group's all-to-all: its ranks' dim sums, no delays."""
    return [(np.array([sum(d for _, d in dev) for dev in g["devices"]], np.int64), np.zeros(len(g["devices"])))
            for g in groups]


def _shard_dim_ok(d: int, table_dim: int | None) -> bool:
    """A shard's dim: a multiple of 4 up to 65536 and, with its table's dim, that dim halved 0 or more times."""
    if not (4 <= d <= 1 << 16 and d % 4 == 0):
        return False
    if table_dim is None:
        return True
    while table_dim > d and can_split(table_dim):
        table_dim //= 2
    return table_dim == d


def check_reference(ref, rows, cluster: Cluster, where: str, dims=None, measured: dict | None = None) -> list[dict]:
    """A drift reference read from a file: groups of one shard per rank of `cluster`, each a list of
    [table < len(rows), dim] pairs (dim a multiple of 4 up to 65536, and with the tables' `dims` a column shard of
    its table's) within a device's memory, with finite compute and bw ms in (0, MAX_PLAUSIBLE_MS]. With the
    calibration's `measured` shards, every reference shard must be one of them with the compute measured for it
    (the reference is what calibration measured, not a number edited in). One line naming the file otherwise
    (`--measure` builds what it names)."""
    rows = np.asarray(rows, np.int64)
    N = cluster.num_devices
    table_dim = (lambda t: int(dims[t])) if dims is not None else (lambda t: None)
    try:
        ok = isinstance(ref, list) and 1 <= len(ref) <= 100_000
        for g in ref if ok else []:
            devs = g["devices"]
            ok = ok and len(devs) == N and all(len(dev) >= 1 and all(
                len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x)
                and 0 <= x[0] < len(rows) and _shard_dim_ok(x[1], table_dim(x[0])) for x in dev) for dev in devs)
            ok = ok and all(table_size_gb(rows[[t for t, _ in dev]], np.array([d for _, d in dev])).sum()
                            <= cluster.max_mem_gb * (1 + 1e-9) for dev in devs)
            for key in ("compute_ms", "bw_ms"):
                v = np.asarray(g[key], np.float64)
                ok = ok and v.shape == (N,) and implausible_ms(v, positive=True) is None
        if ok and measured is not None:
            by_shard = {}
            for shard, ms in zip(measured["shards"], measured["compute_ms"]):
                by_shard.setdefault(json.dumps(shard), []).append(float(ms))
            ok = all(any(np.isclose(ms, c, rtol=1e-9, atol=0) for ms in by_shard.get(json.dumps(dev), []))
                     for g in ref for dev, c in zip(g["devices"], g["compute_ms"]))
    except (TypeError, KeyError, ValueError, IndexError):
        ok = False
    if not ok:
        raise UserError(f"{where} holds a damaged drift reference; delete it to calibrate again")
    return ref


def measure_shards(ds, hw, batch_size: int, shards, warmup: int, iters: int) -> np.ndarray:
    """Each shard's compute ms on one worker, one round of the measurement engine (`hardware.engine`)."""
    from ..hardware.engine import EngineSettings, measure_fixed

    items = [[[(int(t), int(d)) for t, d in zip(*shard)]] for shard in shards]
    measured = measure_fixed(EngineSettings(str(ds.path), hw, batch_size, warmup, iters, shuffle=False), items, 1)
    return np.array([m.compute_ms[0] for m in measured])


def measure_layouts(layouts, N: int, batch_size: int, hw, warmup: int, iters: int, mp_keep: float | None = None):
    """Per layout, every rank's forward and backward all-to-all ms ([len, N] each), one round of the measurement
    engine on N ranks; DCT-MP's with `mp_keep`."""
    from ..hardware.engine import EngineSettings, Layout, measure_fixed

    items = [Layout(tuple(int(x) for x in d), tuple(float(x) for x in w)) for d, w in layouts]
    measured = measure_fixed(EngineSettings(None, hw, batch_size, warmup, iters, mp_keep, shuffle=False), items, N)
    return np.array([m.fw_ms for m in measured]), np.array([m.bw_ms for m in measured])


def _file_digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _digest(obj) -> str:
    """SHA-256 of plain data (lists, dicts, numbers, strings) in one canonical JSON form."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()).hexdigest()


# what `calibration_inputs` holds, named as the notes name what differs
INPUT_NAMES = {"tables": "tables", "ids": "ids", "hardware": "hardware", "batch_size": "batch",
               "num_devices": "device count", "max_mem_gb": "device memory", "models": "pre-trained cost models",
               "method": "calibration method"}


def calibration_inputs(task, hw_desc: dict, batch_size: int, num_devices: int, max_mem_gb: float, model_paths,
                       ids_path=None, method: str = CALIBRATION_METHOD) -> dict:
    """What a calibration depends on, as plain data saved in it: the tables themselves (features, dims, rows),
    digests of the ids and pre-trained model files, hardware, batch, devices, memory and calibration method.
    Reuse compares these (`differences`), so a calibration is reused for exactly the tables it measured."""
    return {"tables": {"features": np.asarray(task.data_features, np.float64).tolist(),
                       "dims": [int(d) for d in task.dims], "rows": [int(r) for r in task.rows]},
            "ids": None if ids_path is None else _file_digest(ids_path),
            "hardware": {k: hw_desc.get(k) for k in ("device", "backend", "device_name")},
            "batch_size": int(batch_size), "num_devices": int(num_devices), "max_mem_gb": float(max_mem_gb),
            "models": [_file_digest(p) for p in model_paths], "method": method}


def fingerprint_of(inputs: dict) -> str:
    """16 hex digits naming `calibration_inputs` (shown and saved; reuse compares the inputs themselves)."""
    return _digest(inputs)[:16]


def fingerprint(task, hw_desc: dict, batch_size: int, num_devices: int, max_mem_gb: float, model_paths,
                ids_path=None, method: str = CALIBRATION_METHOD) -> str:
    """`fingerprint_of` the `calibration_inputs` of these arguments."""
    return fingerprint_of(calibration_inputs(task, hw_desc, batch_size, num_devices, max_mem_gb, model_paths,
                                             ids_path, method))


def differences(made_for, inputs: dict) -> list[str]:
    """What differs between the inputs a calibration was made for and these (names from INPUT_NAMES); a file
    without them was made by an earlier release: its calibration method differs."""
    if not isinstance(made_for, dict):
        return [INPUT_NAMES["method"]]
    return [name for key, name in INPUT_NAMES.items() if _digest(made_for.get(key)) != _digest(inputs.get(key))]


CALIBRATION_SUFFIX = ".calibration.pt"


def calibration_path(out) -> Path:
    """Where the calibrated models of a plan are saved: beside it, `<plan>.calibration.pt`."""
    out = Path(out)
    return out.with_name(out.stem + CALIBRATION_SUFFIX)


def _content_digest(report: dict) -> str:
    """Digest of what a calibration file says it measured and what for: a file edited after it was saved (a
    fingerprint or reference changed by hand) no longer matches its digest."""
    fitted = ("step_fit",) if report.get("step_fit") is not None else ()  # files without a fit keep their digest
    keys = ("made_for", "measured", "reference", "config") + fitted
    return _digest({k: report.get(k) for k in keys})


def save_calibration(path, sim: Simulator, report: dict) -> Path:
    report = {**report, "digest": _content_digest(report)}
    if isinstance(report.get("made_for"), dict):
        report["fingerprint"] = fingerprint_of(report["made_for"])
    state = {name: {"kind": m.kind, "meta": m.meta, "state_dict": {k: v.detach().clone() for k, v in
                                                                  m.net.state_dict().items()}}
             for name, m in (("compute", sim.compute), ("fw", sim.fw), ("bw", sim.bw), ("input", sim.inp))
             if m is not None}
    return atomic_torch_save(path, {"kind": CALIBRATION_KIND, "report": report, "models": state})


def find_calibration(path, inputs: dict | None, task=None, cluster: Cluster | None = None
                     ) -> tuple[tuple[Simulator, dict] | None, list[str]]:
    """(the calibrated simulator and report saved at `path`, []) when it was made for `inputs`
    (`calibration_inputs`); (None, what differs) when it was made for other inputs; (None, []) when there is
    no file. A file whose content no longer matches its digest is refused, and with the `task` and `cluster`
    its drift reference is checked against the shards it measured."""
    path = Path(path)
    if not os.path.lexists(path):
        return None, []
    obj = load_torch(path, "calibration")
    if not isinstance(obj, dict) or obj.get("kind") != CALIBRATION_KIND or not isinstance(obj.get("models"), dict) \
            or not isinstance(obj.get("report"), dict):
        raise UserError(f"{path} is not a neuroshard calibration; delete it or choose another --out")
    report = obj["report"]
    try:
        unchanged = "digest" in report and report["digest"] == _content_digest(report)
    except (TypeError, ValueError):  # a value no saved calibration holds (a tensor, bytes)
        unchanged = False
    if not unchanged:
        raise UserError(f"{path} is damaged or was changed after it was saved (what it holds no longer matches "
                        "its digest, or it has none); delete it to calibrate again")
    differ = [] if inputs is None else differences(report.get("made_for"), inputs)  # None: read_calibration
    if differ:
        return None, differ
    if task is not None and cluster is not None:
        measured = report.get("measured")
        check_measured(measured, task, cluster, str(path))
        check_reference(report.get("reference"), task.rows, cluster, str(path), task.dims, measured)
    models = []
    for name, cls in (("compute", ComputeCostModel), ("fw", CommCostModel), ("bw", CommCostModel),
                      ("input", CommCostModel)):
        entry = obj["models"].get(name)
        if name == "input" and entry is None:  # a calibration made without an input-distribution model
            models.append(None)
            continue
        try:
            m = cls._build(entry["meta"])
            m.net.load_state_dict(entry["state_dict"])
        except Exception:
            raise UserError(f"{path} is damaged ({name} model); delete it to calibrate again") from None
        if not all(torch.isfinite(v).all() for v in entry["state_dict"].values()):
            raise UserError(f"{path} has non-finite weights; delete it to calibrate again")
        m.net.eval()
        models.append(m)
    fit = report.get("step_fit")
    try:
        step_fit = None if fit is None else StepFit(fit["scale"], fit["overhead_ms"])
    except (TypeError, KeyError, UserError):
        raise UserError(f"{path} holds a damaged step fit; delete it to calibrate again") from None
    try:
        sim = Simulator(*models[:3], step_fit=step_fit, inp=models[3])
    except UserError:  # models that disagree (direction, devices, hardware, batch)
        raise UserError(f"{path} is damaged (its models disagree); delete it to calibrate again") from None
    check_calibrated_predictions(sim, report, path)
    return (sim, report), []


def check_calibrated_predictions(sim: Simulator, report: dict, path) -> None:
    """The calibrated models' predictions for what the calibration measured (its shards' compute, its layouts'
    all-to-alls): each plausible by magnitude (`implausible_ms`; a model's raw prediction may dip below 0), else
    one line naming the file. The digest covers what was measured, not the weights, and it is unkeyed: it catches
    accidents, not forgery. A file whose models were edited (a compute bias of 1e30) is refused here; one forged
    whole can still give a bad plan, never an absurd cost (every plan's cost is checked too, `Cost.check`). A file
    that holds no measurements (made by hand) has nothing to check here."""
    measured = report.get("measured")
    if measured is None:
        return
    try:
        features = np.asarray(report["made_for"]["tables"]["features"], np.float64)
        shards = [(np.array([t for t, _ in dev], np.int64), np.array([d for _, d in dev], np.int64))
                  for dev in measured["shards"]]
        layouts = measured.get("layouts", [])  # files of earlier methods measured none
        dims = np.array([lay["dims"] for lay in layouts], np.float32)
        delays = np.array([lay["delays_ms"] for lay in layouts], np.float32)
        predicted = [("compute", sim.compute.predict(*compute_arrays(features, shards)))]
        if len(dims):
            predicted += [("forward all-to-all", sim.fw.predict(np.concatenate([dims, delays], axis=1))),
                          ("backward all-to-all", sim.bw.predict(dims))]
    except (TypeError, KeyError, ValueError, IndexError):
        raise UserError(f"{path} holds damaged measurements; delete it to calibrate again") from None
    for what, ms in predicted:
        why = implausible_ms(np.abs(ms))
        if why:
            raise UserError(f"{path}: its calibrated cost models predict a {what} cost that cannot be true ({why}) "
                            "for the shards it measured; delete it to calibrate again")


def load_calibration(path, inputs: dict, task=None, cluster: Cluster | None = None) -> tuple[Simulator, dict] | None:
    """The calibrated simulator saved at `path` if it was made for `inputs`; None if absent or for other inputs."""
    return find_calibration(path, inputs, task, cluster)[0]


def read_calibration(path) -> tuple[Simulator, dict]:
    """(the calibrated simulator, its report) saved at `path` by `shard_tables --calibrate`, whatever tables it was
    made for (the caller vouches for them; `report["made_for"]` says what they were), for
    `NeuroShardPlanner(simulator=...)`. A missing, foreign or edited file is one UserError."""
    if not os.path.lexists(path):
        raise UserError(f"{path}: no such calibration; make one with tools/shard_tables.py --calibrate (it saves "
                        "<plan>.calibration.pt beside the plan)")
    return find_calibration(path, None)[0]


def check_measured(measured, task, cluster: Cluster, where: str) -> dict:
    """What a calibration file says it measured: shards of the task's tables ([table, dim] pairs, column shards
    of their tables, within a device's memory), each with a plausible compute ms; all-to-all ms per layout and
    rank plausible too. One line naming the file otherwise."""
    try:
        shards, ms = measured["shards"], np.asarray(measured["compute_ms"], np.float64)
        ok = isinstance(shards, list) and 1 <= len(shards) == len(ms) and implausible_ms(ms, positive=True) is None
        for dev in shards if ok else []:
            ok = ok and isinstance(dev, list) and len(dev) >= 1 and all(
                len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x)
                and 0 <= x[0] < task.num_tables and _shard_dim_ok(x[1], int(task.dims[x[0]])) for x in dev)
            ok = ok and table_size_gb(task.rows[[t for t, _ in dev]], np.array([d for _, d in dev])).sum() \
                <= cluster.max_mem_gb * (1 + 1e-9)
        for key in ("fw_ms", "bw_ms") + (("input_ms",) if "input_ms" in measured else ()):
            v = np.asarray(measured[key], np.float64)
            ok = ok and v.ndim == 2 and v.shape[1] == cluster.num_devices and implausible_ms(v) is None
    except (TypeError, KeyError, ValueError, IndexError):
        ok = False
    if not ok:
        raise UserError(f"{where} holds damaged measurements; delete it to calibrate again")
    return measured


def calibrate(sim: Simulator, tl, cluster: Cluster, hw, batch_size: int, cfg: CalibrationConfig,
              ids_path=None, log=print) -> tuple[Simulator, dict]:
    """Measure, fine-tune and check (module docstring); returns the calibrated simulator and a report."""
    cfg.check()
    t0 = time.perf_counter()
    task = tl.task
    shards = sample_user_shards(task, cluster, cfg.num_shards, cfg.seed)
    dmp_plans = sample_user_plans(task, cluster, cfg.dmp_plans, cfg.seed) if cfg.dmp_plans else []  # before any work
    log(f"calibrating: measuring {len(shards)} shards of these tables (the heaviest tables alone, the rest "
        f"random; {cfg.warmup_iter} warm-up + {cfg.num_iter} timed iterations each, {hw.backend}/{hw.device}) "
        f"and {cfg.comm_layouts} all-to-all layouts of their dims on {cluster.num_devices} ranks"
        f"{' (and of their input distribution)' if sim.inp is not None else ''}")
    with tempfile.TemporaryDirectory(prefix="neuroshard-calibrate-") as tmp:
        ds = user_tables_dataset(tl, batch_size, cfg.seed, Path(tmp), ids_path)
        y = measure_shards(ds, hw, batch_size, shards, cfg.warmup_iter, cfg.num_iter)
        dmp_ms = measure_plans_dmp(tl, dmp_plans, ds, hw, batch_size, cluster.num_devices, cfg.dmp_rounds,
                                   MEASURE_WARMUP_ITER, MEASURE_NUM_ITER, log) if dmp_plans else None
    spread_ms = max(MIN_SPREAD_MS, float(np.nanmax(y)))  # plans' straggler delays reach about a device's compute
    layouts = comm_layouts(task, cluster.num_devices, cfg.comm_layouts, cfg.seed, spread_ms)
    reference = drift_reference(shards, y, _split(len(shards), cfg.seed)[1], cluster.num_devices, cfg.seed)
    # the all-to-all the comm models know: DCT-MP's compressed one for models trained with --mp_keep
    fw_y, bw_y = measure_layouts(layouts + reference_layouts(reference), cluster.num_devices, batch_size, hw,
                                 cfg.warmup_iter, cfg.num_iter, sim.mp_keep)
    for g, b in zip(reference, bw_y[len(layouts):]):
        g["bw_ms"] = [float(v) for v in b]
    fw_y, bw_y = fw_y[:len(layouts)], bw_y[:len(layouts)]
    # TorchRec's input distribution, where there is a model of it to fine-tune, N tables to place and TorchRec
    in_layouts = input_layouts(task, cluster.num_devices, cfg.comm_layouts, cfg.seed) \
        if sim.inp is not None and task.num_tables >= cluster.num_devices and torchrec_available() else []
    in_words, in_y = (measure_input_layouts(in_layouts, cluster.num_devices, batch_size, hw, cfg.warmup_iter,
                                            cfg.num_iter) if in_layouts else (None, None))
    measured_s = time.perf_counter() - t0
    for what, values, positive in (("compute", y, True), ("forward all-to-all", fw_y, False),
                                   ("backward all-to-all", bw_y, False),
                                   *((("input distribution", in_y, True),) if in_layouts else ())):
        why = implausible_ms(values, positive)
        if why:
            raise UserError(f"calibrating measured a {what} cost that cannot be true ({why}): the timer or a worker "
                            "failed; rerun the same command (nothing was saved)")
    measured = {"shards": [[[int(t), int(d)] for t, d in zip(*sh)] for sh in shards],
                "compute_ms": [float(v) for v in y],
                "layouts": [{"dims": [int(v) for v in d], "delays_ms": [float(v) for v in w]} for d, w in layouts],
                "fw_ms": fw_y.tolist(), "bw_ms": bw_y.tolist()}
    inp, rep_in = sim.inp, None
    if in_layouts:
        measured.update(input_layouts=in_layouts, input_ms=in_y.tolist())
        itune, iheld = _split(len(in_layouts), cfg.seed + 2)
        inp, rep_in = _fine_tune_kept(sim.inp, (in_words.astype(np.float32),), in_y.astype(np.float32), itune,
                                      iheld, cfg, _copy)
    compute, rep_c = fine_tune_compute(sim.compute, task, shards, y, cfg)
    dims = np.stack([d for d, _ in layouts]).astype(np.float32)
    delays = np.stack([d for _, d in layouts]).astype(np.float32)
    ctune, cheld = _split(len(layouts), cfg.seed + 1)
    fw, rep_fw = _fine_tune_kept(sim.fw, (np.concatenate([dims, delays], axis=1),), fw_y.astype(np.float32),
                                 ctune, cheld, cfg, _copy)
    bw, rep_bw = _fine_tune_kept(sim.bw, (dims,), bw_y.astype(np.float32), ctune, cheld, cfg, _copy)
    step_fit, rep_step = None, None
    if dmp_plans:
        step_fit, rep_step, measured["dmp"] = fit_to_steps(Simulator(compute, fw, bw, inp=inp), task, dmp_plans,
                                                           dmp_ms, _split, cfg.seed, log)
    report = {"compute": rep_c, "fw": rep_fw, "bw": rep_bw, "input": rep_in, "step": rep_step,
              "step_fit": None if step_fit is None else step_fit.to_dict(),
              "comm_max_spread_ms": spread_ms, "reference": reference,
              "measured": measured, "measure_s": measured_s,
              "total_s": time.perf_counter() - t0, "config": asdict(cfg), "provenance": provenance()}
    for name, r in (("compute", rep_c), ("fw comm", rep_fw), ("bw comm", rep_bw), ("input", rep_in)):
        if r is None:
            continue
        b, a = r["before"], r["after"]
        log(f"  {name:<8} held-out MAPE {100 * b['mape']:6.1f}% -> {100 * a['mape']:6.1f}%   Spearman "
            f"{b['spearman']:.3f} -> {a['spearman']:.3f}   ({r['samples']['fine_tune']} fine-tune / "
            f"{r['samples']['held_out']} held out){'' if r['kept'] else '  (not better: pre-trained model kept)'}")
    log(f"  calibration took {report['total_s']:.0f} s ({measured_s:.0f} s measuring)")
    return Simulator(compute, fw, bw, step_fit=step_fit, inp=inp), report

