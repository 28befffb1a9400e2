"""Step 3: collect compute-cost and communication-cost samples on hardware (DESIGN.md §3.1–3.2).

A cost-data file is an append-only `RecordLog`: a header with what produced the samples (hardware,
batch, dataset, settings), then one record per measured sample, written the moment the sample is
finished. Sample i is drawn deterministically from (seed, i), so a run with `data_size` D makes
the file hold samples 0..D-1: a re-run measures exactly the missing indices (interrupted runs
leave no holes), a file made with other settings is refused (never mixed), and a second collector
on the same file is refused while the first runs.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from ..core.artifacts import RecordLog, provenance, read_record_log
from ..core.errors import UserError
from ..core.config import RENDEZVOUS_TIMEOUT_S, CommCollectConfig, ComputeCollectConfig, mp_text
from ..core.file_names import comm_data_path, compute_data_path
from ..data.dataset import DLRMDataset
from ..data.features import check_max_dim
from .backends import Hardware, resolve_device, resolve_hardware
from .comm_bench import (COLLECTIVE_WIDTHS, COMM_DATA_KIND, INPUT_MAX_POOLING, CommRankSettings, InputDist,
                         comm_rank)
from .compute_bench import COMPUTE_DATA_KIND, ComputeWorkerSettings, compute_worker, family_collection
from .launch import (cuda_ranks, in_torchrun, join_torchrun_group, rank_gpus, run_processes, torchrun_env,
                     torchrun_ranks)

COMPUTE_MUST_MATCH = ("device", "backend", "batch_size", "dataset_fingerprint", "seed", "max_mem_gb", "max_tables",
                      "max_dim", "warmup_iter", "num_iter", "family_mix")
COMM_MUST_MATCH = ("device", "ndevices", "batch_size", "seed", "T_range", "max_dim", "sleep_range", "warmup_iter",
                   "num_iter", "mp_keep", "input_dist", "input_max_pooling", "collectives", "collective_widths")
INPUT_UNUSED = ("max_dim", "sleep_range")  # settings of the pooled all-to-all's samples that input samples never use
COLLECTIVES_UNUSED = ("T_range", "max_dim", "sleep_range")  # nor collectives samples (a width from the seed)


def _index(record) -> int | None:
    """A sample's index (a whole number >= 0), or None where the record has none."""
    i = record.get("index") if isinstance(record, dict) else None
    return int(i) if isinstance(i, (int, np.integer)) and not isinstance(i, bool) and i >= 0 else None


def check_indices(records: list[dict], path, salvage: bool = False) -> list[dict]:
    """The records, each with its own index; a record without a valid index, or a second one of an index, is
    refused in one line (dropped with `salvage`: the collector never writes either)."""
    seen, good = set(), []
    for r in records:
        i = _index(r)
        if i is not None and i not in seen:
            seen.add(i)
            good.append(r)
    if len(good) < len(records) and not salvage:
        raise UserError(f"{path} holds {len(records) - len(good)} record(s) without a valid index or with an index "
                        "held twice, which the collector never writes; rerun with --salvage to keep the "
                        f"{len(good)} good ones, or delete the file")
    return good


def open_cost_log(path, kind: str, meta: dict, must_match: tuple, salvage: bool) -> RecordLog:
    """A collector's cost-data file opened for appending, its records' indices checked (`check_indices`)."""
    log = RecordLog(path, kind, meta, must_match, "cost data file", salvage=salvage)
    try:
        check_indices(log.records, path, salvage)
    except UserError:
        log.close()
        raise
    return log


def missing_indices(records: list[dict], data_size: int) -> list[int]:
    """Indices in 0..data_size-1 that the file does not hold yet."""
    have = {_index(r) for r in records}
    return [i for i in range(data_size) if i not in have]


def load_cost_data(path: str | Path, kind: str, salvage: bool = False) -> tuple[dict, list[dict]]:
    """(meta, samples sorted by index) of a cost-data file."""
    meta, samples = read_record_log(path, kind, "cost data file", salvage)
    return meta, sorted(check_indices(samples, path, salvage), key=lambda s: s["index"])


