"""The names of the files the pipeline's steps write and read (DESIGN.md §3): the one definition of each.

A step's default paths (`core.config`), the writers and readers, and the pipeline's skip checks take a file's
name from here, so that no name is spelt twice. The folders are the defaults of the steps' flags, relative to
the working folder; every function takes the folder it names a file in. `mp_keep` is DCT-MP's share of the
all-to-all sent (None: uncompressed): comm files made for it carry `_mp<K>` in their names.
"""
from __future__ import annotations

from pathlib import Path

# the pipeline's folders (tools/run_pipeline.py puts them under --work_dir)
DATASET_DIR = "data/dlrm_datasets"   # step 1: the processed dataset
TASKS_DIR = "data/tasks"             # step 2: sharding tasks, one file per split
COST_DATA_DIR = "data/cost_data"     # step 3: measured cost samples
FAMILY_TABLES_DIR = "data/family_tables"  # step 3 with the family mix: the family tables
MODELS_DIR = "models"                # step 4: the cost models
RESULTS_DIR = "results"              # steps 5-6 and the report

DATASET_TABLES, DATASET_INDICES = "tables.pkl", "indices.pt"  # a processed dataset folder holds these two
DATASET_FILES = (DATASET_TABLES, DATASET_INDICES)
COMPUTE_DATA = "compute_cost_data.pkl"
COMPUTE_MODEL = "compute.pt"


def mp_tag(mp_keep: float | None) -> str:
    """The part of a comm file name that says how the all-to-all was sent: '' or '_mp0.05'."""
    return "" if mp_keep is None else f"_mp{mp_keep:g}"


def tasks_path(tasks_dir: str | Path, split: str) -> Path:
    """The task file of one split (train, test): TASKS_DIR/<split>.pkl."""
    return Path(tasks_dir) / f"{split}.pkl"


def compute_data_path(data_dir: str | Path) -> Path:
    """The compute cost-data file: compute_cost_data.pkl."""
    return Path(data_dir) / COMPUTE_DATA


def comm_data_path(data_dir: str | Path, num_devices: int, mp_keep: float | None = None,
                   input_dist: bool = False, collectives: bool = False) -> Path:
    """The comm cost-data file of `num_devices` ranks: comm_cost_data_<N>.pkl, or ..._<N>_mp<K>.pkl compressed, or
    ..._<N>_input.pkl for the input distribution, or ..._<N>_collectives.pkl for the row-wise and data-parallel
    collectives."""
    tag = "_collectives" if collectives else "_input" if input_dist else mp_tag(mp_keep)
    return Path(data_dir) / f"comm_cost_data_{num_devices}{tag}.pkl"


def compute_model_path(models_dir: str | Path) -> Path:
    """The compute cost model: compute.pt."""
    return Path(models_dir) / COMPUTE_MODEL


def comm_model_paths(models_dir: str | Path, num_devices: int, mp_keep: float | None = None) -> tuple[Path, Path]:
    """The forward and backward comm cost models for `num_devices` devices (and DCT-MP's `mp_keep`):
    comm_<N>[_mp<K>]_fw.pt and comm_<N>[_mp<K>]_bw.pt."""
    d, tag = Path(models_dir), mp_tag(mp_keep)
    return d / f"comm_{num_devices}{tag}_fw.pt", d / f"comm_{num_devices}{tag}_bw.pt"


def model_files(models_dir: str | Path, num_devices: int, mp_keep: float | None = None) -> tuple[Path, Path, Path]:
    """A models folder's (compute, forward comm, backward comm) cost models for `num_devices` devices."""
    return (compute_model_path(models_dir), *comm_model_paths(models_dir, num_devices, mp_keep))


def collective_model_path(models_dir: str | Path, num_devices: int) -> Path:
    """The row-wise and data-parallel collectives' costs for `num_devices` devices: comm_<N>_collectives.json."""
    return Path(models_dir) / f"comm_{num_devices}_collectives.json"


def input_model_path(models_dir: str | Path, num_devices: int) -> Path:
    """The input-distribution model for `num_devices` devices: comm_<N>_input.pt (one serves every mp_keep)."""
    return Path(models_dir) / f"comm_{num_devices}_input.pt"


def plan_ratios_path(models_dir: str | Path, num_devices: int) -> Path:
    """Each search's measured / modelled cost ratios on the training tasks (eval.py --plan_ratios_out):
    plan_ratios_<N>.json."""
    return Path(models_dir) / f"plan_ratios_{num_devices}.json"


def sim_results_path(results_dir: str | Path, tag: str | int) -> Path:
    """Step 5's results CSV: sim_<tag>.csv (the tag: the algorithms, or the pipeline's device count)."""
    return Path(results_dir) / f"sim_{tag}.csv"


def eval_results_path(results_dir: str | Path, tag: str | int) -> Path:
    """Step 6's results CSV: eval_<tag>.csv (the tag as `sim_results_path`'s)."""
    return Path(results_dir) / f"eval_{tag}.csv"


def ratio_results_path(results_csv: str | Path) -> Path:
    """Step 6's rows of the --ratio_tasks plans beside its results CSV: <stem>_ratio_tasks.csv."""
    path = Path(results_csv)
    return path.with_name(f"{path.stem}_ratio_tasks.csv")


def meta_path(path: str | Path) -> Path:
    """The provenance sidecar of a results file: <file>.meta.json beside it."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


def progress_path(results_csv: str | Path) -> Path:
    """Step 6's progress log of a results CSV: <csv>.progress.pkl beside it."""
    path = Path(results_csv)
    return path.with_name(path.name + ".progress.pkl")


CALIBRATION_SUFFIX = ".calibration.pt"


def calibration_path(plan_path: str | Path) -> Path:
    """Where `shard_tables --calibrate` saves the calibrated models of a plan: beside it, `<plan>.calibration.pt`."""
    plan_path = Path(plan_path)
    return plan_path.with_name(plan_path.stem + CALIBRATION_SUFFIX)
