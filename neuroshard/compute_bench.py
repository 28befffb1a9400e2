"""Compute cost of a shard (DESIGN.md §3.1): one fused operator over a set of tables, forward +
backward, median over timed iterations after warm-ups, last-level cache flushed before each.

`ComputeBenchmark` holds one device's dataset handle, flusher and settings; `measure` times any set
of (dataset table, dim) pairs on the dataset's real ids. `sample_shard` draws the random shards
of the compute-cost dataset.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .backends import CacheFlusher, Hardware, make_fused, median_ms
from .dataset import DLRMDataset
from .tables import dim_choices, table_size_gb


@dataclass
class ComputeBenchmark:
    dataset: DLRMDataset
    hw: Hardware
    batch_size: int
    warmup_iter: int = 5
    num_iter: int = 10
    flush: bool = True

    def __post_init__(self):
        self.flusher = CacheFlusher(self.hw.device) if self.flush else None

    def inputs(self, table_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Table-major indices and offsets (T*B + 1) of the given dataset tables."""
        ids, offs, base = [], [torch.zeros(1, dtype=torch.int64)], 0
        for t in table_ids:
            i, o = self.dataset.table_bags(int(t), self.batch_size)
            ids.append(i)
            offs.append(o[1:] + base)
            base += i.numel()
        return torch.cat(ids), torch.cat(offs)

    def measure(self, table_ids, dims) -> float:
        """Median ms of forward + backward of one fused operator holding these tables."""
        rows = self.dataset.rows[np.asarray(table_ids, dtype=np.int64)]
        op = make_fused([(int(r), int(d)) for r, d in zip(rows, dims)], self.hw)
        prepared = op.prepare(*self.inputs(table_ids))
        grad = torch.ones(self.batch_size, int(np.sum(dims)), device=self.hw.device)
        return median_ms(lambda: op.train_step(prepared, grad), self.hw.device, self.warmup_iter, self.num_iter,
                         self.flusher)


def sample_shard(rows: np.ndarray, index: int, seed: int, max_tables: int, max_mem_gb: float,
                 max_dim: int, max_tries: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """Random multiset of 1..max_tables augmented tables (table, dim) whose total size <= max_mem.

    Deterministic in (seed, index), so parallel workers and resumed runs draw the same samples.
    """
    rng = np.random.default_rng([seed, index])
    dims_set = np.array(dim_choices(max_dim))
    for _ in range(max_tries):
        n = int(rng.integers(1, max_tables + 1))
        ids = rng.integers(0, len(rows), n)
        dims = rng.choice(dims_set, n)
        if table_size_gb(rows[ids], dims).sum() <= max_mem_gb:
            return ids.astype(np.int64), dims.astype(np.int64)
    raise RuntimeError("no shard within --max_mem after many draws")


# ----------------------------------------------------------------------------- parallel collection

COMPUTE_DATA_KIND = "neuroshard.compute_cost_data"
_worker: ComputeBenchmark | None = None
_sample_args: dict = {}


def _init_worker(dataset_dir, hw, batch_size, warmup_iter, num_iter, device_queue, sample_args):
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    torch.set_num_threads(1)
    if hw.device == "cuda":
        torch.cuda.set_device(device_queue.get())
    global _worker, _sample_args
    _worker = ComputeBenchmark(DLRMDataset.load(dataset_dir), hw, batch_size, warmup_iter, num_iter)
    _sample_args = sample_args


def _measure_sample(index: int) -> dict:
    ids, dims = sample_shard(_worker.dataset.rows, index, **_sample_args)
    return {"index": index, "table_ids": ids, "dims": dims, "cost_ms": _worker.measure(ids, dims)}


def collect_compute_samples(out_path, dataset: DLRMDataset, hw: Hardware, data_size: int, batch_size: int,
                            workers: int, warmup_iter: int, num_iter: int, seed: int, max_tables: int,
                            max_mem_gb: float, max_dim: int, gpu_ids: list[int] | None = None) -> dict:
    """Measure samples until the file at `out_path` holds `data_size`; returns a small report."""
    import multiprocessing as mp
    import time

    from tqdm import tqdm

    from .collect import SampleFile

    sample_args = {"seed": seed, "max_tables": max_tables, "max_mem_gb": max_mem_gb, "max_dim": max_dim}
    meta = {**hw.describe(), "batch_size": batch_size, "dataset_fingerprint": dataset.fingerprint,
            "warmup_iter": warmup_iter, "num_iter": num_iter, **sample_args}
    store = SampleFile(out_path, COMPUTE_DATA_KIND, meta,
                       must_match=("device", "backend", "batch_size", "dataset_fingerprint", "seed", "max_mem_gb",
                                   "max_tables", "max_dim"))
    todo = store.missing_indices(data_size)
    if not todo:
        return {"measured": 0, "total": len(store.samples), "samples_per_min": float("nan")}
    ctx = mp.get_context("spawn")
    device_queue = ctx.Queue()
    for g in gpu_ids or []:
        device_queue.put(g)
    n_workers = len(gpu_ids) if hw.device == "cuda" else max(1, workers)
    pool = ctx.Pool(n_workers, _init_worker,
                    (str(dataset.path), hw, batch_size, warmup_iter, num_iter, device_queue, sample_args))
    t0, done = None, 0
    try:
        with tqdm(total=len(todo), desc=f"compute samples ({hw.backend}/{hw.device}, {n_workers} workers)") as bar:
            for sample in pool.imap_unordered(_measure_sample, todo):
                if t0 is None:  # start the clock at the first result: worker start-up is not throughput
                    t0 = time.perf_counter()
                else:
                    done += 1
                store.add(sample)
                bar.update()
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        store.save()
    elapsed = time.perf_counter() - t0 if t0 else 0.0
    return {"measured": len(todo), "total": len(store.samples),
            "samples_per_min": 60 * done / elapsed if elapsed > 0 else float("nan")}