def _collect(log: RecordLog, todo: list[int], desc: str, run, writer: bool = True) -> dict:
    """Run `run(on_message)` and append every emitted sample to `log`; returns a small report."""
    t0, first = time.perf_counter(), None
    bar = tqdm(total=len(todo), desc=desc, disable=not writer)

    def on_message(sample):
        nonlocal first
        if first is None:  # start the clock at the first result: process start-up is not throughput
            first = time.perf_counter()
        log.append(sample)
        bar.update()

    try:
        run(on_message)
    finally:
        bar.close()
        log.close()
    done = len(todo)
    elapsed = time.perf_counter() - (first or t0)
    return _report(done, len(log.records), 60 * (done - 1) / elapsed if done > 1 and elapsed > 0 else float("nan"),
                   log.path)


def _report(measured: int, total: int, per_min: float, path: Path) -> dict:
    print(f"measured {measured} samples ({per_min:.1f} samples/min); {path} holds {total}")
    return {"measured": measured, "total": total, "samples_per_min": per_min, "path": path}


def collect_compute(cfg: ComputeCollectConfig) -> dict:
    """Measure compute-cost samples until OUT_DIR/compute_cost_data.pkl holds `cfg.data_size`.

    With `cfg.families_dir`, samples also come from the table families (DESIGN.md §8), built there."""
    cfg.check()
    check_max_dim(cfg.max_dim)
    hwc = cfg.hardware
    gpu_ids = hwc.gpu_ids
    warmup_iter, num_iter, seed = cfg.warmup_iter, cfg.num_iter, cfg.seed
    hw = resolve_hardware(hwc.device, hwc.backend, gpu_ids)
    ds = DLRMDataset.load(cfg.dataset_dir)
    batch = ds.check_batch(cfg.batch_size)
    sample_args = {"seed": seed, "max_tables": cfg.max_tables, "max_mem_gb": cfg.max_mem, "max_dim": cfg.max_dim}
    families, fam_meta = (family_collection(ds, cfg.families_dir, cfg.max_mem, seed, cfg.family_share)
                          if cfg.families_dir else (None, {}))
    meta = {**hw.describe(), "batch_size": batch, "dataset_fingerprint": ds.fingerprint,
            "warmup_iter": warmup_iter, "num_iter": num_iter, **sample_args, **fam_meta, "provenance": provenance()}
    path = compute_data_path(cfg.out_dir)
    if hw.device == "cuda" and not gpu_ids:  # one worker per GPU: two timing on one GPU would disturb each other
        gpu_ids = cuda_ranks(cfg.workers or torch.cuda.device_count(), "worker")
    n_workers = len(gpu_ids) if gpu_ids else (cfg.workers or os.cpu_count() or 1)
    print(f"hardware: {hw.describe()}  batch {batch}  {n_workers} worker(s) -> {path}")
    log = open_cost_log(path, COMPUTE_DATA_KIND, meta, COMPUTE_MUST_MATCH, cfg.salvage)
    todo = missing_indices(log.records, cfg.data_size)
    if not todo:
        log.close()
        return _report(0, len(log.records), float("nan"), path)
    n_workers = min(n_workers, len(todo))
    args = (ComputeWorkerSettings(str(ds.path), hw, batch, warmup_iter, num_iter, todo, sample_args, families),)
    rep = _collect(log, todo, f"compute samples ({hw.backend}/{hw.device}, {n_workers} workers)",
                   lambda on_message: run_processes(compute_worker, n_workers, args, on_message,
                                                    gpu_ids=gpu_ids, what="worker"))
    return rep


