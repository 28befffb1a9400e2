"""The calibration file (`<plan>.calibration.pt`, beside the plan `shard_tables --calibrate` writes).

It holds the calibrated models' weights, what they were made for (`calibration_inputs`: the tables
themselves, digests of the ids and pre-trained model files, hardware, batch, device count, memory and
method), everything measured (`measured`), the drift reference and a digest of all of these. A later run
made for the same inputs reuses it without measuring (`find_calibration`), one made for other inputs is told
what differs, and a file edited after saving, or whose models predict costs that cannot be true for what it
measured, is refused in one line. `save_calibration` writes it; `find_calibration` and `read_calibration`
are its readers.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from ..core.artifacts import atomic_torch_save, content_digest, file_digest, json_real, load_torch
from ..core.errors import UserError
from ..core.file_names import CALIBRATION_SUFFIX, calibration_path  # noqa: F401 (the file's name: its API)
from ..core.costs import Cluster, StepFit, implausible_ms
from ..hardware.comm_bench import COLLECTIVES
from ..models.collective_models import CollectiveModels
from ..models.cost_models import CommCostModel, ComputeCostModel
from ..sharding.plan import check_rank_shards
from ..sharding.simulator import Simulator
from .fine_tune import compute_arrays

CALIBRATION_KIND = "neuroshard.calibration"
# How `calibrate` measures and fine-tunes; part of what a calibration is made for, so a calibration saved by an
# earlier method is measured again rather than reused. Change it whenever the sampler or the fine-tuning changes.
CALIBRATION_METHOD = ("v6: heaviest tables alone + random shards; relative squared error, full-batch Adam; "
                      "comm delays up to 10 ms in half the layouts, up to the slowest measured shard in the other half; "
                      "a drift reference of held-out shards; comm layouts measured on the comm models' own all-to-all "
                      "(DCT-MP's for --mp_keep models); the collectives' lines refitted on widths of the user's dims")
# what `calibration_inputs` holds, named as the notes name what differs
INPUT_NAMES = {"tables": "tables", "ids": "ids", "hardware": "hardware", "batch_size": "batch",
               "num_devices": "device count", "max_mem_gb": "device memory", "models": "pre-trained cost models",
               "method": "calibration method"}


def calibration_inputs(task, hw_desc: dict, batch_size: int, num_devices: int, max_mem_gb: float, model_paths,
                       ids_path=None, method: str = CALIBRATION_METHOD) -> dict:
    """What a calibration depends on, as plain data saved in it: the tables themselves (features, dims, rows),
    digests of the ids and pre-trained model files, hardware, batch, devices, memory and calibration method.
    Reuse compares these (`differences`), so a calibration is reused for exactly the tables it measured."""
    return {"tables": {"features": np.asarray(task.data_features, np.float64).tolist(),
                       "dims": [int(d) for d in task.dims], "rows": [int(r) for r in task.rows]},
            "ids": None if ids_path is None else file_digest(ids_path),
            "hardware": {k: hw_desc.get(k) for k in ("device", "backend", "device_name")},
            "batch_size": int(batch_size), "num_devices": int(num_devices), "max_mem_gb": float(max_mem_gb),
            "models": [file_digest(p) for p in model_paths], "method": method}


def fingerprint_of(inputs: dict) -> str:
    """16 hex digits naming `calibration_inputs` (shown and saved; reuse compares the inputs themselves)."""
    return content_digest(inputs)[:16]


def differences(made_for, inputs: dict) -> list[str]:
    """What differs between the inputs a calibration was made for and these (names from INPUT_NAMES); a file
    without them was made by an earlier release: its calibration method differs."""
    if not isinstance(made_for, dict):
        return [INPUT_NAMES["method"]]
    return [name for key, name in INPUT_NAMES.items()
            if content_digest(made_for.get(key)) != content_digest(inputs.get(key))]



def _content_digest(report: dict, collectives=None) -> str:
    """Digest of what a calibration file says it measured and what for, and of the collectives' costs it fitted
    where it measured the collectives: a file edited after it was saved (a fingerprint, reference or cost changed
    by hand) no longer matches its digest."""
    fitted = ("step_fit",) if report.get("step_fit") is not None else ()  # files without a fit keep their digest
    keys = ("made_for", "measured", "reference", "config") + fitted
    content = {k: report.get(k) for k in keys}
    measured = report.get("measured")
    if isinstance(measured, dict) and "collectives" in measured:  # files of earlier methods keep their digest
        content["fitted_collectives"] = collectives
    return content_digest(content)



def save_calibration(path, sim: Simulator, report: dict) -> Path:
    coll = sim.coll.to_json() if sim.coll is not None else None
    report = {**report, "digest": _content_digest(report, coll)}
    if isinstance(report.get("made_for"), dict):
        report["fingerprint"] = fingerprint_of(report["made_for"])
    state = {name: {"kind": m.kind, "meta": m.meta, "state_dict": {k: v.detach().clone() for k, v in
                                                                  m.net.state_dict().items()}}
             for name, m in (("compute", sim.compute), ("fw", sim.fw), ("bw", sim.bw), ("input", sim.inp))
             if m is not None}
    return atomic_torch_save(path, {"kind": CALIBRATION_KIND, "report": report, "models": state,
                                    **({"collectives": coll} if coll is not None else {})})



def find_calibration(path, inputs: dict | None, task=None, cluster: Cluster | None = None
                     ) -> tuple[tuple[Simulator, dict] | None, list[str]]:
    """(the calibrated simulator and report saved at `path`, []) when it was made for `inputs`
    (`calibration_inputs`); (None, what differs) when it was made for other inputs; (None, []) when there is
    no file. A file whose content no longer matches its digest is refused, and with the `task` and `cluster`
    its drift reference is checked against the shards it measured."""
    path = Path(path)
    if not os.path.lexists(path):
        return None, []
    obj = load_torch(path, "calibration")
    if not isinstance(obj, dict) or obj.get("kind") != CALIBRATION_KIND or not isinstance(obj.get("models"), dict) \
            or not isinstance(obj.get("report"), dict):
        raise UserError(f"{path} is not a neuroshard calibration; delete it or choose another --out")
    report = obj["report"]
    try:
        unchanged = "digest" in report and report["digest"] == _content_digest(report, obj.get("collectives"))
    except (TypeError, ValueError, RecursionError):  # a value no saved calibration holds (a tensor, bytes, deep nesting)
        unchanged = False
    if not unchanged:
        raise UserError(f"{path} is damaged or was changed after it was saved (what it holds no longer matches "
                        "its digest, or it has none); delete it to calibrate again")
    differ = [] if inputs is None else differences(report.get("made_for"), inputs)  # None: read_calibration
    if differ:
        return None, differ
    if task is not None and cluster is not None:
        measured = report.get("measured")
        check_measured(measured, task, cluster, str(path))
        check_reference(report.get("reference"), task.rows, cluster, str(path), task.dims, measured)
    models = []
    for name, cls in (("compute", ComputeCostModel), ("fw", CommCostModel), ("bw", CommCostModel),
                      ("input", CommCostModel)):
        entry = obj["models"].get(name)
        if name == "input" and entry is None:  # a calibration made without an input-distribution model
            models.append(None)
            continue
        try:
            m = cls._build(entry["meta"])
            m.net.load_state_dict(entry["state_dict"])
        except Exception:
            raise UserError(f"{path} is damaged ({name} model); delete it to calibrate again") from None
        if not all(torch.isfinite(v).all() for v in entry["state_dict"].values()):
            raise UserError(f"{path} has non-finite weights; delete it to calibrate again")
        m.net.eval()
        models.append(m)
    fit = report.get("step_fit")
    try:
        step_fit = None if fit is None else StepFit(fit["scale"], fit["overhead_ms"])
    except (TypeError, KeyError, UserError):
        raise UserError(f"{path} holds a damaged step fit; delete it to calibrate again") from None
    coll = obj.get("collectives")  # the collectives' costs it was calibrated with (None: without them)
    coll = None if coll is None else CollectiveModels.from_json(coll, str(path), "delete it to calibrate again")
    try:
        sim = Simulator(*models[:3], step_fit=step_fit, inp=models[3], coll=coll)
    except UserError:  # models that disagree (direction, devices, hardware, batch)
        raise UserError(f"{path} is damaged (its models disagree); delete it to calibrate again") from None
    check_calibrated_predictions(sim, report, path)
    return (sim, report), []



def check_calibrated_predictions(sim: Simulator, report: dict, path) -> None:
    """The calibrated models' predictions for what the calibration measured (its shards' compute, its layouts'
    all-to-alls): each plausible by magnitude (`implausible_ms`; a model's raw prediction may dip below 0), else
    one line naming the file. The digest covers what was measured, not the weights, and it is unkeyed: it catches
    accidents, not forgery. A file whose models were edited (a compute bias of 1e30) is refused here; one forged
    whole can still give a bad plan, never an absurd cost (every plan's cost is checked too, `Cost.check`). A file
    that holds no measurements (made by hand) has nothing to check here."""
    measured = report.get("measured")
    if measured is None:
        return
    try:
        features = np.asarray(report["made_for"]["tables"]["features"], np.float64)
        shards = [(np.array([t for t, _ in dev], np.int64), np.array([d for _, d in dev], np.int64))
                  for dev in measured["shards"]]
        layouts = measured.get("layouts", [])  # files of earlier methods measured none
        dims = np.array([lay["dims"] for lay in layouts], np.float32)
        delays = np.array([lay["delays_ms"] for lay in layouts], np.float32)
        predicted = [("compute", sim.compute.predict(*compute_arrays(features, shards)))]
        if len(dims):
            predicted += [("forward all-to-all", sim.fw.predict(np.concatenate([dims, delays], axis=1))),
                          ("backward all-to-all", sim.bw.predict(dims))]
    except (TypeError, KeyError, ValueError, IndexError):
        raise UserError(f"{path} holds damaged measurements; delete it to calibrate again") from None
    for what, ms in predicted:
        why = implausible_ms(np.abs(ms))
        if why:
            raise UserError(f"{path}: its calibrated cost models predict a {what} cost that cannot be true ({why}) "
                            "for the shards it measured; delete it to calibrate again")



def read_calibration(path) -> tuple[Simulator, dict]:
    """(the calibrated simulator, its report) saved at `path` by `shard_tables --calibrate`, whatever tables it was
    made for (the caller vouches for them; `report["made_for"]` says what they were), for
    `NeuroShardPlanner(simulator=...)`. A missing, foreign or edited file is one UserError."""
    if not os.path.lexists(path):
        raise UserError(f"{path}: no such calibration; make one with tools/shard_tables.py --calibrate (it saves "
                        "<plan>.calibration.pt beside the plan)")
    return find_calibration(path, None)[0]



def check_measured(measured, task, cluster: Cluster, where: str) -> dict:
    """What a calibration file says it measured: shards of the task's tables ([table, dim] pairs, column shards
    of their tables, within a device's memory), each with a plausible compute ms; all-to-all ms per layout and
    rank plausible too, and so the collectives' ms per width and rank where it measured them. One line naming the
    file otherwise."""
    try:
        shards, ms = measured["shards"], np.asarray(measured["compute_ms"], np.float64)
        ok = isinstance(shards, list) and 1 <= len(shards) == len(ms) and implausible_ms(ms, positive=True) is None
        for dev in shards if ok else []:  # each measured shard: one device's shard list
            ok = ok and isinstance(dev, list)
            check_rank_shards([dev], task.rows, Cluster(1, cluster.max_mem_gb), task.dims)
        for key in ("fw_ms", "bw_ms") + (("input_ms",) if "input_ms" in measured else ()):
            v = np.asarray(measured[key], np.float64)
            ok = ok and v.ndim == 2 and v.shape[1] == cluster.num_devices and implausible_ms(v) is None
        coll = measured.get("collectives")  # calibrations made with the collectives' costs
        if coll is not None:
            w = coll["widths"]
            ok = ok and isinstance(w, list) and 1 <= len(w) <= 100_000 and all(
                isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 1 << 24 for x in w)
            ok = ok and sorted(coll) == sorted(["widths", *(f"{k}_ms" for k in COLLECTIVES)])
            for name in COLLECTIVES:
                rows = coll[f"{name}_ms"]
                ok = ok and isinstance(rows, list) and len(rows) == len(w) and all(
                    isinstance(r, list) and len(r) == cluster.num_devices and all(json_real(x) for x in r)
                    for r in rows) and implausible_ms(np.asarray(rows, np.float64), positive=True) is None
    except (TypeError, KeyError, ValueError, IndexError):
        ok = False
    if not ok:
        raise UserError(f"{where} holds damaged measurements; delete it to calibrate again")
    return measured



def check_reference(ref, rows, cluster: Cluster, where: str, dims=None, measured: dict | None = None) -> list[dict]:
    """A drift reference read from a file: groups of one shard per rank of `cluster`, each a list of
    [table < len(rows), dim] pairs (dim a multiple of 4 up to 65536, and with the tables' `dims` a column shard of
    its table's) within a device's memory, with finite compute and bw ms in (0, MAX_PLAUSIBLE_MS]. With the
    calibration's `measured` shards, every reference shard must be one of them with the compute measured for it
    (the reference is what calibration measured, not a number edited in). One line naming the file otherwise
    (`--measure` builds what it names)."""
    N = cluster.num_devices
    try:
        ok = isinstance(ref, list) and 1 <= len(ref) <= 100_000
        for g in ref if ok else []:
            check_rank_shards(g["devices"], rows, cluster, dims)
            for key in ("compute_ms", "bw_ms"):
                v = np.asarray(g[key], np.float64)
                ok = ok and v.shape == (N,) and implausible_ms(v, positive=True) is None
        if ok and measured is not None:
            by_shard = {}
            for shard, ms in zip(measured["shards"], measured["compute_ms"]):
                by_shard.setdefault(json.dumps(shard), []).append(float(ms))
            ok = all(any(np.isclose(ms, c, rtol=1e-9, atol=0) for ms in by_shard.get(json.dumps(dev), []))
                     for g in ref for dev, c in zip(g["devices"], g["compute_ms"]))
    except (TypeError, KeyError, ValueError, IndexError):
        ok = False
    if not ok:
        raise UserError(f"{where} holds a damaged drift reference; delete it to calibrate again")
    return ref
