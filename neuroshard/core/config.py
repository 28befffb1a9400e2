"""Typed configs of the pipeline steps: one dataclass per step, whose fields are the step's flags.

The defaults live here and only here, except the names of files and folders, which `core.file_names` gives
(the default paths here are built from it). Scripts build their argument parsers from these classes
(`core.cli.add_config_args`) and hand the library one config (`core.cli.config_from_args`); the
library's step functions take the config, never flag strings. Field metadata:
- `help`: the flag's help text;
- `parse`: the name of a `core.cli` text parser for fields a user gives as text on the command line
  (`int_range` for "10,60", `float_range`, `int_list` for "0,1,3" or "64,32", `str_list` for
  "neuroshard,dim_greedy", `on_off` for a bool given as on or off); the config itself always holds the
  parsed value;
- `aliases`: extra spellings of the flag;
- `choices`: the values the flag takes;
- `none_if_absent`: the parsed arguments hold None for a flag left out (--ndevices under torchrun).
A field whose type is itself a config (hardware, cost-model files, search parameters) adds its
fields as flags of the step. `check()` range-checks a config and returns it; error messages name
the flag, which is also the field's name.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .artifacts.atomic import check_output_file
from .errors import UserError, check_float, check_int, check_range
from .file_names import (COST_DATA_DIR, DATASET_DIR, MODELS_DIR, RESULTS_DIR, TASKS_DIR, comm_data_path,
                         comm_model_paths, compute_data_path, compute_model_path, eval_results_path,
                         collective_model_path, input_model_path, sim_results_path, tasks_path)
from .costs import check_max_mem_gb


def flag(default, help: str = "", parse: str | None = None, aliases: tuple[str, ...] = (), bare=None,
         choices: tuple | None = None, none_if_absent: bool = False):
    """A config field that is also a command-line flag; `bare`: the value the flag takes when given without one;
    `choices`: the only values the flag takes (argparse refuses others in one line); `none_if_absent`: the parsed
    arguments hold None when the flag is left out (the config still takes `default`), so a script can tell a
    value given from the default."""
    md = {"help": help, "parse": parse, "aliases": aliases, "bare": bare, "choices": choices,
          "none_if_absent": none_if_absent}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=md)
    return field(default=default, metadata=md)


MP_KEEP_HELP = ("DCT-MP: the fraction of each sample's pooled-embedding entries the all-to-all sends "
                "(0 < K <= 1; 1 = uncompressed); default: uncompressed")


def check_mp_keep(mp_keep: float | None) -> float | None:
    """--mp_keep: None (uncompressed) or a fraction in (0, 1]; 1 sends everything and means uncompressed (None)."""
    if mp_keep is None:
        return None
    mp_keep = check_float("--mp_keep", mp_keep, 0.0, 1.0, lo_open=True)
    return None if mp_keep >= 1 else mp_keep


def mp_text(mp_keep: float | None) -> str:
    return "uncompressed" if mp_keep is None else f"DCT-MP compressed (mp_keep {mp_keep:g})"


def check_iters(warmup_iter: int, num_iter: int) -> None:
    check_int("--warmup_iter", warmup_iter, 0, 100_000)
    check_int("--num_iter", num_iter, 1, 100_000)


# ----------------------------------------------------------------------------- shared groups

def gpu_devices_flag():
    """--gpu_devices, one definition for every config that takes it (HardwareConfig, CommCollectConfig,
    PipelineConfig): GPU ids as "0,1,3", None for CPU ranks; `HardwareConfig.check` checks it."""
    return flag(None, "comma-separated GPU ids, one rank/worker each (CUDA)", parse="int_list")


@dataclass
class HardwareConfig:
    """Where costs are measured (DESIGN.md §4)."""
    device: str = flag("auto", "auto, cpu or cuda")
    backend: str = flag("auto", "auto, fbgemm or torch")
    gpu_devices: tuple[int, ...] | None = gpu_devices_flag()

    def check(self) -> "HardwareConfig":
        if self.gpu_devices is not None:
            ids = list(self.gpu_devices)
            if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
                raise UserError(f"--gpu_devices must list distinct GPU ids >= 0, got {self.gpu_devices!r}")
        return self

    @property
    def gpu_ids(self) -> list[int] | None:
        """The GPU ids as the launchers take them (None: CPU ranks)."""
        return list(self.gpu_devices) if self.gpu_devices else None

    def num_ranks(self, ndevices: int) -> int:
        """Ranks of a run: one per GPU id when given, else `ndevices` CPU processes."""
        return len(self.gpu_devices) if self.gpu_devices else ndevices


@dataclass
class CostModelFiles:
    """The three pre-trained cost models (DESIGN.md §3.3)."""
    compute_model: str = flag(str(compute_model_path(MODELS_DIR)))
    fw_comm_model: str | None = flag(None, "default models/comm_<N>_fw.pt (with --mp_keep K: comm_<N>_mpK_fw.pt)")
    bw_comm_model: str | None = flag(None, "default models/comm_<N>_bw.pt (with --mp_keep K: comm_<N>_mpK_bw.pt)")
    input_comm_model: str | None = flag(None, "TorchRec's input distribution for the step cost; default "
                                              "comm_<N>_input.pt beside the backward model, where it exists "
                                              "(without one the backward model prices it)")

    def paths(self, num_devices: int, mp_keep: float | None = None) -> tuple[Path, Path, Path]:
        check_not_empty(compute_model=self.compute_model, fw_comm_model=self.fw_comm_model,
                        bw_comm_model=self.bw_comm_model, input_comm_model=self.input_comm_model)
        fw, bw = comm_model_paths(MODELS_DIR, num_devices, mp_keep)
        return Path(self.compute_model), Path(self.fw_comm_model or fw), Path(self.bw_comm_model or bw)

    def input_path(self, num_devices: int, mp_keep: float | None = None) -> tuple[Path, bool]:
        """The input-distribution model's file (default: beside the backward model), and whether it was named (a
        named one must exist)."""
        if self.input_comm_model:
            return Path(self.input_comm_model), True
        return input_model_path(self.paths(num_devices, mp_keep)[2].parent, num_devices), False


def check_not_empty(**paths) -> None:
    """Refuse a path flag given as an empty string (it would silently mean its default file)."""
    for name, value in paths.items():
        if value is not None and not str(value).strip():
            raise UserError(f"--{name} is empty; name a file, or leave the flag out for its default")


def check_input_dist(input_dist: bool, mp_keep: float | None, collectives: bool = False) -> None:
    if input_dist and mp_keep is not None:
        raise UserError("--input_dist measures TorchRec's input distribution, which DCT-MP does not compress; drop "
                        "--mp_keep (one input-distribution model serves every --mp_keep)")
    if collectives and (input_dist or mp_keep is not None):
        raise UserError("--collectives measures the row-wise and data-parallel collectives alone; drop "
                        f"{'--input_dist' if input_dist else '--mp_keep'}")


@dataclass(frozen=True)
class SearchParams:
    """NeuroShard's search parameters (DESIGN.md §3.5, the paper's values)."""
    beam_width: int = flag(3)
    num_candidates: int = flag(10)
    max_splits: int = flag(10)
    grid_steps: int = flag(11)
    threshold_range: tuple[float, float] = flag((1.0, 1.5), "dim-sum caps of the grid search: lo,hi",
                                                parse="float_range")
    risk_lambda: float = flag(1.0, "--alg neuroshard_risk ranks plans by the ensemble's mean cost + this many "
                                   "standard deviations")

    def check(self) -> "SearchParams":
        check_range("--threshold_range", self.threshold_range, 0.0, strict=False)
        check_int("--beam_width", self.beam_width, 1, 100)
        check_int("--num_candidates", self.num_candidates, 1, 1000)
        check_int("--max_splits", self.max_splits, 0, 1000)
        check_int("--grid_steps", self.grid_steps, 1, 1000)
        check_float("--risk_lambda", self.risk_lambda, 0.0, 10.0)
        lo, hi = self.threshold_range
        if lo < 1.0:
            raise UserError(f"--threshold_range must start at >= 1.0 (a dim-sum cap below the mean cannot place "
                            f"every table), got {lo:g},{hi:g}")
        if self.grid_steps > 1 and lo == hi:
            raise UserError("--threshold_range lo == hi needs --grid_steps 1")
        return self

    def thresholds(self):
        return np.linspace(self.threshold_range[0], self.threshold_range[1], self.grid_steps)


@dataclass
class FitConfig:
    """How a cost model is trained (DESIGN.md §3.3)."""
    epochs: int = flag(300)
    train_ratio: float = flag(0.8)
    valid_ratio: float = flag(0.1)
    batch_size: int = flag(512)
    num_samples: int | None = flag(None, "use the first N samples (default all)")
    lr: float = flag(1e-3)
    seed: int = flag(0)
    bootstrap: int = flag(0, "train on a resample (with replacement, drawn with this seed) of the training split: "
                             "one member of an ensemble (0: the samples as they are)")

    def check(self, min_samples: int = 10) -> "FitConfig":
        check_int("--epochs", self.epochs, 1, 1_000_000)
        check_int("--batch_size", self.batch_size, 1, 1 << 24)
        check_float("--lr", self.lr, 0.0, 10.0, lo_open=True)
        check_float("--train_ratio", self.train_ratio, 0.0, 1.0, lo_open=True, hi_open=True)
        check_float("--valid_ratio", self.valid_ratio, 0.0, 1.0, lo_open=True, hi_open=True)
        if self.train_ratio + self.valid_ratio >= 1:
            raise UserError("--train_ratio + --valid_ratio must be < 1 (the rest is the test split)")
        check_int("--seed", self.seed, 0)
        check_int("--bootstrap", self.bootstrap, 0)
        if self.num_samples is not None:
            check_int("--num_samples", self.num_samples, min_samples)
        return self


# ----------------------------------------------------------------------------- steps 1-2: data

@dataclass
class DatasetConfig:
    """Step 1 (tools/gen_dlrm_data.py): raw DLRM dataset (real file or synthetic) -> processed dataset."""
    data: str | None = flag(None, "raw dataset (.pt or .pt.gz), e.g. fbgemm_t856_bs65536.pt")
    synthetic: bool = flag(False, "generate a DLRM-like raw dataset instead")
    out_dir: str = flag(DATASET_DIR, aliases=("--out-dir",))
    seed: int = flag(0)
    num_tables: int = flag(856, "synthetic: number of tables")
    batch_size: int = flag(4096, "synthetic: samples in the batch")
    row_scale: float = flag(1.0, "synthetic: multiply row counts (e.g. 0.01 for small machines)")
    save_raw: str | None = flag(None, "synthetic: also write the raw tuple here (.pt / .pt.gz)")

    def check(self) -> "DatasetConfig":
        if self.data is not None and self.synthetic:
            raise UserError("pass either --data FILE or --synthetic, not both")
        return self


@dataclass
class TasksConfig:
    """Step 2 (tools/gen_tasks.py): draw sharding tasks from a processed dataset into OUT_DIR/SPLIT.pkl."""
    seed: int = flag(0)
    data_size: int = flag(100, "number of tasks")
    T_range: tuple[int, int] = flag((10, 60), "tables per task: lo,hi (hi exclusive)", parse="int_range")
    max_mem: float = flag(15.0, "total size budget of a task, GB")
    max_dim: int = flag(128, "dims drawn from max_dim, max_dim/2, ... (divisible by 4)")
    data_dir: str = flag(DATASET_DIR, "processed dataset folder")
    out_dir: str = flag(TASKS_DIR)
    split: str = flag("test", "file name: OUT_DIR/SPLIT.pkl (e.g. train, test)")

    def check(self) -> "TasksConfig":
        check_range("--T_range", self.T_range, 1, strict=True)
        check_int("--data_size", self.data_size, 1, 1_000_000)
        check_int("--T_range upper bound", self.T_range[1], 2, 100_000)
        check_max_mem_gb(self.max_mem)
        check_int("--seed", self.seed, 0)
        if not self.split or any(c in self.split for c in "/\\") or self.split.startswith("."):
            raise UserError(f"--split must be a plain file name such as train or test, got {self.split!r}")
        return self


# ----------------------------------------------------------------------------- step 3: cost data

@dataclass
class ComputeCollectConfig:
    """Step 3a (collect_compute_cost_data.py): compute cost of random shards (DESIGN.md §3.1)."""
    data_size: int = flag(1000, "samples the output file should hold")
    workers: int | None = flag(None, "worker processes: on CPU one thread each (default: CPU count); "
                                     "on CUDA one GPU each (default: every visible GPU)")
    max_tables: int = flag(15)
    max_mem: float = flag(4.0, "GB per shard")
    max_dim: int = flag(128)
    dataset_dir: str = flag(DATASET_DIR)
    out_dir: str = flag(COST_DATA_DIR)
    batch_size: int | None = flag(None, "first B samples of the dataset batch (default all)")
    warmup_iter: int = flag(5)
    num_iter: int = flag(10)
    seed: int = flag(0)
    families_dir: str | None = flag(None, "also draw shards from the table families (DESIGN.md §8), built in "
                                          "this folder (e.g. data/family_tables)")
    family_share: tuple[tuple[str, float], ...] | None = flag(
        None, "share of samples per family, e.g. dataset=0.4,one_hot=0.1,... (default: the documented mix)",
        parse="shares")
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    salvage: bool = flag(False, "keep the good records of a damaged file (the damaged ones are dropped)")

    def check(self) -> "ComputeCollectConfig":
        check_int("--data_size", self.data_size, 1, 10_000_000)
        if self.workers is not None:
            check_int("--workers", self.workers, 1, 1024)
        check_int("--max_tables", self.max_tables, 1, 1000)
        check_max_mem_gb(self.max_mem)
        check_iters(self.warmup_iter, self.num_iter)
        check_int("--seed", self.seed, 0)
        self.hardware.check()
        return self


@dataclass
class CommCollectConfig:
    """Step 3b (collect_comm_cost_data.py): all-to-all costs for dim layouts and delays (DESIGN.md §3.2)."""
    data_size: int = flag(1000, "samples the output file should hold")
    gpu_devices: tuple[int, ...] | None = gpu_devices_flag()
    ndevices: int = flag(4, "number of ranks (CPU processes); default 4, or under torchrun its world size (another "
                            "value is refused)", none_if_absent=True)
    T_range: tuple[int, int] = flag((10, 60), parse="int_range")
    sleep_range: tuple[float, float] = flag((1.0, 20.0), "straggler spread range, ms", parse="float_range")
    max_dim: int = flag(128)
    batch_size: int = flag(4096, "global batch (divisible by the number of ranks)")
    warmup_iter: int = flag(5)
    num_iter: int = flag(10)
    seed: int = flag(0)
    device: str = flag("auto")
    out_dir: str = flag(COST_DATA_DIR)
    salvage: bool = flag(False, "keep the good records of a damaged file (the damaged ones are dropped)")
    mp_keep: float | None = flag(None, MP_KEEP_HELP + "; writes comm_cost_data_<N>_mp<K>.pkl")
    input_dist: bool = flag(False, "measure TorchRec's input distribution (its KJTAllToAll of ids and lengths; "
                                   "T_range features per sample, one-hot or multi-hot) instead of the pooled "
                                   "all-to-alls; writes comm_cost_data_<N>_input.pkl")
    collectives: bool = flag(False, "measure the collectives of TorchRec's row-wise and data-parallel groups "
                                    "(reduce-scatter, all-gather, all-reduce) at widths drawn per sample instead; "
                                    "writes comm_cost_data_<N>_collectives.pkl")

    def check(self, num_ranks: int) -> "CommCollectConfig":
        HardwareConfig(gpu_devices=self.gpu_devices).check()
        self.mp_keep = check_mp_keep(self.mp_keep)
        check_input_dist(self.input_dist, self.mp_keep, self.collectives)
        check_int("--ndevices", num_ranks, 2, 1024)
        check_int("--data_size", self.data_size, 1, 10_000_000)
        check_range("--T_range", self.T_range, 1, strict=True)
        check_range("--sleep_range", self.sleep_range, 0.0, strict=False)
        check_float("--sleep_range upper bound", self.sleep_range[1], 0.0, 10_000.0)
        check_iters(self.warmup_iter, self.num_iter)
        check_int("--seed", self.seed, 0)
        if check_int("--batch_size", self.batch_size, 1, 1 << 24) % num_ranks:
            raise UserError(f"--batch_size {self.batch_size} is not divisible by {num_ranks} ranks; "
                            f"use a multiple of {num_ranks}")
        return self


# ----------------------------------------------------------------------------- step 4: cost models

@dataclass
class TrainComputeConfig:
    """Step 4a (train_compute_cost_model.py): pre-train the compute cost model."""
    data_dir: str = flag(COST_DATA_DIR, "folder with compute_cost_data.pkl")
    dataset_dir: str = flag(DATASET_DIR, "processed dataset the samples came from")
    out_path: str = flag(str(compute_model_path(MODELS_DIR)))
    families_dir: str | None = flag(None, "family tables of the cost data (default: the folder it names)")
    input_transform: str = flag("raw", "model inputs: raw (the paper's z-normalised features) or log "
                                "(log rows and log(1 + pooling) first; README, table families)")
    fit: FitConfig = field(default_factory=FitConfig)
    salvage: bool = flag(False, "keep the good records of a damaged file (the damaged ones are dropped)")

    @property
    def data_path(self) -> Path:
        return compute_data_path(self.data_dir)


@dataclass
class EnsembleConfig:
    """train_ensemble.py: the cost models' ensemble members (<models_dir>/ensemble/b<k>/), each trained on a
    resample of the cost data the models in --models_dir were trained on; `--alg neuroshard_risk` and the
    predicted intervals read them."""
    data_dir: str = flag(COST_DATA_DIR, "folder with the cost data (compute_cost_data.pkl, comm_cost_data_<N>.pkl)")
    dataset_dir: str = flag(DATASET_DIR, "processed dataset the samples came from")
    models_dir: str = flag(MODELS_DIR, "the pre-trained models; the members go to its ensemble/ folder")
    ndevices: int = flag(4)
    members: int = flag(5, "ensemble members (2-100)")
    fit: FitConfig = field(default_factory=FitConfig)

    def check(self) -> "EnsembleConfig":
        check_int("--ndevices", self.ndevices, 2, 4096)
        check_int("--members", self.members, 2, 100)
        self.fit.check()
        return self


@dataclass
class TrainCommConfig:
    """Step 4b (train_comm_cost_model.py): pre-train the forward and backward comm cost models."""
    data_dir: str = flag(COST_DATA_DIR, "folder with comm_cost_data_<N>.pkl")
    ndevices: int = flag(4)
    fw_out_path: str | None = flag(None, "default models/comm_<N>_fw.pt (with --mp_keep K: comm_<N>_mpK_fw.pt)")
    bw_out_path: str | None = flag(None, "default models/comm_<N>_bw.pt (with --mp_keep K: comm_<N>_mpK_bw.pt)")
    mp_keep: float | None = flag(None, MP_KEEP_HELP + "; reads comm_cost_data_<N>_mp<K>.pkl")
    fw_wait_term: bool = flag(False, "forward model = MLP + each rank's wait for the last-ready rank (max delay - "
                                     "its delay), so the MLP learns only the transfer; holds beyond the "
                                     "collected --sleep_range (default off: the paper's model)")
    input_dist: bool = flag(False, "train the input-distribution model from comm_cost_data_<N>_input.pkl instead")
    input_out_path: str | None = flag(None, "with --input_dist: default models/comm_<N>_input.pt")
    collectives: bool = flag(False, "fit the row-wise and data-parallel collectives' costs from "
                                    "comm_cost_data_<N>_collectives.pkl instead")
    collectives_out_path: str | None = flag(None, "with --collectives: default models/comm_<N>_collectives.json")
    fit: FitConfig = field(default_factory=FitConfig)
    salvage: bool = flag(False, "keep the good records of a damaged file (the damaged ones are dropped)")

    @property
    def data_path(self) -> Path:
        check_input_dist(self.input_dist, check_mp_keep(self.mp_keep), self.collectives)
        return comm_data_path(self.data_dir, self.ndevices, check_mp_keep(self.mp_keep), self.input_dist,
                              self.collectives)

    def input_out(self) -> Path:
        check_not_empty(input_out_path=self.input_out_path)
        check_output_file(self.input_out_path, "--input_out_path")
        return Path(self.input_out_path or input_model_path(MODELS_DIR, self.ndevices))

    def collectives_out(self) -> Path:
        check_not_empty(collectives_out_path=self.collectives_out_path)
        check_output_file(self.collectives_out_path, "--collectives_out_path")  # before Path() drops a trailing '/'
        return Path(self.collectives_out_path or collective_model_path(MODELS_DIR, self.ndevices))

    def out_paths(self) -> tuple[Path, Path]:
        check_not_empty(fw_out_path=self.fw_out_path, bw_out_path=self.bw_out_path)
        fw, bw = comm_model_paths(MODELS_DIR, self.ndevices, check_mp_keep(self.mp_keep))
        return Path(self.fw_out_path or fw), Path(self.bw_out_path or bw)


# ----------------------------------------------------------------------------- steps 5-6: evaluation

@dataclass
class EvalSimConfig:
    """Step 5 (eval_simulator.py): shard every task with each algorithm, score the plans with the cost models."""
    data_dir: str = flag(DATASET_DIR, "processed dataset")
    task_path: str = flag(str(tasks_path(TASKS_DIR, "test")))
    alg: tuple[str, ...] = flag(("neuroshard",), "algorithm, comma-separated list, all, or plan:FILE",
                                parse="str_list")
    ndevices: int = flag(4)
    max_mem: float = flag(4.0, "memory of one device, GB")
    results_csv: str | None = flag(None, f"default {sim_results_path(RESULTS_DIR, '<alg>')}")
    seed: int = flag(0)
    mp_keep: float | None = flag(None, MP_KEEP_HELP + "; plans and scores with the comm models made for it")
    models: CostModelFiles = field(default_factory=CostModelFiles)
    search: SearchParams = field(default_factory=SearchParams)

    def check(self) -> "EvalSimConfig":
        check_int("--seed", self.seed, 0)
        self.mp_keep = check_mp_keep(self.mp_keep)
        self.search.check()
        return self


@dataclass
class EvalConfig(EvalSimConfig):
    """Step 6 (eval.py): shard every task with each algorithm, then measure the plans on hardware.

    The fields of step 5 (some with their own help), and how the plans are measured."""
    ndevices: int = flag(4, "ranks (CPU processes) when not on GPUs")
    results_csv: str | None = flag(None, f"default {eval_results_path(RESULTS_DIR, '<alg>')}")
    mp_keep: float | None = flag(None, MP_KEEP_HELP + "; plans with the comm models made for it and measures "
                                 "plans with the compressed all-to-all")
    batch_size: int | None = flag(None, "first B samples of the dataset batch (default all)")
    warmup_iter: int = flag(10)
    num_iter: int = flag(100, "timed iterations of a plan, over all rounds")
    rounds: int = flag(5, "each task's plans are measured interleaved in this many rounds; cost = geometric mean over rounds")
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    salvage: bool = flag(False, "keep the good records of a damaged progress log (the damaged ones are measured "
                                "again)")
    plan_ratios: str | None = flag(None, "a file written by --plan_ratios_out on other (training) tasks: the plans of "
                                   "the algorithms it names are stated at the models' cost x their measured / "
                                   "modelled ratio there, with a 90 percent interval (sharding/plan_ratios.py)")
    plan_ratios_out: str | None = flag(None, "after measuring, write each algorithm's measured / modelled cost ratios "
                                       "here, for --plan_ratios of a run on other tasks")
    ratio_tasks: str | None = flag(None, "a task file of other (training) tasks: the searches' plans for them are "
                                   "measured interleaved with these plans, and each search's measured / modelled "
                                   "ratio there states its plans here, as --plan_ratios would, but measured in the "
                                   "same minutes (their rows: <results_csv stem>_ratio_tasks.csv; with "
                                   "--plan_ratios_out the ratios are written too)")

    def check(self) -> "EvalConfig":
        super().check()
        check_iters(self.warmup_iter, self.num_iter)
        check_int("--rounds", self.rounds, 1, 1000)
        self.hardware.check()
        check_not_empty(plan_ratios=self.plan_ratios, plan_ratios_out=self.plan_ratios_out,
                        ratio_tasks=self.ratio_tasks)
        if self.ratio_tasks and self.plan_ratios:
            raise UserError("--ratio_tasks and --plan_ratios both say where the stated costs' ratios come from; "
                            "give one of them")
        return self


# ----------------------------------------------------------------------------- a user's own tables

# Defaults of --calibrate and --measure, held here once: `ShardTablesConfig` (the flags) and the library's
# `planning.calibrate.CalibrationConfig` and `planning.measure.MeasureConfig` (the Python API) take them.
DEFAULT_CALIBRATE_K = 120  # shards --calibrate measures when given without K
DEFAULT_CALIBRATE_COMM = 18  # all-to-all layouts of the user's dims calibration checks the comm models on
CALIBRATE_WARMUP_ITER, CALIBRATE_NUM_ITER = 5, 10  # per calibration shard
MEASURE_BUDGET_S = 180.0  # --measure: seconds of rounds
MEASURE_WARMUP_ITER, MEASURE_NUM_ITER = 3, 5  # --measure: per candidate per round
MEASURE_TOP = 3  # --measure: NeuroShard's best distinct plans measured
DEFAULT_CALIBRATE_DMP = 16  # random plans --calibrate_dmp measures as TorchRec steps when given without P
CALIBRATE_DMP_ROUNDS = 5  # their interleaved rounds (MEASURE_WARMUP_ITER + MEASURE_NUM_ITER steps each)
# --min_gain: a plan other than TorchRec's is handed out only when the cost models rate it at least this share
# cheaper: plans the step cost rates within a few per cent of each other can run in another order in TorchRec's
# own step (docs/findings.md), so a smaller predicted gain does not justify leaving TorchRec's plan.
MIN_GAIN = 0.05


def check_min_gain(min_gain: float, name: str = "--min_gain") -> float:
    """`--min_gain` / `min_gain=` (`name`: as the caller's user sets it): a share in [0, 1)."""
    check_float(name, min_gain, 0.0, 1.0, hi_open=True)
    return float(min_gain)


def check_measure(budget_s: float, top_k: int, warmup_iter: int, num_iter: int) -> None:
    """The range checks of --measure's settings (the flags and `MeasureConfig` alike)."""
    check_iters(warmup_iter, num_iter)
    check_float("--measure_budget_s", budget_s, 0.0, lo_open=True)
    check_int("--measure_top", top_k, 3, 100)


def check_calibrate(num_shards: int, comm_layouts: int, dmp_plans: int = 0, dmp_rounds: int = CALIBRATE_DMP_ROUNDS
                    ) -> None:
    """The range checks of --calibrate K, --calibrate_comm and --calibrate_dmp P (the flags and
    `CalibrationConfig` alike); P = 0: no step fit. P >= 12 leaves the fit 7 plans and 5 held out."""
    check_int("--calibrate", num_shards, 15, 100_000)
    check_int("--calibrate_comm", comm_layouts, 15, 100_000)
    if dmp_plans:
        check_int("--calibrate_dmp", dmp_plans, 12, 1000)
    check_int("--calibrate_dmp rounds", dmp_rounds, 2, 1000)


MEASURE_ENGINES = ("emulated", "torchrec")


def check_measure_engine(engine: str, mp_keep: float | None = None) -> str:
    """`--measure_engine`: one of MEASURE_ENGINES; TorchRec's own step has no DCT-MP all-to-all."""
    if engine not in MEASURE_ENGINES:
        raise UserError(f"--measure_engine must be one of {', '.join(MEASURE_ENGINES)}, got {engine!r}")
    if engine == "torchrec" and mp_keep is not None:
        raise UserError("--measure_engine torchrec measures TorchRec's own step, which has no DCT-MP all-to-all; "
                        "drop --mp_keep or use --measure_engine emulated")
    return engine


# What the simulator scores plans by (sharding/simulator.py): the paper's three terms (compute, one forward and one
# backward all-to-all) are the reproduction's default; TorchRec's step is that of a user's planning.
COSTS = ("paper", "step")
PAPER_COST, USER_COST = COSTS


@dataclass
class ShardTablesConfig:
    """tools/shard_tables.py: a user's table list (or real ids) in, a sharding plan out."""
    tables: str | None = flag(None, "CSV or JSON: name,rows,dim,pooling_factor[,bin_0..bin_16]")
    ids: str | None = flag(None, "real ids in the raw DLRM format (.pt / .pt.gz); needs --dims")
    dims: tuple[int, ...] | None = flag(None, "with --ids: one dim per table (comma-separated) or one for all",
                                        parse="int_list")
    ndevices: int = flag(4)
    max_mem: float = flag(4.0, "memory per device, GB")
    alg: str = flag("neuroshard", "any sharding algorithm (default neuroshard), or plan:FILE")
    out: str = flag("plan.json")
    torchrec_plan: str | None = flag(None, "also write the plan as a TorchRec ShardingPlan (JSON)")
    calibrate: int | None = flag(None, "[K]: measure K shards of these tables (the heaviest alone, the rest random) "
                                       "on this hardware and fine-tune the cost models on them; --calibrate alone: "
                                       f"K = {DEFAULT_CALIBRATE_K} (30-80 s for 26 tables on 4 ranks at the quick "
                                       "scale); saved beside --out and reused by later runs on the same tables and "
                                       "hardware", bare=DEFAULT_CALIBRATE_K)
    calibrate_comm: int | None = flag(None, f"(default {DEFAULT_CALIBRATE_COMM}) with --calibrate: all-to-all layouts "
                                            "of the tables' dims to check the comm models on")
    calibrate_dmp: int | None = flag(None, "[P]: with --calibrate, also measure P random plans of these tables as "
                                           "TorchRec training steps (DistributedModelParallel) on these ranks and fit "
                                           "the step cost to them (scale and per-step overhead); --calibrate_dmp "
                                           f"alone: P = {DEFAULT_CALIBRATE_DMP}", bare=DEFAULT_CALIBRATE_DMP)
    sharding_types: tuple[str, ...] | None = flag(None, "plan over these TorchRec sharding types with "
                                                        "NeuroShardPlanner (e.g. data_parallel,table_wise,column_wise,"
                                                        "row_wise): row-wise blocks, replicas and column shards, memory "
                                                        "as TorchRec counts it; default: the search's table-wise and "
                                                        "column-wise shards", parse="str_list")
    measure: bool = flag(False, "measure NeuroShard's top plans, the heuristics' and TorchRec's in interleaved "
                                "rounds and write the measured best")
    measure_engine: str = flag("emulated", "with --measure: emulated (independent devices emulated, one rank's compute "
                                           "at a time: GPU-shaped predictions) or torchrec (TorchRec's own training "
                                           "step, DistributedModelParallel, on these ranks)",
                               choices=MEASURE_ENGINES)
    cost: str = flag(USER_COST, "what the simulator and search minimise: step (TorchRec's step: per sharding group "
                                "the input distribution and both all-to-alls) or paper (compute + one forward and one "
                                "backward all-to-all, as the paper)", choices=(USER_COST, PAPER_COST))
    min_gain: float | None = flag(None, f"(default {MIN_GAIN:g}) with --alg neuroshard: hand out a plan other "
                                        "than TorchRec's only when the cost models rate it at least this share "
                                        "cheaper (0: the plan rated fastest; --measure writes the measured best "
                                        "instead)")
    measure_budget_s: float | None = flag(None, f"(default {MEASURE_BUDGET_S:g}) with --measure: stop adding rounds "
                                                "after this many seconds")
    measure_top: int | None = flag(None, f"(default {MEASURE_TOP}) with --measure: NeuroShard's best distinct plans "
                                         "to measure (>= 3)")
    no_race: bool = flag(False, "with --measure: measure every candidate in every round (default: a candidate "
                                "whose paired interval against the best lies above 1 is dropped from later rounds)")
    warmup_iter: int = flag(MEASURE_WARMUP_ITER, "warm-up iterations per plan per round (and per calibration "
                                                 f"shard: {CALIBRATE_WARMUP_ITER})")
    num_iter: int = flag(MEASURE_NUM_ITER, "timed iterations per plan per round (and per calibration shard: "
                                           f"{CALIBRATE_NUM_ITER})")
    seed: int = flag(0)
    mp_keep: float | None = flag(None, MP_KEEP_HELP + "; plans (and --measure measures) for it")
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    models: CostModelFiles = field(default_factory=CostModelFiles)
    search: SearchParams = field(default_factory=SearchParams)

    def check(self) -> "ShardTablesConfig":
        self.mp_keep = check_mp_keep(self.mp_keep)
        if (self.tables is None) == (self.ids is None):
            raise UserError("pass exactly one of --tables FILE (CSV or JSON table list) or --ids FILE (raw DLRM ids)")
        if self.ids is not None and self.dims is None:
            raise UserError("--ids needs --dims (one dim per table, or one for all), e.g. --dims 64")
        check_needed([("--dims", self.dims is not None, "--ids", self.ids is not None),
                      ("--calibrate_comm", self.calibrate_comm is not None, "--calibrate", self.calibrate is not None),
                      ("--no_race", self.no_race, "--measure", self.measure),
                      ("--measure_budget_s", self.measure_budget_s is not None, "--measure", self.measure),
                      ("--measure_top", self.measure_top is not None, "--measure", self.measure)])
        for flag_name, path in (("--out", self.out), ("--torchrec_plan", self.torchrec_plan)):
            if path is not None and not str(path).strip():
                raise UserError(f"{flag_name} is empty; name the file to write, e.g. {flag_name} plan.json")
            if path is not None and str(path).endswith(("/", os.sep)):
                raise UserError(f"{flag_name} {path} ends in '/', which names a folder; name the file to write, "
                                f"e.g. {flag_name} {path}plan.json")
        if self.measure:
            check_measure(*self.measure_settings(), self.warmup_iter, self.num_iter)
            check_measure_engine(self.measure_engine, self.mp_keep)
        elif self.measure_engine != "emulated":  # it would be ignored without a word
            raise UserError(f"--measure_engine {self.measure_engine} chooses how --measure measures; add --measure "
                            "or drop --measure_engine")
        if self.sharding_types is not None:
            if self.alg != "neuroshard":
                raise UserError(f"--sharding_types plans with NeuroShardPlanner (--alg neuroshard); drop --alg "
                                f"{self.alg} or drop --sharding_types")
            for name, given in (("--no_race", self.no_race), ("--measure_budget_s", self.measure_budget_s is not None),
                                ("--measure_top", self.measure_top is not None)):
                if given:  # it would be ignored without a word
                    raise UserError(f"{name} has no effect with --sharding_types (--measure measures NeuroShard's plan "
                                    f"and TorchRec's in a fixed number of rounds); drop {name}")
            if self.mp_keep is not None:
                raise UserError("--sharding_types plans TorchRec's own step, which has no DCT-MP all-to-all; drop "
                                "--mp_keep or drop --sharding_types")
        if self.calibrate_dmp is not None:
            if self.calibrate is None:
                raise UserError("--calibrate_dmp fits the step cost of calibrated models: pass --calibrate too, "
                                "e.g. --calibrate --calibrate_dmp")
            if self.cost != "step":
                raise UserError("--calibrate_dmp fits the step cost; drop --cost paper or drop --calibrate_dmp")
            if self.mp_keep is not None:
                raise UserError("--calibrate_dmp measures TorchRec's own step, which has no DCT-MP all-to-all; "
                                "drop --mp_keep or drop --calibrate_dmp")
            check_int("--calibrate_dmp", self.calibrate_dmp, 12, 1000)  # 0 too: the flag asks for a fit
        if self.calibrate is not None:
            check_calibrate(self.calibrate, self.comm_layouts(), self.calibrate_dmp or 0)
        check_int("--seed", self.seed, 0)
        if self.min_gain is not None:
            check_min_gain(self.min_gain)
        if self.min_gain is not None and self.alg != "neuroshard":  # it would be ignored without a word
            raise UserError(f"--min_gain applies to --alg neuroshard (the plan it hands out against TorchRec's); "
                            f"with --alg {self.alg} drop it")
        self.hardware.check()
        self.search.check()
        return self

    def measure_settings(self) -> tuple[float, int]:
        """(--measure_budget_s, --measure_top): as given, else their defaults."""
        return (MEASURE_BUDGET_S if self.measure_budget_s is None else self.measure_budget_s,
                MEASURE_TOP if self.measure_top is None else self.measure_top)

    def comm_layouts(self) -> int:
        """--calibrate_comm: as given, else its default."""
        return DEFAULT_CALIBRATE_COMM if self.calibrate_comm is None else self.calibrate_comm


def check_needed(flags: list[tuple[str, bool, str, bool]]) -> None:
    """(flag, given, the flag it needs, given): a flag that has no effect without another is refused in one line,
    never ignored without a word."""
    for name, given, needed, present in flags:
        if given and not present:
            raise UserError(f"{name} has no effect without {needed}; add {needed} or drop {name}")


# ----------------------------------------------------------------------------- DLRM training with DCT

DCT_MODES = ("none", "dp", "mp", "both")
MP_SCOPES = ("rank", "table", "sign", "sign2")  # --mp_scope: one top-k over a rank's columns, one per table shard,
# or signs (sign2: two bits an entry forward)
# hidden layers of the bottom MLP (its output is the embedding dim) and of the top MLP (its output is
# one logit), and the embedding dim. `mlperf`: the MLPerf DLRM reference (Criteo Terabyte) shape,
# bottom 13-512-256-128 and top 1024-1024-512-256-1 with embedding dim 128
# (github.com/mlcommons/training, recommendation_v2/torchrec_dlrm: --dense_arch_layer_sizes 512,256,128
# --over_arch_layer_sizes 1024,1024,512,256,1 --embedding_dim 128).
ARCHS = {"tiny": ("64-32", "64-32", 16), "mlperf": ("512-256", "1024-1024-512-256", 128)}
# the MLPs' optimizer and its default learning rate. `sgd` is plain SGD at lr 1.0, as the MLPerf DLRM
# reference trains the `mlperf` shape (github.com/facebookresearch/dlrm, bench/run_and_time.sh:
# dlrm_s_pytorch.py --learning-rate=1.0 --mini-batch-size=2048, SGD for MLPs and embeddings).
# Under DCT-DP an MLP entry arrives as one accumulated lump every few hundred steps: SGD applies the lump
# in full (error feedback then delays updates but loses none), while Adam scales each arrival to about
# its learning rate, so the entry moves far less than it would with every step's gradient.
# `sgd` is the default.
DENSE_OPTIMIZERS = {"sgd": ("SGD", 1.0), "adam": ("Adam", 1e-3)}  # --dense_opt -> (torch.optim class, default lr)
TRAIN_NDEVICES, TRAIN_MP_KEEP = 4, 0.05  # defaults of --ndevices (outside torchrun) and --mp_keep
# DCT-DP's defaults: --dp_keep, --dp_refresh, --dp_drift, --error_feedback (and `training.dct.DCTState`'s)
DP_KEEP, DP_REFRESH, DP_DRIFT, DP_ERROR_FEEDBACK = 0.005, 100, 1.5, True
RENDEZVOUS_TIMEOUT_S = 60.0  # under torchrun: how long a rank waits for the others (--rendezvous_timeout_s)


def mlp_sizes(text: str, name: str) -> tuple[int, ...]:
    """'512-256' -> (512, 256); a clear error for anything else."""
    parts = str(text).split("-")
    if not all(p.strip().isdigit() and 1 <= int(p) <= 65536 for p in parts) or len(parts) > 16:
        raise UserError(f"{name} must be layer widths joined by '-' (each 1..65536, at most 16), "
                        f"e.g. 512-256, got {text!r}")
    return tuple(int(p) for p in parts)


@dataclass
class TrainConfig:
    """One hybrid-parallel DLRM training run (tools/train_dlrm.py, DESIGN.md §5); the benchmarks build it too."""
    dataset: str = flag("movielens", "movielens (MovieLens-100K) or synthetic")
    ndevices: int = flag(TRAIN_NDEVICES, f"ranks (gloo processes); default {TRAIN_NDEVICES}, or under torchrun its "
                                         "world size (another value is refused)", none_if_absent=True)
    alg: str = flag("size_lookup_greedy", "sharding algorithm for the embedding tables")
    steps: int = flag(1000)
    batch_size: int = flag(512, "global batch")
    dct: str = flag("none", choices=DCT_MODES)
    dp_keep: float = flag(DP_KEEP, f"with --dct dp or both: share of DP gradient entries sent (default {DP_KEEP:g})",
                          none_if_absent=True)
    dp_refresh: int = flag(DP_REFRESH, "iterations between threshold updates")
    dp_drift: float = flag(DP_DRIFT, "re-estimate the DP threshold early once it would send more than this times "
                                     "the target")
    mp_keep: float = flag(TRAIN_MP_KEEP, f"with --dct mp or both: share of pooled-embedding entries sent (default "
                                         f"{TRAIN_MP_KEEP:g})", none_if_absent=True)
    mp_scope: str = flag("sign2", "what DCT-MP sends per sample: sign2 (default: a scale per table shard and two "
                                  "bits an entry forward, sign and magnitude, on shards of 88 columns or more, one "
                                  "on narrower ones; one bit back; --mp_keep sets nothing more), sign (one bit an "
                                  "entry both ways), table (each table shard's own ceil(mp_keep * width) largest "
                                  "entries) or rank (one top-k over a rank's whole width)")
    dp_adam_freeze_after: int = flag(0, "with --dense_opt adam and DCT-DP: dense DP for this many steps, then Adam's "
                                        "second moment frozen (floored) while DCT-DP compresses; 0 (default): off")
    dp_adam_floor: float = flag(0.1, "floor of the frozen second moment, as a share of its mean per parameter "
                                     "(default 0.1)")
    error_feedback: bool = flag(DP_ERROR_FEEDBACK, parse="on_off")
    dp_sync: bool = flag(False, "off (default): the DP hooks' collectives are asynchronous and overlap the rest of "
                                "backward (as DDP's own hook); on: blocking collectives, identical gradients (a "
                                "reference for tests and timing)", parse="on_off")
    arch: str = flag("tiny", "MLP shape: tiny (64-32 / 64-32, dim 16) or mlperf (512-256 / 1024-1024-512-256, dim "
                             "128)", choices=tuple(ARCHS))
    bottom_mlp: str | None = flag(None, "hidden widths of the bottom MLP, e.g. 512-256")
    top_mlp: str | None = flag(None, "hidden widths of the top MLP, e.g. 1024-1024-512-256")
    emb_dim: int | None = flag(None, "embedding dim (default: the --arch's)")
    dense_opt: str = flag("sgd", "the MLPs' optimizer (the embeddings always take SGD)",
                          choices=tuple(DENSE_OPTIMIZERS))
    lr: float | None = flag(None, "learning rate of the MLPs (default: sgd 1.0, adam 1e-3)")
    emb_lr: float = flag(0.5, "SGD learning rate of the embeddings")
    seed: int = flag(0)
    max_mem: float = flag(4.0, "GB per device for the sharding plan")
    log_every: int = flag(10, "steps per point of the loss curve")
    num_samples: int | None = flag(None, "synthetic: samples (default 200000)")
    max_rows: int | None = flag(None, "synthetic: rows of the largest table")
    evaluate: bool = flag(True, "predict the test set at the end (AUC, log loss)", parse="on_off")
    eval_every: int = flag(0, "0 (default): score the test set once, at the end; N: hold out the last tenth of the "
                              "training split for validation, score validation and test every N steps, and also "
                              "report the test scores at the step of the best validation AUC")
    rendezvous_timeout_s: float = flag(RENDEZVOUS_TIMEOUT_S, "under torchrun: seconds to wait for every rank to join before giving "
                                             "up in one line")

    def check(self) -> "TrainConfig":
        if self.dataset not in ("movielens", "synthetic"):
            raise UserError(f"--dataset must be movielens or synthetic, got {self.dataset!r}")
        if self.dct not in DCT_MODES:
            raise UserError(f"--dct must be one of {', '.join(DCT_MODES)}, got {self.dct!r}")
        check_int("--ndevices", self.ndevices, 2, 64)
        check_int("--steps", self.steps, 1, 10_000_000)
        check_int("--batch_size", self.batch_size, self.ndevices, 1 << 20)
        if self.batch_size % self.ndevices:
            raise UserError(f"--batch_size {self.batch_size} is not divisible by {self.ndevices} ranks")
        check_float("--dp_keep", self.dp_keep, 0.0, 1.0, lo_open=True)
        check_int("--dp_refresh", self.dp_refresh, 1, 10_000_000)
        check_float("--dp_drift", self.dp_drift, 1.0, 1000.0)
        check_float("--mp_keep", self.mp_keep, 0.0, 1.0, lo_open=True)
        if self.mp_scope not in MP_SCOPES:
            raise UserError(f"--mp_scope must be one of {', '.join(MP_SCOPES)}, got {self.mp_scope!r}")
        check_int("--dp_adam_freeze_after", self.dp_adam_freeze_after, 0, self.steps)
        check_float("--dp_adam_floor", self.dp_adam_floor, 0.0, 1.0, lo_open=True)
        if self.dp_adam_freeze_after and self.dense_opt != "adam":
            raise UserError(f"--dp_adam_freeze_after {self.dp_adam_freeze_after} needs --dense_opt adam, "
                            f"got {self.dense_opt!r}")
        if self.arch not in ARCHS:
            raise UserError(f"--arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        for name, value in (("--bottom_mlp", self.bottom_mlp), ("--top_mlp", self.top_mlp)):
            if value is not None:
                mlp_sizes(value, name)
        if self.emb_dim is not None:
            check_int("--emb_dim", self.emb_dim, 4, 1024)
            if self.emb_dim % 4:
                raise UserError(f"--emb_dim must be a multiple of 4, got {self.emb_dim}")
        if self.dense_opt not in DENSE_OPTIMIZERS:
            raise UserError(f"--dense_opt must be one of {', '.join(DENSE_OPTIMIZERS)}, got {self.dense_opt!r}")
        if self.lr is not None:
            check_float("--lr", self.lr, 0.0, 10.0, lo_open=True)
        check_float("--emb_lr", self.emb_lr, 0.0, 100.0, lo_open=True)
        check_int("--seed", self.seed, 0)
        check_max_mem_gb(self.max_mem)
        check_int("--log_every", self.log_every, 1, 1_000_000)
        check_int("--eval_every", self.eval_every, 0, self.steps)
        if not isinstance(self.dp_sync, bool):
            raise UserError(f"--dp_sync must be on or off, got {self.dp_sync!r}")
        check_float("--rendezvous_timeout_s", self.rendezvous_timeout_s, 1.0, 86_400.0)
        check_needed([(name, value is not None, "--dataset synthetic", self.dataset == "synthetic")
                      for name, value in (("--num_samples", self.num_samples), ("--max_rows", self.max_rows))])
        if self.num_samples is not None:
            check_int("--num_samples", self.num_samples, 1000, 100_000_000)
        if self.max_rows is not None:
            check_int("--max_rows", self.max_rows, 10, 100_000_000)
        return self

    def resolved(self) -> "TrainConfig":
        """The config with the --arch's layers and embedding dim, and the --dense_opt's learning rate,
        filled in where not given."""
        bottom, top, dim = ARCHS[self.arch]
        return replace(self, bottom_mlp=self.bottom_mlp or bottom, top_mlp=self.top_mlp or top,
                       emb_dim=self.emb_dim or dim, lr=self.lr or DENSE_OPTIMIZERS[self.dense_opt][1])

    @property
    def uses_dp(self) -> bool:
        return self.dct in ("dp", "both")

    @property
    def uses_mp(self) -> bool:
        return self.dct in ("mp", "both")


@dataclass
class TrainDLRMConfig:
    """tools/train_dlrm.py: one training run, where its result row goes, and the cost models of --alg neuroshard."""
    train: TrainConfig = field(default_factory=TrainConfig)
    results_csv: str = flag("results/dct.csv", "CSV the run's result row is appended to ('' for none)")
    compute_model: str | None = flag(None, "with --alg neuroshard: the compute cost model (default "
                                           "models/compute.pt)")
    fw_comm_model: str | None = flag(None, "with --alg neuroshard: the forward comm cost model (default: the one "
                                           "for --ndevices and, with DCT-MP, --mp_keep)")
    bw_comm_model: str | None = flag(None, "with --alg neuroshard: the backward comm cost model (default: as "
                                           "--fw_comm_model)")

    @property
    def models(self) -> tuple[str | None, str | None, str | None]:
        return self.compute_model, self.fw_comm_model, self.bw_comm_model


# ----------------------------------------------------------------------------- the whole pipeline

@dataclass(frozen=True)
class Preset:
    """Sizes of one end-to-end pipeline run (tools/run_pipeline.py --preset)."""
    num_tables: int
    batch_size: int
    row_scale: float
    task_max_mem: float
    max_mem: float
    T_range: tuple[int, int]
    num_train_tasks: int
    num_test_tasks: int
    ndevices: tuple[int, ...]
    compute_samples: int
    compute_workers: int | None
    comm_samples: int
    epochs: int
    eval_warmup: int
    eval_iters: int
    eval_rounds: int
    collective_samples: int = 60  # row-wise and data-parallel collectives (`collect_comm_cost_data.py --collectives`)
    families: bool = False  # compute-cost data also from the table families (DESIGN.md §8); --families turns it on


PRESETS = {
    # CPU, 2 cores, minutes (docs/results.md): rows scaled by 0.01 and budgets scaled alike (4 GB -> 0.04 GB).
    "quick": Preset(num_tables=856, batch_size=4096, row_scale=0.01, task_max_mem=0.15, max_mem=0.04,
                    T_range=(10, 30), num_train_tasks=20, num_test_tasks=20, ndevices=(4,), compute_samples=800,
                    compute_workers=1, comm_samples=300, epochs=500, eval_warmup=3, eval_iters=25, eval_rounds=5),
    # The paper's sizes, for machines with GPUs (pass --gpu_devices) and the memory to match.
    "paper": Preset(num_tables=856, batch_size=65536, row_scale=1.0, task_max_mem=15.0, max_mem=4.0,
                    T_range=(10, 60), num_train_tasks=100, num_test_tasks=100, ndevices=(4, 8), compute_samples=5000,
                    compute_workers=None, comm_samples=1000, epochs=1000, eval_warmup=10, eval_iters=100,
                    eval_rounds=5),
}


@dataclass
class PipelineConfig:
    """tools/run_pipeline.py: every step of DESIGN.md §3 with a preset; resumes, skipping finished steps."""
    preset: str = flag("quick", "quick (CPU, minutes) or paper (the paper's sizes, GPUs)")
    work_dir: str = flag(".", "folder holding data/, models/ and results/")
    force: bool = flag(False, "redo every step")
    gpu_devices: tuple[int, ...] | None = gpu_devices_flag()
    families: bool = flag(False, "also collect compute-cost data from the table-family mix (DESIGN.md §8), "
                                 "with 1.5x the preset's compute samples; not yet the default: see the README")

    def check(self) -> "PipelineConfig":
        if self.preset not in PRESETS:
            raise UserError(f"unknown --preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        HardwareConfig(gpu_devices=self.gpu_devices).check()
        return self
