"""Step 4: pre-train the cost models from collected cost-data files (DESIGN.md §3.3).

Both drivers check their inputs before training (sample files of the right kind, collected on the
dataset given, enough samples, valid training settings) and write the model atomically.
"""
from __future__ import annotations

from dataclasses import fields

import numpy as np

from ..core.config import FitConfig, TrainCommConfig, TrainComputeConfig, check_mp_keep, mp_text
from ..core.artifacts import check_outputs
from ..core.errors import UserError, check_int
from ..core.costs import implausible_ms
from ..data.dataset import DLRMDataset
from ..hardware.collect import load_cost_data
from ..hardware.comm_bench import COLLECTIVES, COMM_DATA_KIND
from ..hardware.compute_bench import COMPUTE_DATA_KIND, cost_data_tables
from .collective_models import CollectiveModels, fit_collective
from .cost_models import (CommCostModel, ComputeCostModel, check_input_transform, comm_training_arrays,
                          compute_training_arrays, input_training_arrays, model_meta)

MIN_SAMPLES = 10
MAX_INPUT_WORDS = 1e8  # a rank's input words per sample: far beyond any plan's (a 1e6-table set at pooling 50)


def _samples(path, kind: str, num_samples: int | None, salvage: bool = False) -> tuple[dict, list[dict]]:
    meta, samples = load_cost_data(path, kind, salvage)
    batch, device = meta.get("batch_size"), meta.get("device")  # copied into the model: a forged header stops here
    if not (isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1) or not isinstance(device, str):
        raise UserError(f"{path} has a damaged header (batch {batch!r}, device {device!r}); delete it and collect "
                        "again")
    samples = samples[:num_samples] if num_samples else samples
    if len(samples) < MIN_SAMPLES:
        raise UserError(f"{path} holds {len(samples)} samples; at least {MIN_SAMPLES} are needed to train "
                        "(collect more with --data_size)")
    return meta, samples


def _print_metrics(name: str, report: dict) -> None:
    m = report["test"]
    n = report["num_samples"]
    r2, rho = (f"{m[k]:.4f}" if m[k] == m[k] else "n/a" for k in ("r2", "spearman"))
    print(f"{name}: test MSE {m['mse']:.4g}  MAPE {100 * m['mape']:.2f}%  R² {r2}  Spearman {rho}"
          f"  (train/valid/test {n['train']}/{n['valid']}/{n['test']}, best valid MSE {report['best_valid_mse']:.4g})")
    if n["test"] < 3 or rho == "n/a":
        print(f"note: a test split of {n['test']} sample(s) cannot rank; R² and Spearman need at least 3 distinct "
              f"test samples: train on more (--num_samples, or collect more with --data_size)")


def train_compute_model(cfg: TrainComputeConfig) -> ComputeCostModel:
    """Step 4a: fit the compute cost model on OUT_DIR's compute samples; writes `cfg.out_path`."""
    fit = cfg.fit.check(MIN_SAMPLES)
    check_input_transform(cfg.input_transform)
    data_path = cfg.data_path
    check_outputs({"--out_path": cfg.out_path}, {"the compute cost data": data_path})
    dataset = DLRMDataset.load(cfg.dataset_dir)
    meta, samples = _samples(data_path, COMPUTE_DATA_KIND, fit.num_samples, cfg.salvage)
    if meta.get("dataset_fingerprint") != dataset.fingerprint:
        raise UserError(f"{data_path} was measured on another dataset than {dataset.path}; "
                        "pass the matching --dataset_dir")
    tables = cost_data_tables(meta, dataset, cfg.families_dir)  # the dataset, or dataset + family tables
    feats, mask, y = compute_training_arrays(samples, tables.features)
    kw = _fit_kwargs(fit)
    model = ComputeCostModel({**model_meta(meta, data=str(data_path), epochs=fit.epochs, **kw),
                              "input_transform": cfg.input_transform})
    report = model.fit((feats, mask), y, epochs=fit.epochs, **kw)
    _print_metrics(f"compute model ({meta['backend']}/{meta['device']})", report)
    model.save(cfg.out_path)
    print(f"saved {cfg.out_path}")
    return model


