"""Table families that real table lists contain (DESIGN.md §8), for compute-cost data beyond the dataset.

The DLRM dataset has few one-hot features, few long sequence features, few tiny or device-sized
tables, and its random shards never hold many column shards of one table. `FamilyMix` is a
documented, seeded description of such tables; `build_family_tables` turns it into a processed
dataset folder in exactly the dataset's format (raw ids → the 19 features of DESIGN.md §2.2), so
the compute collector measures family shards on real ids, the same way as dataset shards.

Families (defaults, rows at full scale; `row_scale` multiplies all but `tiny`):

| family      | tables | rows                    | pooling (mean lookups/sample)      | Zipf exponent |
|-------------|-------:|-------------------------|------------------------------------|---------------|
| one_hot     | 16     | 1e3 – 4e7               | exactly 1 (every sample one id)    | 0.8 – 1.3     |
| multi_hot   | 16     | 1e3 – 1e7               | 2 – 30 (lengths uniform 1..2p-1)   | 0.6 – 1.2     |
| sequence    | 8      | 1e4 – 1e7               | 50 – 500 (lengths uniform ±50%)    | 0.4 – 1.0     |
| tiny        | 12     | 3 – 1,000 (not scaled)  | 1 – 10 (Poisson)                   | 0.0 – 1.0     |
| large       | 8      | 25–100% of a device at dim 16 | 1 – 20 (Poisson)             | 0.8 – 1.3     |

Ranges are sampled log-uniformly (pooling, rows) or uniformly (Zipf exponent) per table. Ids of
a table follow a Zipf law over a random permutation of its rows: the k-th most popular row is read
with probability ∝ k^-a. Tables are drawn from `(seed, family)`, so adding a family never changes
another's tables.

Shards of the collector (`SAMPLE_FAMILIES`, see `sample_family_shard`): `dataset` (the dataset's own
random shards, DESIGN.md §3.1), one sample family per table family (1..`max_tables` of that family's
tables, dims from `FAMILY_DIMS` = 4..256), and `many_shards` (a device holding 16..`max_shards` (64)
column shards of a few tables of any pool but `sequence`, as TorchRec's column-wise plans make). `sample_share`
gives each sample family's share of the samples.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..core.errors import UserError, check_float, check_int
from ..core.file_names import DATASET_TABLES
from ..core.costs import check_max_mem_gb
from .dataset import DLRMDataset, process_raw
from .features import table_size_gb

FAMILY_DIMS = (4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class TableFamily:
    """One family of tables: how many, and the ranges their rows, pooling and skew are drawn from."""

    name: str
    num_tables: int
    rows: tuple[float, float]        # log-uniform; full scale (see `FamilyMix.row_scale`)
    pooling: tuple[float, float]     # mean lookups per sample, log-uniform
    zipf: tuple[float, float]        # exponent a of the id popularity, uniform
    lengths: str = "poisson"         # "one_hot", "uniform" (1..2p-1), "band" (p/2..3p/2), "poisson"
    max_tables: int = 15             # at most this many tables of the family in one sample
    scale_rows: bool = True          # False: rows are absolute (tiny tables stay tiny)
    device_fraction: tuple[float, float] | None = None  # rows as a share of a device at dim 16


DEFAULT_FAMILIES = (
    TableFamily("one_hot", 16, (1e3, 4e7), (1.0, 1.0), (0.8, 1.3), "one_hot"),
    TableFamily("multi_hot", 16, (1e3, 1e7), (2.0, 30.0), (0.6, 1.2), "uniform"),
    TableFamily("sequence", 8, (1e4, 1e7), (50.0, 500.0), (0.4, 1.0), "band", max_tables=3),
    TableFamily("tiny", 12, (3.0, 1000.0), (1.0, 10.0), (0.0, 1.0), "poisson", scale_rows=False),
    TableFamily("large", 8, (0.0, 0.0), (1.0, 20.0), (0.8, 1.3), "poisson", max_tables=4,
                device_fraction=(0.25, 1.0)),
)
TABLE_FAMILIES = tuple(f.name for f in DEFAULT_FAMILIES)
SAMPLE_FAMILIES = ("dataset", *TABLE_FAMILIES, "many_shards")
DEFAULT_SHARE = {"dataset": 0.4, "one_hot": 0.1, "multi_hot": 0.1, "sequence": 0.06, "tiny": 0.1, "large": 0.08,
                 "many_shards": 0.16}


@dataclass(frozen=True)
class FamilyMix:
    """The seeded family mix: its tables (`families`) and how the collector's samples draw from them."""

    seed: int = 0
    batch_size: int = 4096
    row_scale: float = 1.0
    max_mem_gb: float = 4.0          # device size: `large` tables and every sample fit it
    families: tuple[TableFamily, ...] = DEFAULT_FAMILIES
    sample_share: dict = field(default_factory=lambda: dict(DEFAULT_SHARE))
    max_shards: int = 64             # `many_shards` samples hold 16..max_shards column shards

    def check(self) -> "FamilyMix":
        check_int("--seed", self.seed, 0)
        check_int("--batch_size", self.batch_size, 1, 1 << 20)
        check_float("--row_scale", self.row_scale, 0.0, 1e3, lo_open=True)
        check_max_mem_gb(self.max_mem_gb)
        check_int("--max_shards", self.max_shards, 16, 1024)
        unknown = set(self.sample_share) - set(SAMPLE_FAMILIES)
        if unknown or any((not math.isfinite(v)) or v < 0 for v in self.sample_share.values()) \
                or sum(self.sample_share.values()) <= 0:
            raise UserError(f"family shares must be >= 0 for {', '.join(SAMPLE_FAMILIES)} and not all 0, "
                            f"got {self.sample_share}")
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d["families"] = [asdict(f) for f in self.families]
        return d

    def fingerprint(self) -> str:
        return hashlib.sha1(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- table generation

def zipf_ids(rng: np.random.Generator, num_rows: int, num_ids: int, exponent: float) -> np.ndarray:
    """`num_ids` ids in [0, num_rows): rank k (1-based) of a random permutation drawn with p ∝ k^-exponent."""
    p = np.arange(1, num_rows + 1, dtype=np.float64) ** -float(exponent)
    cdf = np.cumsum(p)
    ranks = np.searchsorted(cdf, rng.random(num_ids) * cdf[-1], side="right")
    return rng.permutation(num_rows)[np.minimum(ranks, num_rows - 1)].astype(np.int64)


def _lengths(rng: np.random.Generator, kind: str, pooling: float, batch: int) -> np.ndarray:
    if kind == "one_hot":
        return np.ones(batch, dtype=np.int64)
    if kind == "uniform":
        hi = max(1, int(round(2 * pooling - 1)))
        return rng.integers(1, hi + 1, batch)
    if kind == "band":
        return rng.integers(max(1, int(pooling / 2)), int(1.5 * pooling) + 1, batch)
    return rng.poisson(pooling, batch).astype(np.int64)


def _log_uniform(rng, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi)))) if hi > lo else float(lo)


