"""Hardware backends (DESIGN.md §4): fused embedding-bag operators, device choice, timing.

Two implementations of one fused operator holding a set of tables (forward: pooled sums of every
table for the batch; backward: exact SGD update of the rows it touched):
- `FbgemmTBE`: FBGEMM's `SplitTableBatchedEmbeddingBagsCodegen` (CPU: `EmbeddingLocation.HOST` /
  `ComputeDevice.CPU` from `fbgemm-gpu-cpu`; CUDA: `EmbeddingLocation.DEVICE` from `fbgemm-gpu`).
- `TorchFusedEmbeddingBag`: pure PyTorch; tables of the same dim are concatenated into one weight
  with per-table row offsets and looked up by one `embedding_bag` call (one launch per distinct dim,
  at most six, since one `embedding_bag` has one width), sparse gradients, SGD.
Both take table-major inputs: `indices` and `offsets` of length T*B + 1, like TBE.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

from ..core.artifacts import cpu_name
from ..core.errors import UserError
from .timing import flush_bytes

LEARNING_RATE = 0.01


class FusedEmbeddingBag(Protocol):
    def prepare(self, indices: torch.Tensor, offsets: torch.Tensor) -> Any: ...
    def forward(self, prepared: Any) -> torch.Tensor: ...
    def train_step(self, prepared: Any, grad_out: torch.Tensor) -> None: ...
    def weights(self) -> list[torch.Tensor]: ...


# ----------------------------------------------------------------------------- device / backend choice

@dataclass(frozen=True)
class Hardware:
    device: str   # "cpu" or "cuda"
    backend: str  # "fbgemm" or "torch"

    def describe(self) -> dict[str, str]:
        name = torch.cuda.get_device_name() if self.device == "cuda" else cpu_name()
        return {"device": self.device, "backend": self.backend, "device_name": name,
                "cache_flush_mb": flush_bytes(self.device) >> 20}


def resolve_device(device: str = "auto", gpu_ids: list[int] | None = None) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda, got {device!r}")
    if gpu_ids:
        if not torch.cuda.is_available():
            raise UserError(f"--gpu_devices {','.join(map(str, gpu_ids))} given but CUDA is not available here; "
                            "drop --gpu_devices to run on CPU")
        if device == "cpu":
            raise UserError("--gpu_devices contradicts --device cpu; drop one of them")
        if max(gpu_ids) >= torch.cuda.device_count():
            raise UserError(f"--gpu_devices names GPU {max(gpu_ids)} but this machine has "
                            f"{torch.cuda.device_count()}; use ids 0..{torch.cuda.device_count() - 1}")
        return "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda requested but CUDA is not available; use --device cpu")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@functools.lru_cache(maxsize=None)
def fbgemm_works(device: str) -> bool:
    """True if FBGEMM's TBE imports and runs a tiny forward on `device`."""
    try:
        op = FbgemmTBE([(8, 4)], device)
        op.forward(op.prepare(torch.tensor([1, 2]), torch.tensor([0, 1, 2])))
        return True
    except Exception:
        return False


def resolve_backend(backend: str = "auto", device: str = "cpu") -> str:
    if backend not in ("auto", "fbgemm", "torch"):
        raise UserError(f"--backend must be auto, fbgemm or torch, got {backend!r}")
    if backend == "torch":
        return "torch"
    ok = fbgemm_works(device)
    if backend == "fbgemm" and not ok:
        pkg = "fbgemm-gpu-cpu==1.8.0" if device == "cpu" else "fbgemm-gpu (CUDA build)"
        raise UserError(f"--backend fbgemm but FBGEMM does not load on {device}; install {pkg} or use --backend torch")
    return "fbgemm" if ok else "torch"


def resolve_hardware(device: str = "auto", backend: str = "auto", gpu_ids: list[int] | None = None) -> Hardware:
    dev = resolve_device(device, gpu_ids)
    return Hardware(dev, resolve_backend(backend, dev))


def make_fused(specs: Sequence[tuple[int, int]], hw: Hardware) -> FusedEmbeddingBag:
    """A fused operator for tables given as (rows, dim)."""
    if hw.backend == "fbgemm":
        return FbgemmTBE(specs, hw.device)
    return TorchFusedEmbeddingBag(specs, hw.device)


