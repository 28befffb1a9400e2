"""Step 4: pre-train the cost models from collected cost-data files (DESIGN.md §3.3).

Both drivers check their inputs before training (sample files of the right kind, collected on the
dataset given, enough samples, valid training settings) and write the model atomically.
"""
from __future__ import annotations

from pathlib import Path

from ..core.errors import UserError, check_float, check_int
from ..data.dataset import DLRMDataset
from ..hardware.collect import load_cost_data
from ..hardware.comm_bench import COMM_DATA_KIND
from ..hardware.compute_bench import COMPUTE_DATA_KIND
from .cost_models import CommCostModel, ComputeCostModel, comm_training_arrays, compute_training_arrays, model_meta

MIN_SAMPLES = 10


def check_training_args(epochs: int, batch_size: int, lr: float, train_ratio: float, valid_ratio: float,
                        seed: int, num_samples: int | None) -> None:
    check_int("--epochs", epochs, 1, 1_000_000)
    check_int("--batch_size", batch_size, 1, 1 << 24)
    check_float("--lr", lr, 0.0, 10.0, lo_open=True)
    check_float("--train_ratio", train_ratio, 0.0, 1.0, lo_open=True, hi_open=True)
    check_float("--valid_ratio", valid_ratio, 0.0, 1.0, lo_open=True, hi_open=True)
    if train_ratio + valid_ratio >= 1:
        raise UserError("--train_ratio + --valid_ratio must be < 1 (the rest is the test split)")
    check_int("--seed", seed, 0)
    if num_samples is not None:
        check_int("--num_samples", num_samples, MIN_SAMPLES)


def _samples(path, kind: str, num_samples: int | None) -> tuple[dict, list[dict]]:
    meta, samples = load_cost_data(path, kind)
    samples = samples[:num_samples] if num_samples else samples
    if len(samples) < MIN_SAMPLES:
        raise UserError(f"{path} holds {len(samples)} samples; at least {MIN_SAMPLES} are needed to train "
                        "(collect more with --data_size)")
    return meta, samples


def _print_metrics(name: str, report: dict) -> None:
    m = report["test"]
    n = report["num_samples"]
    print(f"{name}: test MSE {m['mse']:.4g}  MAPE {100 * m['mape']:.2f}%  R² {m['r2']:.4f}  Spearman {m['spearman']:.4f}"
          f"  (train/valid/test {n['train']}/{n['valid']}/{n['test']}, best valid MSE {report['best_valid_mse']:.4g})")


def train_compute_model(data_path, dataset_dir, out_path, epochs: int = 300, num_samples: int | None = None,
                        batch_size: int = 512, lr: float = 1e-3, train_ratio: float = 0.8, valid_ratio: float = 0.1,
                        seed: int = 0) -> ComputeCostModel:
    check_training_args(epochs, batch_size, lr, train_ratio, valid_ratio, seed, num_samples)
    dataset = DLRMDataset.load(dataset_dir)
    meta, samples = _samples(data_path, COMPUTE_DATA_KIND, num_samples)
    if meta.get("dataset_fingerprint") != dataset.fingerprint:
        raise UserError(f"{data_path} was measured on another dataset than {dataset.path}; "
                        "pass the matching --dataset_dir")
    feats, mask, y = compute_training_arrays(samples, dataset.features)
    kw = {"batch_size": batch_size, "lr": lr, "train_ratio": train_ratio, "valid_ratio": valid_ratio, "seed": seed}
    model = ComputeCostModel(model_meta(meta, data=str(data_path), epochs=epochs, **kw))
    report = model.fit((feats, mask), y, epochs=epochs, **kw)
    _print_metrics(f"compute model ({meta['backend']}/{meta['device']})", report)
    model.save(out_path)
    print(f"saved {out_path}")
    return model


def train_comm_models(data_path, fw_out_path, bw_out_path, epochs: int = 300, num_samples: int | None = None,
                      batch_size: int = 512, lr: float = 1e-3, train_ratio: float = 0.8, valid_ratio: float = 0.1,
                      seed: int = 0) -> tuple[CommCostModel, CommCostModel]:
    check_training_args(epochs, batch_size, lr, train_ratio, valid_ratio, seed, num_samples)
    if Path(fw_out_path).resolve() == Path(bw_out_path).resolve():
        raise UserError("--fw_out_path and --bw_out_path are the same file; give each model its own path")
    meta, samples = _samples(data_path, COMM_DATA_KIND, num_samples)
    N = int(meta["ndevices"])
    kw = {"batch_size": batch_size, "lr": lr, "train_ratio": train_ratio, "valid_ratio": valid_ratio, "seed": seed}
    models = []
    for direction, out in (("fw", fw_out_path), ("bw", bw_out_path)):
        x, y = comm_training_arrays(samples, direction)
        model = CommCostModel(N, direction, model_meta(meta, data=str(data_path), epochs=epochs, **kw))
        report = model.fit((x,), y, epochs=epochs, **kw)
        _print_metrics(f"{direction} comm model ({N} devices, {meta['device']})", report)
        model.save(out)
        print(f"saved {out}")
        models.append(model)
    return models[0], models[1]