def train_comm_models(cfg: TrainCommConfig) -> tuple[CommCostModel, ...]:
    """Step 4b: fit the forward and backward comm cost models on the N-device comm samples (with
    `cfg.mp_keep`: on DCT-MP's compressed all-to-all samples; the models record it in their meta); with
    `cfg.input_dist`, the input-distribution model on the input-distribution samples instead (a 1-tuple)."""
    fit = cfg.fit.check(MIN_SAMPLES)
    mp_keep = check_mp_keep(cfg.mp_keep)
    check_int("--ndevices", cfg.ndevices, 2, 4096)
    if cfg.collectives:
        ignored = [f.name for f in fields(FitConfig) if f.name != "num_samples"
                   and getattr(cfg.fit, f.name) != getattr(FitConfig(), f.name)]
        if ignored:  # a least-squares fit: no epochs, learning rate, batches, splits or resamples
            raise UserError(f"--{ignored[0]} has no effect with --collectives (each collective's cost is a "
                            f"least-squares fit on 4 of every 5 samples); drop --{ignored[0]}")
        return (train_collective_models(cfg, fit),)
    if cfg.input_dist:
        return (train_input_model(cfg, fit),)
    fw_out_path, bw_out_path = cfg.out_paths()
    data_path = cfg.data_path
    # one line where the two outputs name one file (hard links too) or the cost data they are trained on
    check_outputs({"--fw_out_path": fw_out_path, "--bw_out_path": bw_out_path}, {"the comm cost data": data_path})
    meta, samples = _samples(data_path, COMM_DATA_KIND, fit.num_samples, cfg.salvage)
    N = meta.get("ndevices")
    if N != cfg.ndevices:  # e.g. 2-device samples copied under the 4-device name: the models would be mislabelled
        raise UserError(f"{data_path} holds samples of {N} devices, but its name is for {cfg.ndevices} (--ndevices "
                        f"{cfg.ndevices}); collect them with collect_comm_cost_data.py --ndevices {cfg.ndevices}, or "
                        f"name the file comm_cost_data_{N}.pkl and pass --ndevices {N}")
    if meta.get("mp_keep") != mp_keep:
        raise UserError(f"{data_path} holds {mp_text(meta.get('mp_keep'))} all-to-all samples, this run asks for "
                        f"{mp_text(mp_keep)}; pass the --mp_keep it was collected with")
    kw = _fit_kwargs(fit)
    models = []
    for direction, out in (("fw", fw_out_path), ("bw", bw_out_path)):
        x, y = comm_training_arrays(samples, direction)
        model = CommCostModel(N, direction, {**model_meta(meta, data=str(data_path), epochs=fit.epochs, **kw),
                                             "mp_keep": mp_keep,
                                             "fw_wait_term": bool(cfg.fw_wait_term) and direction == "fw",
                                             "training_input_max": [float(v) for v in x.max(0)]})
        report = model.fit((x,), y, epochs=fit.epochs, **kw)
        _print_metrics(f"{direction} comm model ({N} devices, {meta['device']}, {mp_text(mp_keep)})", report)
        model.save(out)
        print(f"saved {out}")
        models.append(model)
    return models[0], models[1]


def _other_comm_samples(cfg: TrainCommConfig, fit: FitConfig, flag: str, what: str, out_flag: str, out, data_path
                        ) -> tuple[dict, list[dict], int]:
    """(meta, samples, N) of the `--<flag>` samples (`what` names them) an input-distribution or collectives fit
    trains on, after the checks both make: no forward model's flag, the output (`out_flag`) apart from the data, and
    samples of that kind for `cfg.ndevices` devices."""
    if cfg.fw_wait_term:
        raise UserError(f"--fw_wait_term is for the forward model; drop it with --{flag}")
    check_outputs({out_flag: out}, {f"the {what} cost data": data_path})
    meta, samples = _samples(data_path, COMM_DATA_KIND, fit.num_samples, cfg.salvage)
    N = meta.get("ndevices")
    if not meta.get(flag) or N != cfg.ndevices:
        raise UserError(f"{data_path} does not hold {cfg.ndevices}-device {what} samples; collect them with "
                        f"collect_comm_cost_data.py --{flag} --ndevices {cfg.ndevices}")
    return meta, samples, N


