"""Neural cost models (DESIGN.md §3.3) with a scikit-learn-like fit / predict / save / load.

- `ComputeCostModel`: each table's normalised 20-number feature vector -> MLP 20→128→32 (ReLU) ->
  sum over the tables of the shard -> MLP 32→64→1. One network predicts any set of tables. Because
  the set enters only through the sum, `embed` (per table) and `head` (per sum) let the search
  update a device's prediction incrementally.
- `CommCostModel`: MLP in→128→64→32→16→N, in = 2N (forward: dim sums + delays) or N (backward:
  dim sums), predicting every rank's cost. With `fw_wait_term` (meta; off in the paper's model and in
  models saved without the key) the forward model's output is the MLP's plus each rank's wait for the
  last-ready rank, max(delays) - delay_r, so the MLP learns only the transfer. A rank that starts its
  all-to-all early cannot finish before the last one has sent; measured fw minus that wait is a
  2-5 ms transfer at every spread (benchmarks/comm_wait.py), while the paper's MLP must learn the
  max itself and extrapolates it wrongly beyond the spreads it was trained on.
- Compute-model inputs (`input_transform`, recorded in the model's meta): `raw` is the paper's (the 20
  features z-normalised as they are); `log` first takes log(rows) and log(1 + pooling factor), so
  that device-sized tables (rows 1e5-1e7) and short pooling (1-20) are not squeezed into a sliver of
  the normalised range by the heavy tails of those two features. Models saved without the key are `raw`.
`fine_tune` continues fitting a pre-trained model on a few new samples (calibration to a user's
tables and hardware, DESIGN.md §8).
Weights are saved with `torch.save` (plain tensors and data) and loaded with `weights_only=True`.
A model records the hardware and device count of its training data and refuses other ones.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..core.artifacts import atomic_torch_save, check_input_file, load_torch, provenance
from ..core.errors import UserError
from ..data.features import FEATURE_NAMES, NUM_FEATURES, with_dim
from .training_loops import fine_tune_relative, train_cost_model

NORM_EPS = 1e-6
INPUT_TRANSFORMS = ("raw", "log")
_ROW, _POOLING = FEATURE_NAMES.index("row"), FEATURE_NAMES.index("pooling_factor")


def transform_features(x, input_transform: str):
    """Compute-model features [..., 20] (numpy or torch) as the model's input: `raw` leaves them, `log`
    takes log(max(rows, 1)) and log(1 + max(pooling, 0)) of a copy."""
    if input_transform == "raw":
        return x
    if isinstance(x, torch.Tensor):
        x = x.clone()
        x[..., _ROW] = torch.log(x[..., _ROW].clamp(min=1.0))
        x[..., _POOLING] = torch.log1p(x[..., _POOLING].clamp(min=0.0))
        return x
    x = np.array(x, dtype=np.float64)
    x[..., _ROW] = np.log(np.maximum(x[..., _ROW], 1.0))
    x[..., _POOLING] = np.log1p(np.maximum(x[..., _POOLING], 0.0))
    return x


def check_input_transform(value) -> str:
    if value not in INPUT_TRANSFORMS:
        raise UserError(f"unknown compute-model input transform {value!r} "
                        f"(--input_transform takes {', '.join(INPUT_TRANSFORMS)})")
    return value


def _mlp(sizes: list[int], final_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or final_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _np_layers(seq: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """(W^T, b, relu-after) of each Linear, in float64, for the fast numpy forward."""
    mods = list(seq)
    out = []
    for i, m in enumerate(mods):
        if isinstance(m, nn.Linear):
            relu = i + 1 < len(mods) and isinstance(mods[i + 1], nn.ReLU)
            out.append((m.weight.detach().double().numpy().T.copy(), m.bias.detach().double().numpy().copy(), relu))
    return out


def _np_forward(layers, x: np.ndarray) -> np.ndarray:
    for w, b, relu in layers:
        x = x @ w + b
        if relu:
            x = np.maximum(x, 0.0)
    return x


class CostModel:
    """fit / predict / save / load shared by the compute and comm models."""

    kind = "cost_model"

    def __init__(self, net: nn.Module, meta: dict[str, Any]):
        self.net, self.meta = net, meta
        self._np = None

    # -- normalisation (training statistics, stored as buffers) --
    def set_normalization(self, x: torch.Tensor, *_):
        self.net.x_mean.copy_(x.mean(0))
        self.net.x_std.copy_(x.std(0, unbiased=False) + NORM_EPS)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.net.x_mean) / self.net.x_std

    def fit(self, inputs: tuple[np.ndarray, ...], targets: np.ndarray, epochs: int = 100, **kw) -> dict:
        report = train_cost_model(self, inputs, targets, epochs, **kw)
        self.meta["metrics"] = report["test"]
        self.meta["training"] = {k: v for k, v in report.items() if k != "history"}
        self._np = None
        return report

    def fine_tune(self, inputs: tuple[np.ndarray, ...], targets: np.ndarray, steps: int = 500, lr: float = 1e-3,
                  seed: int = 0) -> dict:
        """Continue fitting from the current (pre-trained) weights on a few new samples (calibration):
        `fine_tune_relative`'s relative-error loss, the pre-training normalisation kept. Hold samples out
        to judge it; the report goes to `meta["fine_tune"]`."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a few dozen samples: one thread is as fast, and never stalls on a busy machine
        try:
            report = fine_tune_relative(self, inputs, targets, steps, lr, seed)
        finally:
            torch.set_num_threads(threads)
            self.net.eval()
            self._np = None
        self.meta.setdefault("fine_tune", []).append(report)
        return report

    def predict(self, *inputs: np.ndarray) -> np.ndarray:
        self.net.eval()
        with torch.no_grad():
            return self.forward(*(torch.as_tensor(np.asarray(x, dtype=np.float32)) for x in inputs)).numpy()

    def save(self, path: str | Path) -> Path:
        return atomic_torch_save(path, {"kind": self.kind, "meta": self.meta,
                                        "state_dict": {k: v.detach().clone() for k, v in self.net.state_dict().items()}})

    @classmethod
    def load(cls, path: str | Path):
        """Load weights saved by `save` (`torch.load(weights_only=True)`); refuse anything else."""
        path = Path(path)
        script = "train_compute_cost_model.py" if cls.kind.startswith("compute") else "train_comm_cost_model.py"
        check_input_file(path, "cost model", f"train it with {script}")  # a folder or FIFO is named as such
        obj = load_torch(path, f"cost model ({cls.kind})")
        if not isinstance(obj, dict) or obj.get("kind") != cls.kind:
            found = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
            raise UserError(f"{path} is not a {cls.kind} (found {found}); pass the file {script} wrote")
        meta, state = obj.get("meta"), obj.get("state_dict")
        if not isinstance(meta, dict) or not isinstance(state, dict):
            raise UserError(f"{path} is damaged (no meta or weights); retrain it with {script}")
        try:
            model = cls._build(meta)
            model.net.load_state_dict(state)
        except UserError as e:
            raise UserError(f"{path}: {e}; retrain it with {script}") from None
        except Exception as e:
            raise UserError(f"{path} does not hold the weights of a {cls.kind} ({type(e).__name__}); "
                            f"retrain it with {script}") from None
        bad = [k for k, v in state.items() if not torch.isfinite(v).all()]
        if bad:
            raise UserError(f"{path} has non-finite weights ({bad[0]}); retrain it with {script}")
        model.net.eval()
        return model


class ComputeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.table_net = _mlp([NUM_FEATURES, 128, 32], final_relu=True)
        self.head = _mlp([32, 64, 1], final_relu=False)
        self.register_buffer("x_mean", torch.zeros(NUM_FEATURES))
        self.register_buffer("x_std", torch.ones(NUM_FEATURES))


class ComputeCostModel(CostModel):
    """Predicts the compute cost (ms) of one fused operator over any set of tables."""

    kind = "compute_cost_model"

    def __init__(self, meta: dict[str, Any] | None = None):
        meta = {"feature_names": FEATURE_NAMES, "input_transform": "raw", **(meta or {})}
        check_input_transform(meta["input_transform"])
        super().__init__(ComputeNet(), meta)

    @property
    def input_transform(self) -> str:
        return self.meta["input_transform"]

    @classmethod
    def _build(cls, meta):
        return cls(meta)

    def set_normalization(self, features: torch.Tensor, mask: torch.Tensor):
        rows = transform_features(features[mask.bool()], self.input_transform)
        super().set_normalization(rows)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """features [S, T, 20], mask [S, T] (1 for real tables) -> cost [S]."""
        x = self._normalize(transform_features(features, self.input_transform))
        e = self.net.table_net(x) * mask.unsqueeze(-1)
        return self.net.head(e.sum(1)).squeeze(-1)

    # -- fast numpy path used by the simulator and the search --
    def _layers(self):
        if self._np is None:
            self._np = (self.net.x_mean.double().numpy(), self.net.x_std.double().numpy(),
                        _np_layers(self.net.table_net), _np_layers(self.net.head))
        return self._np

    def embed(self, features: np.ndarray) -> np.ndarray:
        """Per-table embeddings [n, 32] of feature vectors [n, 20]."""
        mean, std, table_layers, _ = self._layers()
        x = transform_features(np.asarray(features, np.float64), self.input_transform)
        return _np_forward(table_layers, (x - mean) / std)

    def head(self, emb_sum: np.ndarray) -> np.ndarray:
        """Cost of sets from their embedding sums [..., 32] -> [...]."""
        return _np_forward(self._layers()[3], emb_sum)[..., 0]


COMM_DIRECTIONS = ("fw", "bw", "input")


