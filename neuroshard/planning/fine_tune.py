"""Fine-tuning pre-trained cost models on measurements of the user's tables (planning/calibrate.py).

A third of the measurements (at least `MIN_HELD_OUT`) is held out; a copy of the model is fine-tuned on the rest
(full-batch Adam on the relative error, `CostModel.fine_tune`) and kept only where its held-out error is not
worse than the pre-trained model's.
"""
from __future__ import annotations

import numpy as np

from ..data.features import with_dim
from ..models.training_loops import regression_metrics

MIN_HELD_OUT = 5


def held_out_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fine-tune, held-out) positions: a third held out, at least MIN_HELD_OUT."""
    perm = np.random.default_rng([seed, 32]).permutation(n)
    k = max(MIN_HELD_OUT, n // 3)
    return np.sort(perm[k:]), np.sort(perm[:k])



def held_out_error(pred, y) -> dict:
    m = regression_metrics(pred, y)
    return {"mape": m["mape"], "spearman": m["spearman"], "r2": m["r2"]}



def kept_report(pred_before, pred_after, y_held, tune, held) -> dict:
    """The one rule of calibration: a refitted model is kept only if its MAPE on the held-out measurements `y_held`
    is not worse than the model it would replace. The report: both held-out errors, `kept`, the sample counts."""
    before, after = held_out_error(pred_before, y_held), held_out_error(pred_after, y_held)
    return {"before": before, "after": after, "kept": after["mape"] <= before["mape"],
            "samples": {"fine_tune": int(len(tune)), "held_out": int(len(held))}}



def fine_tune_kept(model, inputs, y, tune, held, cfg, copy_of) -> tuple[object, dict]:
    """Fine-tune a copy of `model`; keep it only if its held-out MAPE is not worse. Returns (model, report)."""
    tuned = copy_of(model)
    # the loss is relative: a cost below the timer's microsecond counts as one microsecond
    tuned.fine_tune(tuple(x[tune] for x in inputs), np.maximum(y[tune], 1e-3), steps=cfg.steps, lr=cfg.lr,
                    seed=cfg.seed)
    report = kept_report(model.predict(*(x[held] for x in inputs)), tuned.predict(*(x[held] for x in inputs)),
                         y[held], tune, held)
    return (tuned if report["kept"] else model), report



def fine_tune_compute(model, task, shards, costs_ms, cfg) -> tuple[object, dict]:
    """The compute half of `calibrate`: fine-tune on two thirds of the measured shards, keep the result only if
    its MAPE on the held-out third is not worse. Returns (model, report)."""
    tune, held = held_out_split(len(shards), cfg.seed)
    return fine_tune_kept(model, compute_arrays(task.data_features, shards), np.asarray(costs_ms, dtype=np.float32),
                           tune, held, cfg, copy_model)



def copy_model(model):
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