# ----------------------------------------------------------------------------- FBGEMM

class FbgemmTBE:
    def __init__(self, specs: Sequence[tuple[int, int]], device: str):
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice,
                                                                            SplitTableBatchedEmbeddingBagsCodegen)

        self.device = torch.device(device)
        if device == "cpu":
            loc, comp = EmbeddingLocation.HOST, ComputeDevice.CPU
        else:
            loc, comp = EmbeddingLocation.DEVICE, ComputeDevice.CUDA
        self.op = SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(int(r), int(d), loc, comp) for r, d in specs],
            optimizer=EmbOptimType.EXACT_SGD, learning_rate=LEARNING_RATE, pooling_mode=PoolingMode.SUM,
            device=self.device)

    def prepare(self, indices, offsets):
        return indices.to(self.device, torch.int64), offsets.to(self.device, torch.int64)

    def forward(self, prepared):
        return self.op(*prepared)

    def train_step(self, prepared, grad_out):
        self.op(*prepared).backward(grad_out)  # EXACT_SGD updates rows inside backward

    def weights(self):
        return list(self.op.split_embedding_weights())


# ----------------------------------------------------------------------------- pure PyTorch

class TorchFusedEmbeddingBag:
    def __init__(self, specs: Sequence[tuple[int, int]], device: str):
        self.device = torch.device(device)
        self.dims = [int(d) for _, d in specs]
        self.rows = [int(r) for r, _ in specs]
        self.groups: dict[int, list[int]] = {}
        for t, d in enumerate(self.dims):
            self.groups.setdefault(d, []).append(t)
        g = torch.Generator(device=self.device).manual_seed(0)  # drawn where the weights live: no host copy
        self.group_weights = {}
        self.row_offset = {}
        for d, tables in self.groups.items():
            total, base = 0, []
            for t in tables:
                base.append(total)
                total += self.rows[t]
            self.row_offset[d] = base
            bound = 1.0 / max(1, total) ** 0.5
            w = (torch.rand(total, d, generator=g, device=self.device) * 2 - 1) * bound
            self.group_weights[d] = w.requires_grad_()

    def prepare(self, indices, offsets):
        T = len(self.dims)
        B = (offsets.numel() - 1) // T
        offsets = offsets.to(torch.int64)
        prepared = []
        for d, tables in self.groups.items():
            ids, lens = [], []
            for base, t in zip(self.row_offset[d], tables):
                lo, hi = int(offsets[t * B]), int(offsets[(t + 1) * B])
                ids.append(indices[lo:hi].to(torch.int64) + base)
                lens.append(offsets[t * B + 1:(t + 1) * B + 1] - offsets[t * B:(t + 1) * B])
            lens = torch.cat(lens)
            bag_off = torch.zeros(lens.numel(), dtype=torch.int64)
            bag_off[1:] = torch.cumsum(lens, 0)[:-1]
            prepared.append((d, tables, torch.cat(ids).to(self.device), bag_off.to(self.device)))
        return B, prepared

    def forward(self, prepared):
        B, groups = prepared
        pieces: list[torch.Tensor | None] = [None] * len(self.dims)
        for d, tables, ids, bag_off in groups:
            pooled = torch.nn.functional.embedding_bag(ids, self.group_weights[d], bag_off, mode="sum", sparse=True)
            for k, t in enumerate(tables):
                pieces[t] = pooled[k * B:(k + 1) * B]
        return torch.cat(pieces, dim=1)

    def train_step(self, prepared, grad_out):
        self.forward(prepared).backward(grad_out)
        with torch.no_grad():
            for w in self.group_weights.values():
                w.add_(w.grad, alpha=-LEARNING_RATE)
                w.grad = None

    def weights(self):
        out = [None] * len(self.dims)
        for d, tables in self.groups.items():
            w = self.group_weights[d]
            for base, t in zip(self.row_offset[d], tables):
                out[t] = w.detach()[base: base + self.rows[t]]
        return out
