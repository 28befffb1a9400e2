"""DLRM dataset I/O, validation, synthesis and processing (DESIGN.md §2.1–2.3).

Raw format (the public `fbgemm_t856_bs65536.pt`): a `torch.save`d tuple `(indices, offsets, lengths)`,
optionally gzip-compressed, with `lengths` of shape [T, B], `offsets` of length T*B + 1 (prefix sums,
table by table) and `indices` the row ids, local to each table.

Processed format (a folder, default `data/dlrm_datasets`):
- `tables.pkl`  — metadata + the [T, 19] data-feature matrix (see `neuroshard.tables`), per-table
                  lookup and unique-id counts, and the provenance of the run;
- `indices.pt`  — `{"indices": int64[N], "offsets": int64[T*B + 1]}` in the raw layout, loaded with
                  `torch.load(weights_only=True, mmap=True)` so benchmarks read only what they touch.
Synthetic data is generated in the raw format and processed by the same code as a real file.
"""
from __future__ import annotations

import gzip
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from .artifacts import atomic_torch_save, atomic_write_pickle, load_pickle, provenance
from .errors import UserError
from .tables import NUM_BINS, DATA_FEATURE_NAMES, reuse_bin, table_data_features, table_size_gb

DATASET_KIND = "neuroshard.dlrm_dataset"

# Published statistics of fbgemm_t856_bs65536.pt (../shared/data/dlrm_2021_locality_stats.txt).
PUBLISHED_MEAN_POOLING = 887_017_990 / (856 * 65536)  # 15.81
PUBLISHED_REUSE_UNIQUE_SHARE = np.array(
    [0.473, 0.152, 0.139, 0.112, 0.072, 0.032, 0.011, 0.005, 0.002, 0.001, 0, 0, 0, 0, 0, 0, 0])
PUBLISHED_REUSE_LOOKUP_SHARE = np.array(
    [0.069, 0.044, 0.068, 0.101, 0.121, 0.104, 0.073, 0.058, 0.052, 0.050, 0.049, 0.048, 0.048,
     0.043, 0.031, 0.023, 0.019])


# ----------------------------------------------------------------------------- raw format

