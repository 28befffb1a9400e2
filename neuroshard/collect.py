"""Appendable, resumable sample files shared by both cost-data collectors.

A collection file is a pickle `{"kind", "meta", "samples": [...]}`; `meta` records what produced
the samples (hardware, batch size, dataset, arguments). A re-run with the same settings continues
the file up to `--data_size` samples; a file made with other settings is refused, never mixed.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .artifacts import atomic_write_pickle, load_pickle, provenance
from .errors import UserError


class SampleFile:
    def __init__(self, path: str | Path, kind: str, meta: dict[str, Any], must_match: tuple[str, ...],
                 save_every_s: float = 5.0):
        self.path, self.kind, self.meta = Path(path), kind, meta
        self.samples: list[dict] = []
        self.save_every_s = save_every_s
        self._last_save = time.monotonic()
        if self.path.exists():
            old = load_pickle(self.path, "cost data file")
            if not isinstance(old, dict) or old.get("kind") != kind:
                raise UserError(f"{self.path} is not a {kind} file; choose another --out_dir")
            for key in must_match:
                if old["meta"].get(key) != meta.get(key):
                    raise UserError(f"{self.path} holds samples with {key}={old['meta'].get(key)!r}, "
                                    f"this run has {key}={meta.get(key)!r}; use another --out_dir to keep them apart")
            self.samples = old["samples"]
        self.meta["provenance"] = provenance()

    def missing_indices(self, data_size: int) -> list[int]:
        """Sample indices still to measure for the file to hold `data_size` samples."""
        start = 1 + max((s["index"] for s in self.samples), default=-1)
        return list(range(start, start + max(0, data_size - len(self.samples))))

    def add(self, sample: dict) -> None:
        self.samples.append(sample)
        if time.monotonic() - self._last_save > self.save_every_s:
            self.save()

    def save(self) -> None:
        atomic_write_pickle(self.path, {"kind": self.kind, "meta": self.meta, "samples": self.samples})
        self._last_save = time.monotonic()


def load_samples(path: str | Path, kind: str) -> dict:
    obj = load_pickle(path, "cost data file")
    if not isinstance(obj, dict) or obj.get("kind") != kind:
        raise UserError(f"{path} is not a {kind} file; collect it with the matching collect_*_cost_data.py")
    return obj
