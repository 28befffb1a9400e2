"""Compute-model accuracy per table family and leave-one-family-out (DESIGN.md §8). Run by hand:

    python benchmarks/families.py [--data_dir data/cost_data] [--dataset_dir data/dlrm_datasets] [--epochs 300]
                                  [--input_transform raw|log] [--salvage]

Reads a compute-cost file collected with `--families_dir` (the family mix), then
1. trains the compute model on all samples (80/10/10 split, seed 0) and reports test MSE, MAPE, R²
   and Spearman per sample family (the test split's samples of each family; `per_family_metrics`);
2. for every family, trains a fresh model on every other family's samples (the usual 80/10/10 split of those)
   and tests it on all of its samples (LOFO, `leave_one_family_out`): how well the model does on tables it
   has never seen the like of;
3. with `--repeat_dir`, a second collection made with the same settings into another folder (the
   collector draws sample i from (seed, i), so it measures the same shards again): per family, the
   Spearman between the two collections' costs of the same shards, how well any model could rank them.
Writes results/families.csv and results/families.md (the README table).
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.artifacts import write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import flag  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from neuroshard.core.file_names import COST_DATA_DIR, DATASET_DIR, RESULTS_DIR, compute_data_path  # noqa: E402
from neuroshard.core.tables import format_table  # noqa: E402
from neuroshard.data.dataset import DLRMDataset  # noqa: E402
from neuroshard.hardware.collect import load_cost_data  # noqa: E402
from neuroshard.hardware.compute_bench import COMPUTE_DATA_KIND, cost_data_tables  # noqa: E402
from neuroshard.models.cost_models import (INPUT_TRANSFORMS, ComputeCostModel, compute_training_arrays,  # noqa: E402
                                          model_meta)
from neuroshard.models.training_loops import regression_metrics, split_indices  # noqa: E402


def per_family_metrics(model, feats: np.ndarray, mask: np.ndarray, y: np.ndarray, families: np.ndarray,
                       idx: np.ndarray | None = None) -> dict[str, dict]:
    """{family: MSE / MAPE / R² / Spearman of `model` (+ n)} over the samples `idx` (default all)."""
    idx = np.arange(len(y)) if idx is None else np.asarray(idx)
    pred = model.predict(feats[idx], mask[idx])
    out = {}
    for fam in dict.fromkeys(families[idx]):
        sel = families[idx] == fam
        if sel.sum() >= 3:
            out[str(fam)] = {**regression_metrics(pred[sel], y[idx][sel]), "n": int(sel.sum())}
    return out


def leave_one_family_out(feats: np.ndarray, mask: np.ndarray, y: np.ndarray, families: np.ndarray, epochs: int,
                         meta: dict | None = None, seed: int = 0, progress: bool = False,
                         only: list[str] | None = None) -> dict[str, dict]:
    """{family: metrics of a model trained without that family, on all of its samples}."""
    out = {}
    for fam in only or list(dict.fromkeys(families)):
        held = families == fam
        model = ComputeCostModel(dict(meta or {}))
        model.fit((feats[~held], mask[~held]), y[~held], epochs=epochs, seed=seed, progress=progress)
        pred = model.predict(feats[held], mask[held])
        out[str(fam)] = {**regression_metrics(pred, y[held]), "n": int(held.sum())}
    return out


def repeat_spearman(samples, repeat, fams) -> dict:
    """Per family (and "all"), Spearman between the costs of the same shards in two collections."""
    again = {s["index"]: s for s in repeat}
    pairs: dict[str, list[tuple[float, float]]] = {}
    for s, fam in zip(samples, fams):
        r = again.get(s["index"])
        if r is None:
            continue
        if r.get("family", "dataset") != fam or not np.array_equal(r["table_ids"], s["table_ids"]) \
                or not np.array_equal(r["dims"], s["dims"]):
            raise UserError(f"--repeat_dir sample {s['index']} is another shard than --data_dir's: collect the repeat "
                            "with the same settings (seed, mix, --max_mem, tables)")
        for key in (fam, "all"):
            pairs.setdefault(key, []).append((s["cost_ms"], r["cost_ms"]))
    return {k: float(spearmanr(*np.array(v).T)[0]) for k, v in pairs.items() if len(v) >= 3}


@dataclass
class FamiliesConfig:
    """Compute-model accuracy per table family and leave-one-family-out (benchmarks/families.py)."""

    data_dir: str = flag(COST_DATA_DIR)
    dataset_dir: str = flag(DATASET_DIR)
    epochs: int = flag(300)
    num_samples: int | None = flag(None, "use the first N samples (default all)")
    repeat_dir: str | None = flag(None, "a second collection of the same shards (compute_cost_data.pkl)")
    input_transform: str = flag("raw", "compute-model inputs: raw (the paper's) or log (log rows and pooling)",
                                choices=INPUT_TRANSFORMS)
    out_dir: str = flag(RESULTS_DIR)
    salvage: bool = flag(False, "keep the good records of a damaged cost-data file (the damaged ones are dropped)")

    def check(self) -> "FamiliesConfig":
        check_int("--epochs", self.epochs, 1, 1_000_000)
        if self.num_samples is not None:
            check_int("--num_samples", self.num_samples, 1)
        return self


def main(argv=None) -> None:
    a = config_from_args(FamiliesConfig, step_parser(FamiliesConfig, __doc__, raw_doc=True).parse_args(argv)).check()
    meta, samples = load_cost_data(compute_data_path(a.data_dir), COMPUTE_DATA_KIND, a.salvage)
    samples = samples[:a.num_samples] if a.num_samples else samples
    fams = np.array([s.get("family", "dataset") for s in samples])
    repeat = {}
    if a.repeat_dir:
        repeat = repeat_spearman(samples, load_cost_data(compute_data_path(a.repeat_dir),
                                                         COMPUTE_DATA_KIND, a.salvage)[1], fams)
        if not repeat:
            raise UserError(f"--repeat_dir {a.repeat_dir} shares fewer than 3 samples with --data_dir")
    tables = cost_data_tables(meta, DLRMDataset.load(a.dataset_dir))
    feats, mask, y = compute_training_arrays(samples, tables.features)
    print(f"{len(samples)} samples: " + ", ".join(f"{f} {int((fams == f).sum())}" for f in dict.fromkeys(fams)))

    model_info = {**model_meta(meta), "input_transform": a.input_transform}
    model = ComputeCostModel(dict(model_info))
    model.fit((feats, mask), y, epochs=a.epochs, progress=False)
    _, _, test = split_indices(len(y), 0.8, 0.1, 0)
    per = per_family_metrics(model, feats, mask, y, fams, test)
    per["all"] = {**model.meta["metrics"], "n": len(test)}
    print("trained on all families; test split per family:")
    lofo = leave_one_family_out(feats, mask, y, fams, a.epochs, model_info)
    rows = []
    for fam in [*dict.fromkeys(fams), "all"]:
        row = {"family": fam}
        for tag, src in (("test", per), ("lofo", lofo)):
            m = src.get(fam)
            if m:
                row.update({f"{tag}_n": m["n"], f"{tag}_mape": m["mape"], f"{tag}_r2": m["r2"],
                            f"{tag}_spearman": m["spearman"]})
        if fam in repeat:
            row["repeat_spearman"] = repeat[fam]
        rows.append(row)
        print(row)
    df = pd.DataFrame(rows)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    def f(r, k, pct=False):
        return "-" if pd.isna(r.get(k, np.nan)) else f"{100 * r[k]:.1f}%" if pct else f"{r[k]:.3f}"

    lines = format_table(["family", "samples", "test MAPE", "test R²", "test Spearman", "LOFO MAPE", "LOFO R²",
                          "LOFO Spearman", "repeat Spearman"],
                         [[r["family"], r.get("lofo_n", r.get("test_n", "-")), f(r, "test_mape", True), f(r, "test_r2"),
                           f(r, "test_spearman"), f(r, "lofo_mape", True), f(r, "lofo_r2"), f(r, "lofo_spearman"),
                           f(r, "repeat_spearman")] for r in rows], align="lrrrrrrrr")
    write_results(out / "families.csv", df, markdown="\n".join(lines) + "\n", **asdict(a))
    print("\n".join(lines))


if __name__ == "__main__":
    run_main(main)
