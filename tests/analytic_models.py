"""Cost models for tests: analytic ones with the simulator's interfaces, and real networks whose
weights are set by hand so that they compute known linear costs (see tests/sharding/test_simulator.py)."""
import numpy as np
import torch

from neuroshard.models.cost_models import CommCostModel, ComputeCostModel


class AnalyticCompute:
    """A shard costs sum(pooling * (0.02 * dim + 0.3) + 0.1) x a fusion discount that grows with the
    table count. The per-lookup 0.3 is paid again by a column twin, so splitting is a real trade-off."""

    meta = {"device": "analytic"}

    def embed(self, features):
        features = np.asarray(features, np.float64)
        cost = features[:, 2] * (0.02 * features[:, 0] + 0.3) + 0.1
        return np.stack([cost, np.ones(len(features))], axis=1)

    def head(self, emb_sum):
        emb_sum = np.asarray(emb_sum, np.float64)
        n = emb_sum[..., 1]
        return emb_sum[..., 0] * np.maximum(0.6, 1.0 - 0.04 * np.maximum(n - 1, 0))


class AnalyticComm:
    """Linear in dim sums (own and total) and, forward, in the rank's delay (a later rank waits less)."""

    def __init__(self, num_devices, direction):
        self.num_devices, self.direction, self.meta = num_devices, direction, {"device": "analytic"}

    def predict_np(self, x):
        x = np.asarray(x, np.float64)
        N = self.num_devices
        dims = x[:, :N]
        out = 0.004 * dims + 0.001 * dims.sum(axis=1, keepdims=True) + 0.2
        if self.direction == "fw":
            delays = x[:, N:]
            out = out + 0.5 * (delays.max(axis=1, keepdims=True) - delays)
        return out


def analytic_simulator(N):
    from neuroshard.sharding.simulator import Simulator

    return Simulator(AnalyticCompute(), AnalyticComm(N, "fw"), AnalyticComm(N, "bw"))


# ----------------------------------------------------------------------------- hand-set networks

MEAN, STD = 1.0, 2.0


def _passthrough(linear: torch.nn.Linear, n: int, first: bool) -> None:
    """Copy the first n inputs to the first n outputs (undoing the normalisation on the first layer)."""
    linear.weight.zero_()
    linear.bias.zero_()
    for i in range(n):
        linear.weight[i, i] = STD if first else 1.0
        linear.bias[i] = MEAN if first else 0.0


@torch.no_grad()
def hand_compute_model() -> ComputeCostModel:
    m = ComputeCostModel({"device": "hand"})
    m.net.x_mean.fill_(MEAN)
    m.net.x_std.fill_(STD)
    l1, l2 = m.net.table_net[0], m.net.table_net[2]
    _passthrough(l1, 3, first=True)                   # units: dim, row, pooling
    l2.weight.zero_()
    l2.bias.zero_()
    l2.weight[0, 0], l2.weight[0, 2], l2.bias[0] = 0.01, 0.1, 0.5
    h1, h2 = m.net.head[0], m.net.head[2]
    _passthrough(h1, 1, first=False)
    h2.weight.zero_()
    h2.weight[0, 0], h2.bias[0] = 1.0, 0.2
    return m


@torch.no_grad()
def hand_comm_model(N: int, direction: str, dim_scale: float = 1.0, meta: dict | None = None) -> CommCostModel:
    """`dim_scale` multiplies every dim-sum coefficient (a compressed all-to-all sends fewer bytes per dim)."""
    m = CommCostModel(N, direction, {"device": "hand", **(meta or {})})
    n_in = 2 * N if direction == "fw" else N
    m.net.x_mean.fill_(MEAN)
    m.net.x_std.fill_(STD)
    layers = [l for l in m.net.mlp if isinstance(l, torch.nn.Linear)]
    for k, l in enumerate(layers[:-1]):
        _passthrough(l, n_in, first=k == 0)
    last = layers[-1]
    last.weight.zero_()
    for r in range(N):
        if direction == "input":  # a fixed 5 ms (TorchRec's three collectives) + 0.01 ms per own input word
            last.bias[r] = 5.0
            last.weight[r, r] = 0.01
        elif direction == "bw":
            last.bias[r] = 0.3
            last.weight[r, :N] = 0.001 * dim_scale
            last.weight[r, r] += 0.002 * dim_scale
        else:
            last.bias[r] = 1.0
            last.weight[r, r] = 0.003 * dim_scale
            last.weight[r, N:] = 0.25
            last.weight[r, N + r] -= 0.5
    return m


def save_hand_models(folder, N, meta=None):
    """compute.pt, comm_<N>_fw.pt, comm_<N>_bw.pt with hand-set weights (for script tests)."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for m, name in ((hand_compute_model(), "compute.pt"), (hand_comm_model(N, "fw"), f"comm_{N}_fw.pt"),
                    (hand_comm_model(N, "bw"), f"comm_{N}_bw.pt")):
        m.meta.update(meta or {})
        m.save(folder / name)
    return folder
