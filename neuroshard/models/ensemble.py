"""Ensemble members of the cost models: how much a predicted cost depends on which samples were collected.

Member k (k = 1..K) is the same three (or four, with the input-distribution model) cost models trained on the same
cost-data files by the same drivers (`fitting.py`), with its own training seed and the training split resampled with
replacement (`FitConfig.bootstrap = k`). A member is an ordinary models folder, `<models>/ensemble/b<k>/`, so it
is loaded, checked and refused exactly as the pre-trained models are (`Simulator.from_files`). The pre-trained models
themselves stay as they are: the paper's NeuroShard never reads the members.

`sharding/risk.py` turns the members' costs of one plan into a predicted mean and spread, and a search that ranks
by mean + lambda x spread (`--alg neuroshard_risk`).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from ..core.config import EnsembleConfig, TrainCommConfig, TrainComputeConfig
from ..core.errors import UserError
from ..core.file_names import comm_data_path, compute_model_path, input_model_path, model_files
from .cost_models import ComputeCostModel
from .fitting import train_comm_models, train_compute_model
from .loading import models_hint

ENSEMBLE_DIR = "ensemble"


def member_dir(models_dir: str | Path, k: int) -> Path:
    """Member k's models folder: <models>/ensemble/b<k>."""
    return Path(models_dir) / ENSEMBLE_DIR / f"b{k}"


def member_dirs(models_dir: str | Path) -> list[Path]:
    """The member folders under `models_dir` (b1, b2, ... while they exist, in order)."""
    out, k = [], 1
    while member_dir(models_dir, k).is_dir():
        out.append(member_dir(models_dir, k))
        k += 1
    return out


def member_files(models_dir: str | Path, num_devices: int, k: int, input_dist: bool) -> list[Path]:
    """The files member k holds once trained."""
    d = member_dir(models_dir, k)
    return [*model_files(d, num_devices), *([input_model_path(d, num_devices)] if input_dist else [])]


def train_members(cfg: EnsembleConfig) -> list[Path]:
    """Train members 1..`cfg.members` from the cost data in `cfg.data_dir` (what the models in `cfg.models_dir`
    were trained on), with the compute model's input transform; each model is written atomically, and a member's
    models already there are kept (an interrupted run resumes)."""
    cfg.check()
    primary = compute_model_path(cfg.models_dir)
    if not primary.is_file():
        raise UserError(f"{primary} is missing; the members are trained beside the pre-trained models: train them "
                        f"first ({models_hint(cfg.ndevices)})")
    transform = ComputeCostModel.load(primary).input_transform
    input_dist = comm_data_path(cfg.data_dir, cfg.ndevices, None, True).is_file()
    for k in tqdm(range(1, cfg.members + 1), desc="ensemble members", leave=False):
        f = replace(cfg.fit, seed=cfg.fit.seed + k, bootstrap=k)
        compute, fw, bw, *inp = member_files(cfg.models_dir, cfg.ndevices, k, input_dist)
        if not compute.is_file():
            train_compute_model(TrainComputeConfig(data_dir=cfg.data_dir, dataset_dir=cfg.dataset_dir,
                                                   out_path=str(compute), fit=f, input_transform=transform))
        if not (fw.is_file() and bw.is_file()):
            train_comm_models(TrainCommConfig(data_dir=cfg.data_dir, ndevices=cfg.ndevices, fw_out_path=str(fw),
                                              bw_out_path=str(bw), fit=f))
        if inp and not inp[0].is_file():
            train_comm_models(TrainCommConfig(data_dir=cfg.data_dir, ndevices=cfg.ndevices, input_dist=True,
                                              input_out_path=str(inp[0]), fit=f))
    print(f"saved {cfg.members} ensemble members in {Path(cfg.models_dir) / ENSEMBLE_DIR}")
    return [member_dir(cfg.models_dir, k) for k in range(1, cfg.members + 1)]