@dataclass
class FamilyTable:
    family: str
    rows: int
    pooling: float
    zipf: float


def family_tables(mix: FamilyMix) -> list[FamilyTable]:
    """Every table of the mix (rows, mean pooling, Zipf exponent), drawn from (seed, family index)."""
    out = []
    for fi, fam in enumerate(mix.families):
        rng = np.random.default_rng([mix.seed, fi])
        for _ in range(fam.num_tables):
            if fam.device_fraction is not None:
                full = mix.max_mem_gb * 2**30 / (4 * 16)  # a device's worth of rows at dim 16
                rows = full * rng.uniform(*fam.device_fraction)
            else:
                rows = _log_uniform(rng, *fam.rows) * (mix.row_scale if fam.scale_rows else 1.0)
            out.append(FamilyTable(fam.name, max(1, int(round(rows))), _log_uniform(rng, *fam.pooling),
                                   float(rng.uniform(*fam.zipf))))
    return out


def generate_family_raw(mix: FamilyMix, tables: list[FamilyTable] | None = None):
    """Raw `(indices, offsets, lengths)` of the mix's tables in the DLRM layout (DESIGN.md §2.1)."""
    mix.check()
    tables = family_tables(mix) if tables is None else tables
    kinds = {f.name: f.lengths for f in mix.families}
    B = mix.batch_size
    lengths = np.zeros((len(tables), B), dtype=np.int64)
    ids = []
    for t, tab in enumerate(tables):
        rng = np.random.default_rng([mix.seed, 1000 + t])
        lengths[t] = _lengths(rng, kinds[tab.family], tab.pooling, B)
        ids.append(zipf_ids(rng, tab.rows, int(lengths[t].sum()), tab.zipf))
    indices = torch.from_numpy(np.concatenate(ids) if ids else np.empty(0, np.int64))
    lengths_t = torch.from_numpy(lengths)
    offsets = torch.zeros(len(tables) * B + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths_t.reshape(-1), 0)
    return indices, offsets, lengths_t


