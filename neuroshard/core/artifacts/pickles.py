"""Safe pickling: pickles hold plain data only, and model weights load as tensors only.

Before pickling, numpy arrays and tensors are turned into tagged dicts of (dtype, shape, bytes) (`encode`), so a
neuroshard pickle references no global at all; `SafeUnpickler` refuses every global, which is what lets a pickle
call code. `decode` rebuilds the arrays (numeric dtypes only). Model weights are `torch.save`d and read with
`torch.load(weights_only=True)` (`load_torch`).
"""
from __future__ import annotations

import os
import pickle
import sys
import warnings
import zipfile
from typing import Any

import numpy as np

from ..errors import UserError
from .inputs import check_input_file


_NUMERIC_KINDS = "biufc"


def encode(obj: Any) -> Any:
    """Plain-data form of `obj`: arrays and tensors become {"__ndarray__": (dtype, shape, bytes)}."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _NUMERIC_KINDS:
            raise TypeError(f"only numeric arrays can be stored, got dtype {obj.dtype}")
        a = np.ascontiguousarray(obj)
        return {"__ndarray__": (a.dtype.str, tuple(a.shape), a.tobytes())}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return {"__tensor__": encode(obj.detach().cpu().numpy())["__ndarray__"]}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(encode(v) for v in obj)
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, set, frozenset)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in a neuroshard artifact")


def _array(spec) -> np.ndarray:
    dtype, shape, data = spec
    dt = np.dtype(dtype)
    if dt.kind not in _NUMERIC_KINDS:
        raise pickle.UnpicklingError(f"refusing array of dtype {dtype}")
    return np.frombuffer(data, dtype=dt).reshape(shape).copy()


def decode(obj: Any) -> Any:
    """Inverse of `encode`."""
    if isinstance(obj, dict):
        if len(obj) == 1 and "__ndarray__" in obj:
            return _array(obj["__ndarray__"])
        if len(obj) == 1 and "__tensor__" in obj:
            import torch

            return torch.from_numpy(_array(obj["__tensor__"]))
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    return obj


class SafeUnpickler(pickle.Unpickler):
    """Rebuilds plain data only: every global (the only way a pickle reaches code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: neuroshard pickles hold plain data only")


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(encode(obj), protocol=pickle.HIGHEST_PROTOCOL)


WRITTEN_BY = {  # the command that writes each kind of artifact again, for "write it again with ..." messages
    "processed dataset": "python tools/gen_dlrm_data.py --synthetic (or --data FILE)",
    "task file": "python tools/gen_tasks.py",
    "cost data file": "collect_compute_cost_data.py or collect_comm_cost_data.py after moving the damaged file away",
    "eval progress log": "eval.py after moving the log away",
    "cost model (compute": "python train_compute_cost_model.py",
    "cost model (comm": "python train_comm_cost_model.py --ndevices N",
    "cost model": "python train_compute_cost_model.py / train_comm_cost_model.py",
}


def written_by(what: str) -> str:
    """The command that writes a `what` artifact again."""
    return next((cmd for k, cmd in WRITTEN_BY.items() if what.startswith(k)), "the neuroshard step that wrote it")


def _unpickle_error(path: Path, what: str, e: Exception) -> UserError:
    if isinstance(e, pickle.UnpicklingError) and "refusing" in str(e):
        return UserError(f"{path} is not a safe neuroshard {what}: {e}; write it again with {written_by(what)}")
    return UserError(f"{path} is not a readable {what} ({type(e).__name__}: {str(e)[:120]}); write it again with "
                     f"{written_by(what)}")


def load_pickle(path: str | os.PathLike, what: str = "artifact") -> Any:
    """Load a neuroshard pickle with `SafeUnpickler`; every failure becomes one clear `UserError`."""
    path = check_input_file(path, what)
    try:
        with open(path, "rb") as f:
            return decode(SafeUnpickler(f).load())
    except Exception as e:
        raise _unpickle_error(path, what, e) from None


def load_torch(path: str | os.PathLike, what: str) -> Any:
    """`torch.load(weights_only=True)`: tensors and plain containers only, never arbitrary code. A file in
    torch's zip format is first checked against the CRC-32 of every entry, which `torch.load` does not
    check: a flipped byte in the weights is refused instead of loading as other weights."""
    import torch

    path = check_input_file(path, what)
    bad = None
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, ValueError) as e:
            bad = f"the archive ({type(e).__name__})"
    if bad is not None:
        raise UserError(f"{path} is damaged (a checksum fails in {bad}); write it again with {written_by(what)}")
    with open(path, "rb") as f:
        head = f.read(2)
    if head[:2] != b"PK" and head[:1] != b"\x80":  # neither torch's zip format nor its legacy pickle
        raise UserError(f"{path} is not a loadable {what}: it is not a file torch saved; write it again with "
                        f"{written_by(what)}")
    try:
        return torch_load_plain(path)
    except Exception as e:
        raise UserError(f"{path} is not a loadable {what}: {torch_load_failure(e)}; write it again with "
                        f"{written_by(what)}") from None


def torch_load_plain(source, **kwargs) -> Any:
    """`torch.load(source, weights_only=True, map_location="cpu")`, torch's notes on pickle protocols silenced (the
    caller's line says what matters; `torch_load_failure` words a failure)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(source, weights_only=True, map_location="cpu", **kwargs)


def torch_load_failure(e: Exception) -> str:
    """Why `torch_load_plain` failed, in a few words for one line. Never torch's own text for a file that holds
    objects: it advises loading the file again with weights_only=False, which would run what a hostile file holds."""
    text = str(e).strip()
    if text.startswith("Weights only load failed") or "weights_only" in text:
        detail = (text.partition("WeightsUnpickler error:")[2].strip().splitlines() or [""])[0]
        if detail and "global" not in detail.lower():  # bytes that are no pickle at all (a damaged file)
            return f"not a file torch saved ({detail[:120]})"
        return "it holds objects other than tensors and plain data, which are refused without running them"
    return f"{type(e).__name__}: {text.splitlines()[0][:160]}" if text else type(e).__name__
