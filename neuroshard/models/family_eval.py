"""Compute-model accuracy per table family and leave-one-family-out (DESIGN.md §8).

- `per_family_metrics`: MSE / MAPE / R² / Spearman of a model on the samples of each family.
- `leave_one_family_out`: for each family F, train a fresh model on every other family's samples
  (the usual 80/10/10 split of those) and test it on all of F's samples: how well the model does on
  tables it has never seen the like of.
"""
from __future__ import annotations

import numpy as np

from .cost_models import ComputeCostModel
from .trainer import regression_metrics


def per_family_metrics(model, feats: np.ndarray, mask: np.ndarray, y: np.ndarray, families: np.ndarray,
                       idx: np.ndarray | None = None) -> dict[str, dict]:
    """{family: metrics (+ n)} over the samples `idx` (default all)."""
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
