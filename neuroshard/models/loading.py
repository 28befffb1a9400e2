"""Where a run's cost models are: the files its flags name (`CostModelFiles`) or a models folder's default files
(`comm_model_paths`), for N devices and DCT-MP's `mp_keep`. `Simulator.from_files` loads what `locate_cost_models`
finds; it is the one entry every caller loads cost models through.

Missing files are named together in one line with the commands that make them (or, when the models are optional,
found as None); a folder, FIFO or device in a model's place is named as such. The input-distribution model of the
step cost (`comm_<N>_input.pt`, beside the backward model) is found where it exists; one a flag names must exist.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..core.artifacts import check_input_file
from ..core.config import CostModelFiles
from ..core.file_names import input_model_path, model_files
from ..core.errors import UserError

ModelPaths = tuple[Path, Path, Path]  # compute, forward comm, backward comm


def models_hint(N: int, mp_keep: float | None = None) -> str:
    """The commands that make the cost models a run looks for (DCT-MP's comm models with `mp_keep`)."""
    mp = "" if mp_keep is None else f" --mp_keep {mp_keep:g}"
    make = "" if mp_keep is not None else "`make reproduce` (4 devices) or "
    return (f"train them with {make}steps 3-4: python collect_compute_cost_data.py && "
            f"python train_compute_cost_model.py && python collect_comm_cost_data.py --ndevices {N}{mp} && "
            f"python train_comm_cost_model.py --ndevices {N}{mp}; or pass --compute_model/--fw_comm_model/--bw_comm_model")


def cost_model_paths(models: CostModelFiles | str | os.PathLike, N: int, mp_keep: float | None = None) -> ModelPaths:
    """(compute, fw comm, bw comm) files: those `models` names, or a models folder's default files."""
    if isinstance(models, CostModelFiles):
        return models.paths(N, mp_keep)
    return model_files(models, N, mp_keep)


def locate_cost_models(models: CostModelFiles | str | os.PathLike, N: int, mp_keep: float | None = None,
                       required: bool = True) -> tuple[ModelPaths, Path | None] | None:
    """The three model files and the input-distribution model's (None without one), each checked to be a file
    (module docstring); None when the three are missing and not `required`."""
    paths = cost_model_paths(models, N, mp_keep)
    missing = [str(p) for p in paths if not os.path.lexists(p)]
    if missing:
        if required:
            raise UserError(f"cost models not found: {', '.join(missing)}; {models_hint(N, mp_keep)}")
        return None
    for p in paths:  # a folder, FIFO or device in a model's place: named as such
        check_input_file(p, "cost model", models_hint(N, mp_keep))
    return paths, input_model_file(models, N, mp_keep)


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
