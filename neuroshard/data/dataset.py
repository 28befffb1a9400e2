"""The processed DLRM dataset (DESIGN.md §2): per-table features plus the ids, and the data step.

Processed format (a folder, default `data/dlrm_datasets`):
- `tables.pkl`  — metadata + the [T, 19] data-feature matrix (see `features`), per-table lookup and
                  unique-id counts, a fingerprint, and the provenance of the run (a plain-data
                  pickle, read with the no-globals unpickler);
- `indices.pt`  — `{"indices": int64[N], "offsets": int64[T*B + 1]}` in the raw layout, read with
                  `torch.load(weights_only=True, mmap=True)` so benchmarks read only what they touch.
Both files are written into a staging folder that then replaces the old one, so a failed run
never leaves a dataset whose two files disagree. Synthetic data goes through the same code.
"""
from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ..core.artifacts import (atomic_torch_save, atomic_write_pickle, load_pickle, provenance, torch_load_failure,
                              torch_load_plain)
from ..core.config import DatasetConfig
from ..core.errors import UserError, check_int
from ..core.file_names import DATASET_FILES, DATASET_INDICES, DATASET_TABLES
from .features import DATA_FEATURE_NAMES, NUM_BINS, reuse_bin, table_data_features, table_size_gb
from .raw import load_raw, save_raw
from .synthetic import (PUBLISHED_MEAN_POOLING, PUBLISHED_REUSE_UNIQUE_SHARE, SyntheticConfig,
                        generate_synthetic_raw)

DATASET_KIND = "neuroshard.dlrm_dataset"


def process_raw(indices: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                out_dir: str | Path, source: dict[str, Any], progress: bool = True) -> "DLRMDataset":
    """Compute per-table features and write the processed dataset folder.

    Inputs come from `load_raw` (validated there) or `generate_synthetic_raw` (valid by construction).
    """
    T, B = lengths.shape
    out_dir = Path(out_dir)
    ind_np, off_np, len_np = indices.numpy(), offsets.numpy(), lengths.numpy()
    features = np.zeros((T, len(DATA_FEATURE_NAMES)))
    num_unique = np.zeros(T, dtype=np.int64)
    unique_per_bin = np.zeros((T, NUM_BINS), dtype=np.int64)
    for t in tqdm(range(T), desc="table features", disable=not progress, leave=False):
        ids = ind_np[off_np[t * B]: off_np[(t + 1) * B]]
        features[t] = table_data_features(ids, len_np[t])
        if ids.size:
            _, counts = np.unique(ids, return_counts=True)
            num_unique[t] = counts.size
            unique_per_bin[t] = np.bincount(reuse_bin(counts), minlength=NUM_BINS)
    meta = {
        "kind": DATASET_KIND,
        "num_tables": T,
        "batch_size": B,
        "feature_names": DATA_FEATURE_NAMES,
        "features": features,
        "num_lookups": len_np.sum(axis=1),
        "num_unique": num_unique,
        "unique_per_bin": unique_per_bin,
        "provenance": provenance(**source),
    }
    meta["fingerprint"] = _fingerprint(features, B)
    _replace_folder(out_dir, lambda stage: (
        atomic_torch_save(stage / DATASET_INDICES, {"indices": indices.contiguous(), "offsets": offsets.contiguous()}),
        atomic_write_pickle(stage / DATASET_TABLES, meta)))
    return DLRMDataset.load(out_dir)


def check_out_dir(out_dir: Path) -> None:
    """Before any work: `out_dir` holds nothing but a dataset (which writing replaces) and its folder can be
    written (a staging folder is made there and removed)."""
    _staging_folder(Path(out_dir)).rmdir()


def _staging_folder(out_dir: Path) -> Path:
    """A new empty folder beside `out_dir` to write a dataset into; one line where `out_dir` holds other files or
    its folder cannot be written."""
    if out_dir.exists() and (not out_dir.is_dir() or any(p.name not in DATASET_FILES for p in out_dir.iterdir())):
        raise UserError(f"{out_dir} exists and holds other files than a neuroshard dataset; choose another --out_dir")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.new-"))
    except OSError as e:
        raise UserError(f"cannot write to {out_dir.parent}: {e.strerror}; choose a writable output folder") from None