def load_raw(path: str | Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Load and validate a raw `(indices, offsets, lengths)` file (`.pt` or `.pt.gz`)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--data file not found: {path} (download fbgemm_t856_bs65536.pt or use --synthetic)")
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            obj = torch.load(f, weights_only=True, map_location="cpu")
    except Exception as e:
        raise UserError(f"{path} is not a torch.save'd DLRM dataset ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    return validate_raw(obj, path)


def validate_raw(obj: Any, path: str | Path = "<data>") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check the raw tuple's shapes and consistency; name the first bad table."""
    if not (isinstance(obj, (tuple, list)) and len(obj) == 3 and all(isinstance(x, torch.Tensor) for x in obj)):
        raise UserError(f"{path}: expected a tuple (indices, offsets, lengths) of three tensors, "
                        f"got {type(obj).__name__}; pass a DLRM dataset file such as fbgemm_t856_bs65536.pt")
    indices, offsets, lengths = (x.to(torch.int64) for x in obj)
    if lengths.dim() != 2:
        raise UserError(f"{path}: lengths must have shape [T, B], got {tuple(lengths.shape)}")
    T, B = lengths.shape
    if indices.dim() != 1 or offsets.dim() != 1 or offsets.numel() != T * B + 1:
        raise UserError(f"{path}: offsets must be 1-D of length T*B+1 = {T * B + 1} and indices 1-D, "
                        f"got offsets {tuple(offsets.shape)}, indices {tuple(indices.shape)}")
    bad = (offsets[1:] - offsets[:-1]) != lengths.reshape(-1)
    if int(offsets[0]) != 0 or bool(bad.any()):
        t = 0 if int(offsets[0]) != 0 else int(torch.nonzero(bad)[0]) // B
        raise UserError(f"{path}: offsets are inconsistent with lengths in table {t}; "
                        "offsets must be the prefix sums of lengths, table by table")
    if int(offsets[-1]) != indices.numel():
        raise UserError(f"{path}: offsets end at {int(offsets[-1])} but there are {indices.numel()} indices")
    if indices.numel() and int(indices.min()) < 0:
        first = int(torch.nonzero(indices < 0)[0])
        t = int(torch.searchsorted(offsets, torch.tensor([first]), right=True)[0] - 1) // B
        raise UserError(f"{path}: negative ids in table {t}; ids must be row numbers >= 0")
    return indices, offsets, lengths


def save_raw(path: str | Path, indices: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor) -> Path:
    """Write a raw dataset in the public format (gzip-compressed if the name ends in .gz)."""
    path = Path(path)
    obj = (indices, offsets, lengths)
    if path.suffix == ".gz":
        import io

        buf = io.BytesIO()
        torch.save(obj, buf)
        from .artifacts import atomic_write_bytes

        return atomic_write_bytes(path, gzip.compress(buf.getvalue(), compresslevel=1))
    return atomic_torch_save(path, obj)


# ----------------------------------------------------------------------------- synthesis

@dataclass(frozen=True)
class SyntheticConfig:
    """Generative model of a DLRM-like dataset (documented in the README)."""

    num_tables: int = 856
    batch_size: int = 4096
    seed: int = 0
    row_scale: float = 1.0          # multiplies every table's row count (small machines)
    min_rows: float = 1e2
    max_rows: float = 4e7           # rows log-uniform in [min_rows, max_rows]
    mean_pooling: float = PUBLISHED_MEAN_POOLING
    low_pooling_share: float = 0.15  # share of tables with pooling factor in [0, 1]
    pooling_sigma: float = 1.0      # lognormal spread of the other tables' pooling factors
    max_pooling: float = 200.0
    length_shape: float = 1.5       # gamma shape of the per-sample lookup rate (over-dispersion)


def _count_sampler(rng: np.random.Generator):
    """Per-id access counts whose histogram matches the published reuse histogram.

    A bin j is chosen with probability proportional to (share of lookups in j) / (mean count in j),
    i.e. the published share of unique ids, including the tail bins that round to 0 in the unique
    histogram but carry ~25% of lookups; then a count within the bin, log-uniform.
    """
    lo = np.array([1.0, 2.0] + [2.0 ** (j - 1) for j in range(2, NUM_BINS)])  # exclusive lower bound (bins>=2)
    span = np.ones(NUM_BINS)
    span[-1] = 3.0  # bin 16: (2^15, 2^18]
    mean = np.where(np.arange(NUM_BINS) < 2, lo, lo * (2.0 ** span - 1) / (span * math.log(2)) + 0.5)
    p = PUBLISHED_REUSE_LOOKUP_SHARE / mean
    p = p / p.sum()

    def sample(n: int) -> np.ndarray:
        j = rng.choice(NUM_BINS, size=n, p=p)
        u = rng.random(n) * span[j]
        c = np.ceil(lo[j] * 2.0 ** u)
        c = np.where(j < 2, lo[j], np.maximum(c, lo[j] + 1))
        return c.astype(np.int64)

    return sample, float((p * mean).sum())


def generate_synthetic_raw(cfg: SyntheticConfig, progress: bool = True):
    """Generate `(indices, offsets, lengths)` following `cfg` (deterministic for a seed)."""
    if cfg.num_tables < 1 or cfg.batch_size < 1:
        raise UserError("--num_tables and --batch_size must be positive")
    if not cfg.row_scale > 0:
        raise UserError("--row_scale must be > 0")
    rng = np.random.default_rng(cfg.seed)
    T, B = cfg.num_tables, cfg.batch_size
    log_rows = rng.uniform(math.log(cfg.min_rows), math.log(cfg.max_rows), T)
    rows = np.maximum(1, np.round(np.exp(log_rows) * cfg.row_scale)).astype(np.int64)

    low = rng.random(T) < cfg.low_pooling_share
    pf = np.where(low, rng.uniform(0.0, 1.0, T), rng.lognormal(0.0, cfg.pooling_sigma, T))
    for _ in range(20):  # rescale the heavy tables so the mean matches, respecting the cap
        high_mean_needed = (cfg.mean_pooling * T - pf[low].sum()) / max(1, (~low).sum())
        pf[~low] *= high_mean_needed / pf[~low].mean()
        pf = np.minimum(pf, cfg.max_pooling)
    rate = pf[:, None] * rng.gamma(cfg.length_shape, 1.0 / cfg.length_shape, (T, B))
    lengths = rng.poisson(rate).astype(np.int64)

    sample_counts, mean_count = _count_sampler(rng)
    ids = []
    for t in tqdm(range(T), desc="generate tables", disable=not progress, leave=False):
        L = int(lengths[t].sum())
        counts = np.empty(0, dtype=np.int64)
        while counts.sum() < L:
            counts = np.concatenate([counts, sample_counts(int(L / mean_count * 1.2) + 16)])
        cum = np.cumsum(counts)
        n = int(np.searchsorted(cum, L)) + 1 if L else 0
        counts = counts[:n]
        if n:
            counts[-1] -= cum[n - 1] - L
        # Distinct rows while the table has room; beyond that, extra ids collide (merge) like hashing does.
        R = int(rows[t])
        if n <= R:
            id_rows = rng.choice(R, n, replace=False)
        else:
            id_rows = np.concatenate([rng.permutation(R), rng.integers(0, R, n - R)])
        table_ids = np.repeat(id_rows, counts)
        rng.shuffle(table_ids)
        ids.append(table_ids)
    indices = torch.from_numpy(np.concatenate(ids) if ids else np.empty(0, np.int64))
    lengths_t = torch.from_numpy(lengths)
    offsets = torch.zeros(T * B + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths_t.reshape(-1), 0)
    return indices, offsets, lengths_t


# ----------------------------------------------------------------------------- processing

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
    # indices.pt first, tables.pkl last: a folder with tables.pkl is complete.
    atomic_torch_save(out_dir / "indices.pt", {"indices": indices.contiguous(), "offsets": offsets.contiguous()})
    atomic_write_pickle(out_dir / "tables.pkl", meta)
    return DLRMDataset.load(out_dir)


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
        if not (path / "tables.pkl").is_file() or not (path / "indices.pt").is_file():
            raise UserError(f"{path} is not a processed DLRM dataset (no tables.pkl / indices.pt); "
                            "run tools/gen_dlrm_data.py first")
        meta = load_pickle(path / "tables.pkl", "processed dataset")
        if not isinstance(meta, dict) or meta.get("kind") != DATASET_KIND:
            raise UserError(f"{path}/tables.pkl is not a neuroshard dataset; rerun tools/gen_dlrm_data.py")
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
            self._bags = torch.load(self.path / "indices.pt", weights_only=True, mmap=True)
        return self._bags

    def table_bags(self, t: int, batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Table t's ids and bag offsets (starting at 0) for the first `batch_size` samples."""
        B = self.batch_size
        b = B if batch_size is None else int(batch_size)
        if not 1 <= b <= B:
            raise UserError(f"--batch_size {b} is larger than the dataset's batch of {B}; use at most {B}")
        bags = self.bags()
        off = bags["offsets"][t * B: t * B + b + 1]
        ids = bags["indices"][int(off[0]): int(off[-1])].clone()
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
