"""Analytic cost models with the interfaces the simulator expects (injected in place of the networks)."""
import numpy as np


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
