"""The one cost-model loader: the three cost models for N devices (and DCT-MP's `mp_keep`) as a `Simulator`.

`load_cost_models` takes the files a step's flags name (`CostModelFiles`) or a models folder (its default
file names, `comm_model_paths`). Missing files are named together in one line with the commands that make
them (or, when the models are optional, give None); a folder, FIFO or device in a model's place is named as
such; the models are then read by `Simulator.load` (which checks them against N and `mp_keep`). The
input-distribution model of the step cost (`comm_<N>_input.pt`) is loaded where it exists; one a flag names
must exist.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..core.artifacts import check_input_file
from ..core.config import CostModelFiles, comm_model_paths, input_model_path
from ..core.errors import UserError


def models_hint(N: int, mp_keep: float | None = None) -> str:
    """The commands that make the cost models a run looks for (DCT-MP's comm models with `mp_keep`)."""
    mp = "" if mp_keep is None else f" --mp_keep {mp_keep:g}"
    make = "" if mp_keep is not None else "`make reproduce` (4 devices) or "
    return (f"train them with {make}steps 3-4: python collect_compute_cost_data.py && "
            f"python train_compute_cost_model.py && python collect_comm_cost_data.py --ndevices {N}{mp} && "
            f"python train_comm_cost_model.py --ndevices {N}{mp}; or pass --compute_model/--fw_comm_model/--bw_comm_model")


def cost_model_paths(models: CostModelFiles | str | os.PathLike, N: int, mp_keep: float | None = None
                     ) -> tuple[Path, Path, Path]:
    """(compute, fw comm, bw comm) files: those `models` names, or a models folder's default files."""
    if isinstance(models, CostModelFiles):
        return models.paths(N, mp_keep)
    return (Path(models) / "compute.pt", *comm_model_paths(models, N, mp_keep))


def load_cost_models(models: CostModelFiles | str | os.PathLike, N: int, mp_keep: float | None = None,
                     required: bool = True):
    """The `Simulator` of the cost models for `N` devices (module docstring); None when they are missing and not
    `required`."""
    from ..sharding.simulator import Simulator

    paths = cost_model_paths(models, N, mp_keep)
    missing = [str(p) for p in paths if not os.path.lexists(p)]
    if missing:
        if required:
            raise UserError(f"cost models not found: {', '.join(missing)}; {models_hint(N, mp_keep)}")
        return None
    for p in paths:  # a folder, FIFO or device in a model's place: named as such
        check_input_file(p, "cost model", models_hint(N, mp_keep))
    return Simulator.load(*paths, num_devices=N, mp_keep=mp_keep, input_path=input_model_file(models, N, mp_keep))


def input_model_file(models: CostModelFiles | str | os.PathLike, N: int, mp_keep: float | None = None) -> Path | None:
    """The input-distribution model `models` names (it must exist), or its default file (beside the backward
    model) where it exists; None without one."""
    if isinstance(models, CostModelFiles):
        path, named = models.input_path(N, mp_keep)
    else:
        path, named = input_model_path(models, N), False
    if not os.path.lexists(path):
        if named:
            raise UserError(f"input-distribution model not found: {path}; make it with collect_comm_cost_data.py "
                            f"--input_dist --ndevices {N} && train_comm_cost_model.py --input_dist --ndevices {N}")
        return None
    return check_input_file(path, "input-distribution model", "pass --input_comm_model FILE")
