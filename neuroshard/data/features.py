"""Per-table features (DESIGN.md §2.2) and table sizes.

The feature vector of a table has 20 numbers in this order (`FEATURE_NAMES`):

    dim, row, pooling_factor, bin_0, ..., bin_16

- `row` = max(100, max id + 1) (1 for a table without lookups, then raised to 100);
- `pooling_factor` = mean number of lookups per sample;
- `bin_j` = share of the table's unique ids accessed c times with c in (2^(j-1), 2^j]
  (bin_0 is c == 1), `bin_16` the share with c > 2^15; all zeros without lookups;
- `dim` is assigned by a task, not by the data.

The dataset stores the 19 data features (`DATA_FEATURE_NAMES`); `with_dim` prepends dims.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import UserError, check_int

NUM_BINS = 17
DATA_FEATURE_NAMES = ["row", "pooling_factor"] + [f"bin_{j}" for j in range(NUM_BINS)]
FEATURE_NAMES = ["dim"] + DATA_FEATURE_NAMES
NUM_FEATURES = len(FEATURE_NAMES)  # 20
MIN_ROWS = 100
DIM_CHOICES = (128, 64, 32, 16, 8, 4)
BYTES_PER_PARAM = 4  # fp32
WORDS_PER_ID = 2        # an int64 id on the wire, in 4-byte words (the comm models' unit: one float per dim)
WORDS_PER_LENGTH = 2    # an int64 length per sample and shard


def input_words(pooling) -> np.ndarray:
    """Words per sample of one shard's input distribution (TorchRec's ids and lengths all-to-all): its ids and
    its length."""
    return WORDS_PER_ID * np.asarray(pooling, np.float64) + WORDS_PER_LENGTH


def reuse_bin(counts: np.ndarray) -> np.ndarray:
    """Bin index of each access count: 0 for 1, j for (2^(j-1), 2^j], 16 for > 2^15."""
    counts = np.asarray(counts, dtype=np.int64)
    # ceil(log2(c)) for c >= 1, computed exactly on integers: bit length of (c - 1).
    j = np.zeros(counts.shape, dtype=np.int64)
    c = counts - 1
    while np.any(c > 0):
        j += c > 0
        c = c >> 1
    return np.minimum(j, NUM_BINS - 1)


def reuse_histogram(counts: np.ndarray) -> np.ndarray:
    """Share of unique ids per reuse bin, from the per-id access counts (zeros if empty)."""
    counts = np.asarray(counts)
    if counts.size == 0:
        return np.zeros(NUM_BINS)
    return np.bincount(reuse_bin(counts), minlength=NUM_BINS) / counts.size


def ids_reuse_histogram(indices) -> np.ndarray:
    """The reuse histogram of a sample of ids (`reuse_histogram` of each unique id's count; zeros if empty)."""
    return reuse_histogram(np.unique(np.asarray(indices), return_counts=True)[1])


def table_data_features(indices: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The 19 data features of one table from its ids and per-sample lengths."""
    indices = np.asarray(indices)
    lengths = np.asarray(lengths)
    if indices.size == 0:
        row, hist = 1, np.zeros(NUM_BINS)
    else:
        row, hist = int(indices.max()) + 1, ids_reuse_histogram(indices)
    pooling_factor = float(lengths.mean()) if lengths.size else 0.0
    return np.concatenate([[max(MIN_ROWS, row), pooling_factor], hist]).astype(np.float64)


def with_dim(data_features: np.ndarray, dims) -> np.ndarray:
    """Full 20-number feature vectors: dims prepended to data features ([T, 19] -> [T, 20])."""
    data_features = np.atleast_2d(np.asarray(data_features, dtype=np.float64))
    dims = np.asarray(dims, dtype=np.float64).reshape(-1, 1)
    return np.concatenate([dims, data_features], axis=1)


def can_split(dim: int) -> bool:
    """A shard may be split when half its dim is still divisible by 4."""
    return dim % 8 == 0


def halvings(dim: int) -> list[int]:
    """A table's dim and every column width halving reaches, widest first."""
    out = [int(dim)]
    while can_split(out[-1]):
        out.append(out[-1] // 2)
    return out


def smallest_shard_dim(dim: int) -> int:
    """The narrowest column block halving can cut a table of `dim` into (its dim when it cannot be split)."""
    return halvings(dim)[-1]


def table_size_gb(rows, dim) -> np.ndarray | float:
    """fp32 size of an embedding table in GB (2**30 bytes)."""
    return np.asarray(rows, dtype=np.float64) * np.asarray(dim, dtype=np.float64) * BYTES_PER_PARAM / 2**30


def check_max_dim(max_dim) -> int:
    """`--max_dim` from user input: one of the dim set (DESIGN.md §2.4), else a `UserError`."""
    if check_int("--max_dim", max_dim, 4, 128) not in DIM_CHOICES:
        raise UserError(f"--max_dim must be one of {', '.join(map(str, sorted(DIM_CHOICES)))}, got {max_dim}")
    return int(max_dim)


def dim_choices(max_dim: int) -> list[int]:
    """Dims a task may assign: start at max_dim, halve while divisible by 4 (DESIGN.md §2.4)."""
    dims, d = [], int(max_dim)
    if d < 4 or d % 4:
        raise ValueError(f"max_dim must be a positive multiple of 4, got {max_dim}")
    while d % 4 == 0:
        dims.append(d)
        d //= 2
    return dims