def build_family_tables(mix: FamilyMix, out_dir: str | Path, progress: bool = True):
    """Write the mix's tables as a processed dataset folder (same format and code as step 1)."""
    out_dir = Path(out_dir)
    if (out_dir / DATASET_TABLES).is_file():
        ds = DLRMDataset.load(out_dir)
        if ds.meta["provenance"].get("family_mix_fingerprint") == mix.fingerprint():
            return ds
    tables = family_tables(mix)
    raw = generate_family_raw(mix, tables)
    source = {"source": "families", "family_mix": mix.to_dict(), "family_mix_fingerprint": mix.fingerprint(),
              "family_of_table": [t.family for t in tables]}
    return process_raw(*raw, out_dir=out_dir, source=source, progress=progress)


def family_of_tables(ds) -> list[str]:
    """Family name of every table of a folder written by `build_family_tables`."""
    fam = ds.meta.get("provenance", {}).get("family_of_table")
    if not isinstance(fam, list) or len(fam) != ds.num_tables:
        raise UserError(f"{ds.path} is not a family-table folder; build it with --families")
    return [str(f) for f in fam]


# ----------------------------------------------------------------------------- one table-id space

class TablePool:
    """Several processed datasets seen as one: table ids 0..T0-1 are the first's, then the next's.

    Has what `ComputeBenchmark` uses of a dataset (`rows`, `features`, `table_bags`, `batch_size`,
    `path`, `fingerprint`), so a shard may mix tables of every pool.
    """

    def __init__(self, datasets: list):
        if not datasets:
            raise ValueError("a table pool needs at least one dataset")
        batches = {d.batch_size for d in datasets}
        if len(batches) != 1:
            raise UserError(f"family tables and dataset have different batches ({sorted(batches)}); rebuild the "
                            "family tables with the dataset's batch")
        self.datasets = list(datasets)
        self.starts = np.cumsum([0] + [d.num_tables for d in datasets])
        self.batch_size = datasets[0].batch_size
        self.features = np.concatenate([d.features for d in datasets])
        self.path = datasets[0].path
        self.fingerprint = datasets[0].fingerprint

    @property
    def num_tables(self) -> int:
        return int(self.starts[-1])

    @property
    def rows(self) -> np.ndarray:
        return self.features[:, 0].astype(np.int64)

    def table_bags(self, t: int, batch_size: int | None = None):
        k = int(np.searchsorted(self.starts, t, side="right") - 1)
        return self.datasets[k].table_bags(int(t - self.starts[k]), batch_size)


# ----------------------------------------------------------------------------- samples of the collector

def sample_family_of(index: int, seed: int, shares: dict) -> str:
    """Which sample family sample `index` belongs to (deterministic in (seed, index))."""
    names = [n for n in SAMPLE_FAMILIES if shares.get(n, 0) > 0]
    p = np.array([shares[n] for n in names], dtype=np.float64)
    rng = np.random.default_rng([seed, index, 7])
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def sample_family_shard(family: str, index: int, seed: int, pool_rows: np.ndarray, family_ids: dict[str, np.ndarray],
                        max_mem_gb: float, max_tables: int, max_shards: int = 64, caps: dict | None = None,
                        max_tries: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """(table ids into the pool, dims) of one family sample whose size fits `max_mem_gb`.

    `family_ids[name]` lists the pool ids of each table family (and of `dataset`); `caps[name]` is
    a family's own limit on tables per sample (`TableFamily.max_tables`)."""
    rng = np.random.default_rng([seed, index, 11])
    dims_set = np.array(FAMILY_DIMS)
    # column shards of any table but the sequence family's (64 shards of a 500-lookup table would take
    # most of a collection's time)
    everyone = np.concatenate([v for k, v in family_ids.items() if k != "sequence"])
    for _ in range(max_tries):
        if family == "many_shards":
            ids, dims = [], []
            target = int(rng.integers(16, max_shards + 1))
            while len(ids) < target:
                t = int(rng.choice(everyone))
                parts = int(rng.choice([2, 4, 8, 16]))
                width = int(rng.choice([4, 8, 16, 32]))  # each column shard's width
                parts = min(parts, target - len(ids))
                ids += [t] * parts
                dims += [width] * parts
            ids, dims = np.array(ids, dtype=np.int64), np.array(dims, dtype=np.int64)
        else:
            n = int(rng.integers(1, min(max_tables, (caps or {}).get(family, max_tables)) + 1))
            ids = rng.choice(family_ids[family], n)
            dims = rng.choice(dims_set, n)
        if table_size_gb(pool_rows[ids], dims).sum() <= max_mem_gb:
            return ids.astype(np.int64), dims.astype(np.int64)
    raise UserError(f"no {family} shard fits --max_mem {max_mem_gb} GB after {max_tries} draws; raise --max_mem")
