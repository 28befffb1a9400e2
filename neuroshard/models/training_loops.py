"""The training loops of the cost models (DESIGN.md §3.3, §8).

`train_cost_model` (pre-training, the paper's): split 80/10/10 (train/valid/test, seeded), z-normalise inputs
with training statistics (set on the model by `model.set_normalization`), MSE loss, Adam,
mini-batches, and keep the weights of the best validation epoch. Ends with test-split metrics: MSE,
MAPE, R² and Spearman rank correlation. With `bootstrap` (a seed > 0), the training split is resampled with
replacement first (the validation and test splits stay as they are): one member of an ensemble whose spread
says how much a prediction depends on which samples were collected (`models/ensemble.py`).

`fine_tune_relative` (calibration to a user's tables): a few dozen new samples, so no split of its
own (the caller holds samples out); the pre-training normalisation is kept; relative squared error
((pred - y) / y)², because the user's costs span 1-100 ms and the plan's error that matters is
relative; a fixed number of full-batch Adam steps.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from scipy.stats import spearmanr
from tqdm import tqdm


def regression_metrics(pred: np.ndarray, target: np.ndarray) -> dict[str, float]:
    pred, target = np.asarray(pred, np.float64).ravel(), np.asarray(target, np.float64).ravel()
    mse = float(np.mean((pred - target) ** 2))
    mape = float(np.mean(np.abs(pred - target) / np.maximum(np.abs(target), 1e-9)))
    ss_tot = float(np.sum((target - target.mean()) ** 2))
    r2 = 1.0 - float(np.sum((pred - target) ** 2)) / ss_tot if ss_tot > 0 else float("nan")
    rho = float(spearmanr(pred, target).statistic) if len(pred) > 2 else float("nan")
    return {"mse": mse, "mape": mape, "r2": r2, "spearman": rho}


def split_indices(n: int, train_ratio: float, valid_ratio: float, seed: int):
    if not (0 < train_ratio < 1 and 0 <= valid_ratio < 1 and train_ratio + valid_ratio < 1):
        raise ValueError("need 0 < train_ratio, 0 <= valid_ratio, train_ratio + valid_ratio < 1")
    perm = np.random.default_rng(seed).permutation(n)
    n_train = max(1, int(round(n * train_ratio)))
    n_valid = max(1, int(round(n * valid_ratio)))
    return perm[:n_train], perm[n_train:n_train + n_valid], perm[n_train + n_valid:]


def train_cost_model(model, inputs: tuple[np.ndarray, ...], targets: np.ndarray, epochs: int, batch_size: int = 512,
          lr: float = 1e-3, train_ratio: float = 0.8, valid_ratio: float = 0.1, seed: int = 0,
          progress: bool = True, bootstrap: int = 0) -> dict:
    """Fit `model.net` on (inputs, targets); returns history and test metrics."""
    torch.manual_seed(seed)
    n = len(targets)
    if n < 10:
        raise ValueError(f"need at least 10 samples to train, got {n}")
    tr, va, te = split_indices(n, train_ratio, valid_ratio, seed)
    if bootstrap:
        tr = np.random.default_rng([bootstrap, n]).choice(tr, len(tr), replace=True)
    X = [torch.as_tensor(x) for x in inputs]
    y = torch.as_tensor(np.asarray(targets, dtype=np.float32))
    model.set_normalization(*(x[tr] for x in X))
    net = model.net
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)

    def loss_on(idx):
        with torch.no_grad():
            net.eval()
            return float(torch.nn.functional.mse_loss(model.forward(*(x[idx] for x in X)), y[idx]))

    best, best_state, history = float("inf"), copy.deepcopy(net.state_dict()), []
    bar = tqdm(range(epochs), desc=f"train {model.kind}", disable=not progress)
    for epoch in bar:
        net.train()
        perm = torch.as_tensor(tr)[torch.randperm(len(tr), generator=gen)]
        for start in range(0, len(perm), batch_size):
            idx = perm[start:start + batch_size]
            loss = torch.nn.functional.mse_loss(model.forward(*(x[idx] for x in X)), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        train_loss, valid_loss = loss_on(tr), loss_on(va)
        history.append({"epoch": epoch, "train_mse": train_loss, "valid_mse": valid_loss})
        if valid_loss < best:
            best, best_state = valid_loss, copy.deepcopy(net.state_dict())
        bar.set_postfix(train=f"{train_loss:.4g}", valid=f"{valid_loss:.4g}", best=f"{best:.4g}", refresh=False)
    net.load_state_dict(best_state)
    net.eval()
    with torch.no_grad():
        pred = model.forward(*(x[te] for x in X)).numpy()
    return {"history": history, "best_valid_mse": best, "test": regression_metrics(pred, y[te].numpy()),
            "num_samples": {"train": len(tr), "valid": len(va), "test": len(te)}}


def fine_tune_relative(model, inputs: tuple[np.ndarray, ...], targets: np.ndarray, steps: int, lr: float,
                       seed: int, batch_size: int = 1024) -> dict:
    """Continue fitting `model.net` from its current weights on (inputs, targets), all > 0: `steps` Adam steps
    on the relative squared error, full batch up to `batch_size` samples (seeded mini-batches beyond).
    Returns the mean relative error on these samples before and after."""
    y = torch.as_tensor(np.asarray(targets, dtype=np.float32))
    if len(y) == 0 or not bool(torch.isfinite(y).all()) or bool((y <= 0).any()):
        raise ValueError("fine-tuning needs at least one sample and every target finite and > 0")
    X = [torch.as_tensor(np.asarray(x, dtype=np.float32)) for x in inputs]
    net = model.net
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr)

    def mean_rel_err() -> float:
        net.eval()
        with torch.no_grad():
            return float(((model.forward(*X) - y) / y).abs().mean())

    before = mean_rel_err()
    net.train()
    for _ in range(steps):
        idx = torch.randperm(len(y), generator=gen)[:batch_size] if len(y) > batch_size else slice(None)
        loss = (((model.forward(*(x[idx] for x in X)) - y[idx]) / y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"steps": steps, "lr": lr, "samples": len(y), "mape_before": before, "mape_after": mean_rel_err()}
