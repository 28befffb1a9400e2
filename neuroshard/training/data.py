"""Training data for hybrid-parallel DLRM training (DESIGN.md §5, §7).

A `CTRData` holds dense features [n, d], one multi-hot sparse feature per embedding table (CSR:
`ids[t]`, `offsets[t]` of length n + 1) and binary labels, split into a fixed train and test part.

- MovieLens-100K, read from the files that ship inside the `recbole` wheel (found with
  `importlib.util.find_spec`, never imported). Label: rating >= 4. Sparse features: user id, item id,
  age bucket, gender, occupation, zip prefix (first 2 characters), genres (multi-hot), release
  year. Each file is checked line by line (`_read_tsv`): damaged, cut, header-only or garbage files,
  unknown users and non-numeric or NaN ratings are refused with one line naming the file and line.
  Dense features: log(1 + user's train ratings), log(1 + item's train ratings), age / 100,
  (release year - 1900) / 100, each from the training part only. Split: time-ordered, the first 80%
  of ratings by timestamp train, the last 20% test (ties by file order).
- Synthetic: tables with Zipf-like ids and Poisson pooling, Gaussian dense features, and labels
  drawn from a fixed random teacher DLRM (same architecture, its own seed), so the problem is
  learnable and large enough to make communication matter.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.errors import UserError
from .dlrm import DenseArch

ML_FILES = ("ml-100k.inter", "ml-100k.user", "ml-100k.item")
ML_TABLES = ["user_id", "item_id", "age_bucket", "gender", "occupation", "zip_prefix", "genres", "release_year"]


@dataclass
class CTRData:
    name: str
    table_names: list[str]
    num_rows: list[int]
    dense: torch.Tensor               # [n, d] float32
    ids: list[torch.Tensor]           # per table, int64 ids of all samples
    offsets: list[torch.Tensor]       # per table, [n + 1]
    labels: torch.Tensor              # [n] float32 in {0, 1}
    num_train: int

    @property
    def num_samples(self) -> int:
        return len(self.labels)

    def check_batch(self, batch_size: int) -> int:
        """`batch_size` if the training part holds that many samples, else one line with the limit."""
        if batch_size > self.num_train:
            raise UserError(f"--batch_size {batch_size} is more than the {self.num_train:,} training samples of "
                            f"{self.name}; pass --batch_size {self.num_train} or less")
        return batch_size

    def batch(self, idx: torch.Tensor, tables=None):
        """Dense [b, d], per table (ids, bag offsets) and labels of samples `idx`."""
        sparse = []
        for t in (range(len(self.ids)) if tables is None else tables):
            off = self.offsets[t]
            lo, hi = off[idx], off[idx + 1]
            lens = hi - lo
            bag = torch.zeros(len(idx), dtype=torch.int64)
            bag[1:] = torch.cumsum(lens, 0)[:-1]
            pos = torch.repeat_interleave(lo - bag, lens) + torch.arange(int(lens.sum()))
            sparse.append((self.ids[t][pos], bag))
        return self.dense[idx], sparse, self.labels[idx]

    def table_stats(self):
        """(rows, pooling factors, per-table (ids, lengths)) over the training part, for sharding."""
        out = []
        for t in range(len(self.ids)):
            off = self.offsets[t][: self.num_train + 1]
            out.append((self.ids[t][: int(off[-1])].numpy(), (off[1:] - off[:-1]).numpy()))
        return out


def _csr(lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lens = torch.tensor([len(x) for x in lists], dtype=torch.int64)
    off = torch.zeros(len(lists) + 1, dtype=torch.int64)
    off[1:] = torch.cumsum(lens, 0)
    return torch.tensor([i for x in lists for i in x], dtype=torch.int64), off


def movielens_dir() -> Path:
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("MovieLens-100K ships in the recbole wheel, which is not installed; "
                        "pip install --no-deps recbole (make setup does this)")
    d = Path(list(spec.submodule_search_locations)[0]) / "dataset_example" / "ml-100k"
    if not all((d / f).is_file() for f in ML_FILES):
        raise UserError(f"{d} lacks the MovieLens-100K files ({', '.join(ML_FILES)}); reinstall recbole")
    return d


MAX_ML_FILE_BYTES = 512 << 20
ML_FIX = "reinstall recbole (pip install --force-reinstall --no-deps recbole) or pass intact files"


def _read_tsv(path: Path, required: tuple[str, ...]) -> tuple[dict[str, int], list[tuple[int, list[str]]]]:
    """(column -> position, [(line number, fields)]) of a RecBole atomic file; every damage is one line
    naming the file and the line: not UTF-8, no header, a missing column, a cut last line, a wrong
    number of fields."""
    fix = ML_FIX
    if not path.is_file():
        raise UserError(f"MovieLens file not found: {path}; {fix}")
    if path.stat().st_size > MAX_ML_FILE_BYTES:
        raise UserError(f"{path}: {path.stat().st_size:,} bytes is not a MovieLens-100K file; {fix}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UserError(f"{path} line {line}: not UTF-8 text (byte "
                        f"0x{data[e.start]:02x}); {fix}") from None
    if not text.strip():
        raise UserError(f"{path} is empty; {fix}")
    if not text.endswith("\n"):
        raise UserError(f"{path} line {text.count(chr(10)) + 1}: the last line is cut (no line end), so the file was "
                        f"not written to the end; {fix}")
    lines = text.split("\n")[:-1]
    header = [h.split(":")[0].strip() for h in lines[0].split("\t")]
    missing = [c for c in required if c not in header]
    if missing:
        raise UserError(f"{path} line 1: the header lacks column {missing[0]!r} (it names "
                        f"{', '.join(map(repr, header[:6]))[:120]}); {fix}")
    rows = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise UserError(f"{path} line {n}: {len(fields)} tab-separated fields, the header names {len(header)}; "
                            f"{fix}")
        rows.append((n, fields))
    if not rows:
        raise UserError(f"{path} holds a header but no data lines; {fix}")
    return {k: i for i, k in enumerate(header)}, rows


def _ml_number(path: Path, n: int, what: str, text: str, lo: float, hi: float) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not (lo <= x <= hi):  # also NaN
        raise UserError(f"{path} line {n}: {what} must be a number from {lo:g} to {hi:g}, got {text[:40]!r}; {ML_FIX}")
    return x


def _vocab(values) -> dict:
    return {v: i for i, v in enumerate(sorted(set(values)))}


def load_movielens(train_share: float = 0.8, data_dir: str | Path | None = None) -> CTRData:
    d = Path(data_dir) if data_dir is not None else movielens_dir()
    col, rows = _read_tsv(d / "ml-100k.inter", ("user_id", "item_id", "rating", "timestamp"))
    cu, users = _read_tsv(d / "ml-100k.user", ("user_id", "age", "gender", "occupation", "zip_code"))
    user = {}
    for n, r in users:
        if r[cu["user_id"]] in user:
            raise UserError(f"{d / 'ml-100k.user'} line {n}: user_id {r[cu['user_id']]!r} appears twice; {ML_FIX}")
        _ml_number(d / "ml-100k.user", n, "age", r[cu["age"]], 0, 150)
        if not r[cu["age"]].strip().isdigit():
            raise UserError(f"{d / 'ml-100k.user'} line {n}: age must be a whole number, got {r[cu['age']][:40]!r}; "
                            f"{ML_FIX}")
        user[r[cu["user_id"]]] = r
    inter = []
    for n, r in rows:
        u = r[col["user_id"]]
        if u not in user:
            raise UserError(f"{d / 'ml-100k.inter'} line {n}: unknown user_id {u[:40]!r} (not in ml-100k.user); "
                            f"{ML_FIX}")
        inter.append((u, r[col["item_id"]], _ml_number(d / "ml-100k.inter", n, "rating", r[col["rating"]], 0, 5),
                      _ml_number(d / "ml-100k.inter", n, "timestamp", r[col["timestamp"]], 0, 1e12)))
    order = sorted(range(len(inter)), key=lambda i: (inter[i][3], i))  # time-ordered, ties by file order
    inter = [inter[i] for i in order]
    n_train = int(len(inter) * train_share)
    ci, items = _read_tsv(d / "ml-100k.item", ("item_id", "release_year", "class"))
    item = {r[ci["item_id"]]: r for _, r in items}

    def age(u):
        return int(user[u][cu["age"]])

    def year(i):
        y = item[i][ci["release_year"]] if i in item else ""
        return int(y) if y.strip().isdigit() else 0

    def genres(i):
        return item[i][ci["class"]].split() if i in item else []

    buckets = [0, 18, 25, 35, 45, 50, 56]
    feats = {
        "user_id": [u for u, _, _, _ in inter],
        "item_id": [i for _, i, _, _ in inter],
        "age_bucket": [sum(age(u) >= b for b in buckets) for u, _, _, _ in inter],
        "gender": [user[u][cu["gender"]] for u, _, _, _ in inter],
        "occupation": [user[u][cu["occupation"]] for u, _, _, _ in inter],
        "zip_prefix": [user[u][cu["zip_code"]][:2] for u, _, _, _ in inter],
        "release_year": [year(i) for _, i, _, _ in inter],
    }
    ids, offsets, num_rows = [], [], []
    for name in ML_TABLES:
        if name == "genres":
            lists = [genres(i) for _, i, _, _ in inter]
            vocab = _vocab(g for gl in lists for g in gl)
            t_ids, t_off = _csr([[vocab[g] for g in gl] for gl in lists])
        else:
            vocab = _vocab(feats[name])
            t_ids, t_off = _csr([[vocab[v]] for v in feats[name]])
        ids.append(t_ids)
        offsets.append(t_off)
        num_rows.append(len(vocab))
    train_user = np.bincount(ids[0][:n_train].numpy(), minlength=num_rows[0])
    train_item = np.bincount(ids[1][:n_train].numpy(), minlength=num_rows[1])
    dense = np.stack([np.log1p(train_user[ids[0].numpy()]), np.log1p(train_item[ids[1].numpy()]),
                      np.array([age(u) for u, _, _, _ in inter]) / 100.0,
                      (np.array([year(i) or 1990 for _, i, _, _ in inter]) - 1900) / 100.0], axis=1)
    labels = torch.tensor([1.0 if r >= 4 else 0.0 for _, _, r, _ in inter])
    return CTRData("movielens", ML_TABLES, num_rows, torch.tensor(dense, dtype=torch.float32), ids, offsets, labels,
                   n_train)


SYNTHETIC_MEAN_POOLING = 4.5          # pooling factors uniform in [1, 8]
SYNTHETIC_MAX_LOOKUPS = 200_000_000    # ids the synthetic training data may hold (~16 B each while made)


def make_synthetic(num_samples: int = 200_000, num_tables: int = 8, dense_dim: int = 13, emb_dim: int = 16,
                   seed: int = 0, teacher_seed: int = 1234, test_share: float = 0.1,
                   max_rows: int = 200_000) -> CTRData:
    """Synthetic CTR data whose labels come from a fixed random teacher DLRM (rows log-uniform in
    [min(1000, max_rows), max_rows], Zipf ids, Poisson pooling): label ~ Bernoulli(sigmoid(2 * the
    standardised teacher logit)). The teacher (`synthetic_teacher`: dim 16, bottom 32, top 32, its
    own seed) feeds its top MLP the dot products of its pooled embeddings, so the labels depend on the
    table-table interactions (measured by benchmarks/synthetic_interactions.py)."""
    expected = num_samples * num_tables * SYNTHETIC_MEAN_POOLING
    if expected > SYNTHETIC_MAX_LOOKUPS:
        fits = int(SYNTHETIC_MAX_LOOKUPS // (num_tables * SYNTHETIC_MEAN_POOLING))
        raise UserError(f"--num_samples {num_samples:,} would synthesise about {expected / 1e6:,.0f} M ids ({num_tables} "
                        f"tables x {SYNTHETIC_MEAN_POOLING:g} per sample, ~{expected * 16 / 2**30:,.1f} GB), more than "
                        f"the budget of {SYNTHETIC_MAX_LOOKUPS / 1e6:g} M; pass --num_samples {fits:,} or fewer")
    rng = np.random.default_rng(seed)
    lo = min(1e3, max_rows)
    rows = np.round(np.exp(rng.uniform(np.log(lo), np.log(max_rows), num_tables))).astype(int)
    pf = rng.uniform(1, 8, num_tables)
    ids, offsets = [], []
    for t in range(num_tables):
        lens = np.maximum(rng.poisson(pf[t], num_samples), 1)
        ranks = rng.zipf(1.2, int(lens.sum())) - 1
        perm = rng.permutation(rows[t])
        ids.append(torch.from_numpy(perm[ranks % rows[t]].astype(np.int64)))
        off = np.zeros(num_samples + 1, dtype=np.int64)
        off[1:] = np.cumsum(lens)
        offsets.append(torch.from_numpy(off))
    dense = torch.from_numpy(rng.standard_normal((num_samples, dense_dim)).astype(np.float32))
    teacher, teacher_tables = synthetic_teacher([int(r) for r in rows], dense_dim, emb_dim, teacher_seed)
    names = [f"t{t}" for t in range(num_tables)]
    data = CTRData("synthetic", names, [int(r) for r in rows], dense, ids, offsets,
                   torch.zeros(num_samples), int(num_samples * (1 - test_share)))
    logit = teacher_logits(data, teacher, teacher_tables)
    logit = (logit - logit.mean()) / (logit.std() + 1e-6) * 2.0
    data.labels = torch.bernoulli(torch.sigmoid(logit), generator=torch.Generator().manual_seed(seed)).float()
    return data


def synthetic_teacher(rows: list[int], dense_dim: int, emb_dim: int = 16, teacher_seed: int = 1234):
    """The synthetic data's fixed random teacher: a DLRM (bottom 32, top 32, dim `emb_dim`) and its
    tables (N(0, 0.25) entries)."""
    g = torch.Generator().manual_seed(teacher_seed)
    tables = [torch.randn(int(r), emb_dim, generator=g) * 0.5 for r in rows]
    torch.manual_seed(teacher_seed)
    return DenseArch(dense_dim, len(rows), emb_dim, bottom=(32,), top=(32,)), tables


@torch.no_grad()
def teacher_logits(data: CTRData, teacher, tables, table_dots: torch.Tensor | None = None) -> torch.Tensor:
    """The teacher's logit of every sample (before the labels' standardisation). `table_dots` (one value per
    table-table pair, in the interaction's order) replaces every sample's table-table dot products: the
    teacher with its table-table interaction taken out (benchmarks/synthetic_interactions.py)."""
    out = []
    for start in range(0, data.num_samples, 8192):
        idx = torch.arange(start, min(data.num_samples, start + 8192))
        x, sparse, _ = data.batch(idx)
        emb = torch.stack([torch.nn.functional.embedding_bag(i, w, o, mode="sum")
                           for (i, o), w in zip(sparse, tables)], dim=1)
        if table_dots is None:
            out.append(teacher(x, emb))
            continue
        z = teacher.bottom(x)
        feats = torch.cat([z.unsqueeze(1), emb], dim=1)
        dots = torch.bmm(feats, feats.transpose(1, 2))[:, teacher.triu[0], teacher.triu[1]]
        tt = teacher.triu[0] > 0  # pairs of two tables (feature 0 is the bottom MLP's output)
        dots[:, tt] = table_dots.to(dots.dtype)
        out.append(teacher.top(torch.cat([z, dots], dim=1)).squeeze(-1))
    return torch.cat(out)


def load_data(name: str, seed: int = 0, num_samples: int | None = None, max_rows: int | None = None,
              data_dir: str | Path | None = None) -> CTRData:
    if name == "movielens":
        return load_movielens(data_dir=data_dir)
    if name == "synthetic":
        return make_synthetic(num_samples or 200_000, seed=seed, max_rows=max_rows or 200_000)
    raise UserError(f"--dataset must be movielens or synthetic, got {name!r}")