class CommNet(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.mlp = _mlp([n_in, 128, 64, 32, 16, n_out], final_relu=False)
        self.register_buffer("x_mean", torch.zeros(n_in))
        self.register_buffer("x_std", torch.ones(n_in))


class CommCostModel(CostModel):
    """Predicts every rank's forward (dim sums + delays) or backward (dim sums) all-to-all cost, or (direction
    "input") its part of TorchRec's input distribution (input words per sample, `data.features.input_words`)."""

    kind = "comm_cost_model"

    def __init__(self, num_devices: int, direction: str, meta: dict[str, Any] | None = None):
        if direction not in COMM_DIRECTIONS:
            raise UserError(f"a comm model's direction must be fw, bw or input, got {direction!r}")
        if not isinstance(num_devices, int) or num_devices < 2:
            raise UserError(f"a comm model needs >= 2 devices, got {num_devices!r}")
        meta = {"fw_wait_term": False, **(meta or {}), "ndevices": num_devices, "direction": direction}
        if not isinstance(meta["fw_wait_term"], bool) or (meta["fw_wait_term"] and direction != "fw"):
            raise UserError(f"fw_wait_term must be true or false, and true only for a forward model "
                            f"(got {meta['fw_wait_term']!r} for {direction})")
        n_in = 2 * num_devices if direction == "fw" else num_devices
        top = meta.get("training_input_max")  # the largest dim sums (and delays) the model was trained on
        if top is not None and not (isinstance(top, (list, tuple)) and len(top) == n_in and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in top)):
            raise UserError(f"training_input_max must be {n_in} finite numbers for a {num_devices}-device "
                            f"{direction} model")
        super().__init__(CommNet(n_in, num_devices), meta)
        self.num_devices, self.direction = num_devices, direction
        self.wait_term = meta["fw_wait_term"]

    @classmethod
    def _build(cls, meta):
        return cls(meta.get("ndevices"), meta.get("direction"), meta)

    @classmethod
    def load_direction(cls, path: str | Path, direction: str) -> "CommCostModel":
        """Load a comm model and refuse one trained for the other direction."""
        model = cls.load(path)
        if model.direction != direction:
            names = {"fw": "forward", "bw": "backward", "input": "input-distribution"}
            made = "train_comm_cost_model.py" + (" --input_dist" if direction == "input" else "")
            raise UserError(f"{path} is the {names[model.direction]} comm model, but the {names[direction]} one "
                            f"is needed here; pass --{direction}_comm_model models/comm_<N>_{direction}.pt "
                            f"(made by {made})")
        return model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.net.x_mean.numel():
            raise UserError(f"{self.direction} comm model was trained for {self.num_devices} devices, "
                            f"got inputs for {x.shape[-1] // (2 if self.direction == 'fw' else 1)}")
        out = self.net.mlp(self._normalize(x))
        if self.wait_term:
            delays = x[..., self.num_devices:]
            out = out + (delays.max(dim=-1, keepdim=True).values - delays)
        return out

    def predict_np(self, x: np.ndarray) -> np.ndarray:
        if self._np is None:
            self._np = (self.net.x_mean.double().numpy(), self.net.x_std.double().numpy(), _np_layers(self.net.mlp))
        mean, std, layers = self._np
        x = np.asarray(x, np.float64)
        out = _np_forward(layers, (x - mean) / std)
        if self.wait_term:
            delays = x[..., self.num_devices:]
            out = out + (delays.max(axis=-1, keepdims=True) - delays)
        return out


# ----------------------------------------------------------------------------- training data

def compute_training_arrays(samples: list[dict], dataset_features: np.ndarray, max_tables: int | None = None):
    """Padded features [S, T, 20], mask [S, T] and costs [S] from compute-cost samples."""
    T = max_tables or max(len(s["dims"]) for s in samples)
    feats = np.zeros((len(samples), T, NUM_FEATURES), dtype=np.float32)
    mask = np.zeros((len(samples), T), dtype=np.float32)
    for i, s in enumerate(samples):
        n = len(s["dims"])
        feats[i, :n] = with_dim(dataset_features[s["table_ids"]], s["dims"])
        mask[i, :n] = 1
    return feats, mask, np.array([s["cost_ms"] for s in samples], dtype=np.float32)


def comm_training_arrays(samples: list[dict], direction: str):
    dims = np.stack([s["dim_sums"] for s in samples]).astype(np.float32)
    if direction == "fw":
        x = np.concatenate([dims, np.stack([s["delays_ms"] for s in samples]).astype(np.float32)], axis=1)
        y = np.stack([s["fw_ms"] for s in samples])
    else:
        x, y = dims, np.stack([s["bw_ms"] for s in samples])
    return x, y.astype(np.float32)


def input_training_arrays(samples: list[dict]):
    """Input words per rank [S, N] and each rank's input-distribution ms [S, N] (`comm_bench.sample_input`)."""
    x = np.stack([s["input_words"] for s in samples]).astype(np.float32)
    return x, np.stack([s["input_ms"] for s in samples]).astype(np.float32)


def model_meta(data_meta: dict, **extra) -> dict:
    """What a model records about its training data (hardware, batch) plus provenance."""
    keep = ("device", "backend", "device_name", "batch_size", "ndevices", "dataset_fingerprint", "family_mix",
            "sleep_range")
    return {**{k: data_meta[k] for k in keep if k in data_meta}, "provenance": provenance(**extra)}
