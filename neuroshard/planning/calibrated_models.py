"""The cost models `shard_tables` plans with: a calibration beside `--out` made for these tables, this hardware and
these models (reused without measuring), a new one with `--calibrate K` (saved beside `--out`, never lost to a
failed save), or the pre-trained models."""
from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from ..core.artifacts import fresh_path
from ..core.config import ShardTablesConfig
from ..core.errors import UserError
from ..core.costs import Cluster
from ..data.table_list import TableList
from ..sharding.simulator import Simulator
from .calibrate import CalibrationConfig, calibrate
from .calibration_file import calibration_inputs, calibration_path, find_calibration, save_calibration


def held_out_words(rep, what: str) -> str:
    """'; <what> before% -> after%' from a calibration report's part, or '' where it holds no such numbers."""
    try:
        return f"; {what} {100 * float(rep['before']['mape']):.1f}% -> {100 * float(rep['after']['mape']):.1f}%"
    except (TypeError, KeyError, ValueError):
        return ""



def calibrated_simulator(sim: Simulator, tl: TableList, cluster: Cluster, hw, batch: int, paths,
                         cfg: ShardTablesConfig) -> tuple[Simulator, dict | None]:
    """The simulator to plan with: calibrated models beside `--out` when they were made for these tables, this
    hardware and these models (reused), newly calibrated ones with `--calibrate K`, else the pre-trained models."""
    path = calibration_path(cfg.out)
    inputs = calibration_inputs(tl.task, hw.describe(), batch, cluster.num_devices, cluster.max_mem_gb, paths,
                                cfg.ids)
    try:
        found, differ = find_calibration(path, inputs, tl.task, cluster)
    except UserError as e:  # damaged, edited or foreign: refused, but it must not block the run that replaces it
        if cfg.calibrate is None:
            raise UserError(f"{e} (--calibrate K replaces it)") from None
        found, differ = None, []
        print(f"note: replacing {path}, which is not a usable calibration: {e}")
    ccfg = None if cfg.calibrate is None else \
        CalibrationConfig(num_shards=cfg.calibrate, comm_layouts=cfg.comm_layouts(), seed=cfg.seed,
                          dmp_plans=cfg.calibrate_dmp or 0)
    if found is not None and (ccfg is None or found[1].get("config") == asdict(ccfg)):
        step = found[1].get("step") if found[0].step_fit else None
        print(f"reusing the calibrated cost models in {path} (same tables, hardware and models"
              f"{held_out_words(found[1].get('compute'), 'held-out compute MAPE')}"
              f"{held_out_words(step, 'the step cost fitted to TorchRec steps, held-out MAPE')})")
        return found[0], {k: v for k, v in found[1].items() if k != "provenance"}
    other = (f"was calibrated for other tables, hardware or models ({', '.join(differ)} differ)" if differ else
             "was calibrated with another --calibrate K, --calibrate_comm, --calibrate_dmp or --seed")
    if cfg.calibrate is None:
        if differ:
            print(f"note: {path} {other}; not used (pass --calibrate K to replace it)")
        return sim, None
    if found is not None or differ:
        print(f"note: replacing {path}, which {other}")
    calibrated, report = calibrate(sim, tl, cluster, hw, batch, ccfg, cfg.ids)
    report["made_for"] = inputs
    saved = save_calibration_somewhere(path, calibrated, report, cfg)
    report["saved_to"] = None if saved is None else str(saved)
    return calibrated, {k: v for k, v in report.items() if k not in ("provenance", "made_for")}



def save_calibration_somewhere(path: Path, calibrated: Simulator, report: dict, cfg: ShardTablesConfig) -> Path | None:
    """Save a new calibration beside `--out`; when that write fails (a full disk) save it in the temporary folder
    instead, and failing that keep it for this run only (its measurements still go into the plan file). Minutes
    of measuring are never lost to a failed save: one line says what was saved where. Returns where, or None."""
    try:
        save_calibration(path, calibrated, report)
        print(f"calibrated cost models saved to {path}")
        return path
    except UserError as e:
        why = "disk full" if str(e).startswith("disk full") else str(e).split(";")[0]
    spare = fresh_path(Path(tempfile.gettempdir()) / f"neuroshard-{path.name}", "")
    try:
        save_calibration(spare, calibrated, report)
        print(f"warning: could not save the calibration to {path} ({why}); saved it to {spare} instead and planned "
              f"with it: move it back (mv {spare} {path}) and later runs reuse it", file=sys.stderr)
        return spare
    except UserError:
        print(f"warning: could not save the calibration to {path} ({why}) nor to {spare}: planned with it, and its "
              f"measurements go into {cfg.out} (calibration.measured); free some space and rerun with --calibrate "
              f"{cfg.calibrate} to save it", file=sys.stderr)
        return None



def models_words(cfg: ShardTablesConfig, calibration: dict | None) -> tuple[str, str]:
    """(the models that predict, how to fix them) for the line of a predicted cost that cannot be true."""
    if calibration is not None:
        fix = f"delete {calibration_path(cfg.out)} and calibrate again (--calibrate K)"
        return "the calibrated cost models", fix + ("" if cfg.alg == "neuroshard" else
                                                     "; or plan without cost models (e.g. --alg size_lookup_greedy)")
    return "the cost models", ("retrain them on more cost data or fine-tune them to these tables (--calibrate K); "
                               "or plan without cost models (e.g. --alg size_lookup_greedy)")