def train_input_model(cfg: TrainCommConfig, fit: FitConfig) -> CommCostModel:
    """The input-distribution model (direction "input") on comm_cost_data_<N>_input.pkl."""
    out, data_path = cfg.input_out(), cfg.data_path
    meta, samples, N = _other_comm_samples(cfg, fit, "input_dist", "input-distribution", "--input_out_path", out,
                                           data_path)
    try:  # real numbers only (no bools or strings cast), words up to MAX_INPUT_WORDS, plausible ms
        raw = [np.asarray(s[k]) for s in samples for k in ("input_words", "input_ms")]
        ok = all(a.dtype.kind in "iuf" for a in raw)
        x, y = input_training_arrays(samples)
        ok = ok and x.shape == y.shape == (len(samples), N) and np.isfinite(x).all() and (x > 0).all() \
            and x.max() <= MAX_INPUT_WORDS and implausible_ms(y, positive=True) is None
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise UserError(f"{data_path} holds damaged input-distribution samples (each needs {N} input words in (0, "
                        f"{MAX_INPUT_WORDS:g}] and {N} plausible ms); delete it and collect again")
    kw = _fit_kwargs(fit)
    model = CommCostModel(N, "input", {**model_meta(meta, data=str(data_path), epochs=fit.epochs, **kw),
                                       "training_input_max": [float(v) for v in x.max(0)]})
    report = model.fit((x,), y, epochs=fit.epochs, **kw)
    _print_metrics(f"input-distribution model ({N} devices, {meta['device']})", report)
    model.save(out)
    print(f"saved {out}")
    return model


def train_collective_models(cfg: TrainCommConfig, fit: FitConfig) -> CollectiveModels:
    """The row-wise and data-parallel collectives' costs (`collective_models.py`) on
    comm_cost_data_<N>_collectives.pkl."""
    out, data_path = cfg.collectives_out(), cfg.data_path
    meta, samples, N = _other_comm_samples(cfg, fit, "collectives", "collectives", "--collectives_out_path", out,
                                           data_path)
    try:  # real numbers only (no bools or strings cast), widths in range, plausible ms
        ok = all(isinstance(s["width"], (int, np.integer)) and not isinstance(s["width"], bool) and
                 not any(isinstance(v, bool) for k in COLLECTIVES for v in np.asarray(s[f"{k}_ms"], object).ravel())
                 for s in samples)
        w = np.asarray([s["width"] for s in samples])
        ys = {k: np.asarray([s[f"{k}_ms"] for s in samples]) for k in COLLECTIVES}
        ok = ok and w.dtype.kind in "iu" and w.shape == (len(samples),) and (w >= 1).all() and w.max() <= 1 << 24 and \
            all(y.dtype.kind in "iuf" and y.shape == (len(samples), N) and implausible_ms(y, positive=True) is None
                for y in ys.values())
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise UserError(f"{data_path} holds damaged collectives samples (each needs a whole width from 1 and {N} "
                        f"plausible ms for each of {', '.join(COLLECTIVES)}); delete it and collect again")
    costs = {k: fit_collective(w, y.mean(axis=1)) for k, y in ys.items()}
    models = CollectiveModels(N, int(meta["batch_size"]), costs, model_meta(meta, data=str(data_path)))
    for k, c in costs.items():
        print(f"{k} ({N} devices, {meta['device']}): {c.latency_ms:.3f} ms + {c.ms_per_width * 1e3:.3f} us x width; "
              f"held-out median error {100 * c.held_out_mape:.1f}% ({len(w)} samples, widths {w.min()}-{w.max()})")
    models.save(out)
    print(f"saved {out}")
    return models


def _fit_kwargs(fit: FitConfig) -> dict:
    return {"batch_size": fit.batch_size, "lr": fit.lr, "train_ratio": fit.train_ratio,
            "valid_ratio": fit.valid_ratio, "seed": fit.seed, "bootstrap": fit.bootstrap}