def _replace_folder(out_dir: Path, write) -> None:
    """Write a dataset into a staging folder beside `out_dir`, then put it in place of `out_dir`."""
    stage = _staging_folder(out_dir)
    old = None
    try:
        write(stage)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{time.monotonic_ns()}")
            os.replace(out_dir, old)
        os.replace(stage, out_dir)
    except BaseException:
        if old is not None and not out_dir.exists():
            os.replace(old, out_dir)
            old = None
        shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _fingerprint(features: np.ndarray, batch_size: int) -> str:
    h = hashlib.sha1(np.ascontiguousarray(features, dtype=np.float64).tobytes())
    h.update(str(batch_size).encode())
    return h.hexdigest()[:16]


@dataclass
class DLRMDataset:
    """A processed dataset folder: features in memory, indices memory-mapped on demand."""

    path: Path
    meta: dict[str, Any]
    _bags: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @classmethod
    def load(cls, path: str | Path) -> "DLRMDataset":
        path = Path(path)
        if not (path / DATASET_TABLES).is_file() or not (path / DATASET_INDICES).is_file():
            raise UserError(f"{path} is not a processed DLRM dataset (no {DATASET_TABLES} / {DATASET_INDICES}); "
                            "run tools/gen_dlrm_data.py first")
        meta = load_pickle(path / DATASET_TABLES, "processed dataset")
        if not isinstance(meta, dict) or meta.get("kind") != DATASET_KIND:
            raise UserError(f"{path}/{DATASET_TABLES} is not a neuroshard dataset; rerun tools/gen_dlrm_data.py")
        f = meta.get("features")
        T, B = meta.get("num_tables"), meta.get("batch_size")
        if (not isinstance(f, np.ndarray) or f.ndim != 2 or f.shape != (T, len(DATA_FEATURE_NAMES))
                or not isinstance(B, int) or B < 1 or not np.all(np.isfinite(f))
                or meta.get("fingerprint") != _fingerprint(f, B)):
            raise UserError(f"{path}/{DATASET_TABLES} is damaged (features, batch or fingerprint disagree); "
                            "rerun tools/gen_dlrm_data.py")
        return cls(path, meta)

    @property
    def num_tables(self) -> int:
        return int(self.meta["num_tables"])

    @property
    def batch_size(self) -> int:
        return int(self.meta["batch_size"])

    @property
    def features(self) -> np.ndarray:
        """[T, 19] data features (row, pooling_factor, bin_0..bin_16)."""
        return self.meta["features"]

    @property
    def rows(self) -> np.ndarray:
        return self.features[:, 0].astype(np.int64)

    @property
    def fingerprint(self) -> str:
        return self.meta["fingerprint"]

    def bags(self) -> dict[str, torch.Tensor]:
        if self._bags is None:
            try:
                bags = torch_load_plain(self.path / DATASET_INDICES, mmap=True)
            except Exception as e:
                raise UserError(f"{self.path}/{DATASET_INDICES} is not readable ({torch_load_failure(e)}); "
                                "rerun tools/gen_dlrm_data.py") from None
            if (not isinstance(bags, dict) or set(bags) != {"indices", "offsets"}
                    or not all(isinstance(x, torch.Tensor) and x.dtype == torch.int64 and x.dim() == 1
                               for x in bags.values())
                    or bags["offsets"].numel() != self.num_tables * self.batch_size + 1):
                raise UserError(f"{self.path}/{DATASET_INDICES} does not match {DATASET_TABLES}; "
                                "rerun tools/gen_dlrm_data.py")
            off = bags["offsets"]
            lengths = off[1:] - off[:-1]
            if int(off[0]) != 0 or int(off[-1]) != bags["indices"].numel() or bool((lengths < 0).any()):
                bad = int(torch.nonzero(lengths < 0)[0]) if bool((lengths < 0).any()) else 0
                raise UserError(f"{self.path}/{DATASET_INDICES} is damaged: the bags of table {bad // self.batch_size} "
                                "do not add up (a negative bag length, or offsets that do not end at the ids); "
                                "rerun tools/gen_dlrm_data.py")
            self._bags = bags
        return self._bags

    def check_batch(self, batch_size: int | None) -> int:
        """The batch a step uses: `batch_size` (1..dataset batch), or the dataset's whole batch."""
        if batch_size is None:
            return self.batch_size
        return check_int("--batch_size", batch_size, 1, self.batch_size)

    def table_bags(self, t: int, batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Table t's ids and bag offsets (starting at 0) for the first `batch_size` samples."""
        B = self.batch_size
        b = self.check_batch(batch_size)
        bags = self.bags()
        off = bags["offsets"][t * B: t * B + b + 1]
        ids = bags["indices"][int(off[0]): int(off[-1])].clone()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= max(self.rows[t], 1)):
            raise UserError(f"{self.path}/{DATASET_INDICES} is damaged: table {t} holds id {int(ids.max())} or "
                            f"{int(ids.min())} outside its rows 0..{self.rows[t] - 1}; rerun tools/gen_dlrm_data.py")
        return ids, off - off[0]

    def reuse_histogram(self) -> np.ndarray:
        """Global share of unique ids per reuse bin (unique ids counted per table)."""
        per_bin = self.meta["unique_per_bin"].sum(axis=0)
        return per_bin / max(1, per_bin.sum())

    def summary(self) -> str:
        f = self.features
        rows, pf = f[:, 0], f[:, 1]
        hist = self.reuse_histogram()
        tv = 0.5 * np.abs(hist - PUBLISHED_REUSE_UNIQUE_SHARE).sum()
        lines = [
            f"dataset {self.path}  ({self.num_tables} tables, batch {self.batch_size}, "
            f"{int(self.meta['num_lookups'].sum()):,} lookups, {int(self.meta['num_unique'].sum()):,} unique ids)",
            f"rows            min {rows.min():,.0f}  median {np.median(rows):,.0f}  max {rows.max():,.0f}"
            f"  ({math.log10(rows.max() / rows.min()):.1f} orders of magnitude)",
            f"pooling factor  mean {pf.mean():.2f} (published {PUBLISHED_MEAN_POOLING:.2f})  median {np.median(pf):.2f}"
            f"  max {pf.max():.2f}  tables <= 1: {(pf <= 1).sum()}",
            f"total size at dim 128: {table_size_gb(rows, 128).sum():,.1f} GB",
            "reuse histogram (share of unique ids)   this   published",
        ]
        names = ["(0,1]"] + [f"({2 ** (j - 1)},{2 ** j}]" for j in range(1, NUM_BINS - 1)] + [">32768"]
        for j in range(NUM_BINS):
            lines.append(f"  {names[j]:>15}                        {hist[j]:.3f}   {PUBLISHED_REUSE_UNIQUE_SHARE[j]:.3f}")
        lines.append(f"total-variation distance to published: {tv:.3f}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the data step

def build_dataset(cfg: DatasetConfig, progress: bool = True) -> DLRMDataset:
    """Step 1: a raw dataset file (`cfg.data`) or a synthetic one -> processed dataset folder `cfg.out_dir`."""
    cfg.check()
    if cfg.data is None and not cfg.synthetic:
        raise UserError("pass exactly one of --data PATH (a raw DLRM dataset) or --synthetic")
    data, seed = cfg.data, cfg.seed
    check_out_dir(Path(cfg.out_dir))  # a folder it cannot write fails here, not after minutes of generating
    t0 = time.perf_counter()
    if cfg.synthetic:
        syn = SyntheticConfig(num_tables=cfg.num_tables, batch_size=cfg.batch_size, seed=seed,
                              row_scale=cfg.row_scale).check()
        print(f"generating synthetic DLRM data: {syn.num_tables} tables, batch {syn.batch_size}, seed {syn.seed}, "
              f"row_scale {syn.row_scale}")
        raw = generate_synthetic_raw(syn, progress=progress)
        if cfg.save_raw:
            print(f"raw dataset written to {save_raw(cfg.save_raw, *raw)}")
        source = {"source": "synthetic", "synthetic_config": dict(syn.__dict__), "seed": seed}
    else:
        print(f"loading {data}")
        raw = load_raw(data)  # validated before anything is written
        source = {"source": "file", "data": str(data), "seed": seed}
    ds = process_raw(*raw, out_dir=cfg.out_dir, source=source, progress=progress)
    print(ds.summary())
    print(f"processed dataset written to {ds.path} in {time.perf_counter() - t0:.1f} s")
    return ds