def collect_comm(cfg: CommCollectConfig) -> dict:
    """Measure all-to-all samples on N ranks until OUT_DIR/comm_cost_data_<N>.pkl holds `cfg.data_size`
    (with `cfg.mp_keep`: DCT-MP's compressed all-to-alls, into OUT_DIR/comm_cost_data_<N>_mp<K>.pkl; with
    `cfg.input_dist` / `cfg.collectives`: TorchRec's input distribution / the row-wise and data-parallel
    collectives, into ..._<N>_input.pkl / ..._<N>_collectives.pkl)."""
    gpu_ids = list(cfg.gpu_devices) if cfg.gpu_devices else None
    N = len(gpu_ids) if gpu_ids else cfg.ndevices
    if in_torchrun():
        N = torchrun_env()[1] if gpu_ids else torchrun_ranks(cfg.ndevices)[1]
    cfg.check(N)
    check_max_dim(cfg.max_dim)
    warmup_iter, num_iter, seed, batch_size = cfg.warmup_iter, cfg.num_iter, cfg.seed, cfg.batch_size
    T_range, sleep_range, max_dim = cfg.T_range, cfg.sleep_range, cfg.max_dim
    dev = resolve_device(cfg.device, gpu_ids)
    gpu_ids = rank_gpus(dev, N, gpu_ids)  # refused before any file is touched when GPUs are too few
    sample_args = {"seed": seed, "T_range": tuple(T_range), "max_dim": max_dim, "sleep_range": tuple(sleep_range)}
    # input samples draw features from the seed and T_range only: the embedding dims and the stragglers' delays
    # are neither recorded nor checked on resuming
    unused = COLLECTIVES_UNUSED if cfg.collectives else INPUT_UNUSED if cfg.input_dist else ()
    meta = {**Hardware(dev, "torch.distributed").describe(), "ndevices": N, "batch_size": batch_size,
            "warmup_iter": warmup_iter, "num_iter": num_iter,
            **{k: v for k, v in sample_args.items() if k not in unused}, "mp_keep": cfg.mp_keep,
            "provenance": provenance()}
    must_match = tuple(k for k in COMM_MUST_MATCH if k not in unused)
    if cfg.input_dist:  # refused before any file is touched where TorchRec is missing (no key otherwise: older
        InputDist.check_torchrec()  # all-to-all files stay resumable)
        meta.update(input_dist=True, input_max_pooling=INPUT_MAX_POOLING)
    if cfg.collectives:
        meta.update(collectives=True, collective_widths=list(COLLECTIVE_WIDTHS))
    path = comm_data_path(cfg.out_dir, N, cfg.mp_keep, cfg.input_dist, cfg.collectives)
    writer = not in_torchrun() or int(os.environ.get("RANK", 0)) == 0  # rank 0 keeps the file
    what = ("the row-wise and data-parallel collectives" if cfg.collectives else
            "TorchRec's input distribution" if cfg.input_dist else f"{mp_text(cfg.mp_keep)} all-to-all")
    print(f"{N} ranks on {dev}, batch {batch_size}, {what} -> {path}")
    if writer:
        log = open_cost_log(path, COMM_DATA_KIND, meta, must_match, cfg.salvage)
        todo = missing_indices(log.records, cfg.data_size)
    else:  # other torchrun ranks learn the indices from rank 0 below
        log, todo = None, None
    if in_torchrun():
        todo = _broadcast_todo(todo, dev)
    if not todo:
        if log is not None:
            log.close()
        return _report(0, len(log.records) if log else 0, float("nan"), path)
    args = (CommRankSettings(todo, sample_args, batch_size, dev, warmup_iter, num_iter, cfg.mp_keep, cfg.input_dist,
                             collectives=cfg.collectives),)
    run = lambda on_message: run_processes(comm_rank, N, args, on_message, group_device=dev, gpu_ids=gpu_ids)  # noqa
    if log is None:
        run(lambda _: None)
        return {"measured": len(todo), "total": 0, "samples_per_min": float("nan"), "path": path}
    return _collect(log, todo, f"comm samples ({N} ranks, {dev})", run)


def _broadcast_todo(todo, device: str):
    """Under torchrun, rank 0 (which holds the file) tells every rank which indices to measure."""
    join_torchrun_group(device, RENDEZVOUS_TIMEOUT_S)
    n = torch.tensor([len(todo) if todo is not None else 0], dtype=torch.int64)
    dist.broadcast(n, src=0)
    t = torch.tensor(todo if todo is not None else [0] * int(n), dtype=torch.int64)
    dist.broadcast(t, src=0)
    return t.tolist()
