"""Hybrid-parallel DLRM training with optional DCT compression (tools/train_dlrm.py).

The parent loads the data, shards the embedding tables with any `--alg` (the task is built from
the training ids: rows, pooling factors and reuse histograms, every table at `emb_dim`), writes the
data once to a temporary `torch.save` file (ranks read it with `weights_only=True`), and spawns N
ranks; under `torchrun` every process does this itself and runs its own rank. Each rank trains:
    pooled = its column shards pooled for the global batch      [B, W_r]
    recv   = forward all-to-all (dense, or DCT-MP top-k)        [B/N, sum_q W_q]
    emb    = the pieces put back per table                      [B/N, T, D]
    loss   = BCE(DenseArch(dense[local], emb), y[local])        DenseArch under DDP (dense or DCT-DP hook)
    backward: DDP's gradient communication for the MLPs, the backward all-to-all for the embeddings.
Every global batch is drawn from one seeded permutation, so all ranks agree on it, and the seed
fixes the initial weights: runs of different --dct modes at one seed are paired. Per step the
ranks record the bytes handed to each collective, the seconds spent in them and the step's wall
time; rank 0's progress reaches a tqdm bar. At the end every rank predicts its slice of the test
set, everything is all_gathered to rank 0 (tensors only, no pickles), and rank 0 computes AUC and
log loss.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

# TrainConfig and its constants live with the other step configs; imported from here too
from ..core.artifacts import (atomic_write_text, check_output_file, check_results_csv, cpu_name, provenance,
                              source_digest, write_json)
from ..core.config import ARCHS, CostModelFiles, DCT_MODES, DENSE_OPTIMIZERS, TrainConfig, mlp_sizes  # noqa: F401
from ..core.costs import Cluster
from ..core.file_names import meta_path
from ..core.errors import UserError
from ..data.features import table_data_features
from ..data.tasks import ShardingTask
from ..hardware.launch import in_torchrun, join_torchrun_group, run_processes, torchrun_ranks
from ..sharding.registry import make_sharder, shard_task
from ..sharding.simulator import Simulator
from .data import CTRData, load_data
from .dct import DCTState, HookState, dct_hook, dense_hook
from .dct_results import STEP_PARTS
from .dlrm import CommStats, DenseArch, ShardedEmbeddings, assemble, pooled_all_to_all
from .frozen_adam import FrozenAdam


def dense_arch(cfg: TrainConfig, dense_dim: int, num_tables: int):
    """The MLPs (bottom, interaction, top) of `cfg`'s --arch, --bottom_mlp, --top_mlp and --emb_dim."""
    c = cfg.resolved()
    return DenseArch(dense_dim, num_tables, c.emb_dim, mlp_sizes(c.bottom_mlp, "--bottom_mlp"),
                     mlp_sizes(c.top_mlp, "--top_mlp"))


# ----------------------------------------------------------------------------- sharding the tables

def shard_training_tables(data, cfg: TrainConfig, simulator=None) -> list[list[tuple[int, int, int]]]:
    """Per rank, its (table, col_start, width) shards, from `--alg` on the training tables."""
    feats = np.stack([table_data_features(ids, lens) for ids, lens in data.table_stats()])
    rows = np.array(data.num_rows, dtype=np.int64)
    task = ShardingTask(np.arange(len(rows)), np.full(len(rows), cfg.emb_dim), feats, rows)
    cluster = Cluster(cfg.ndevices, cfg.max_mem)
    res = shard_task(make_sharder(cfg.alg, cfg.seed, simulator, batch_size=cfg.batch_size), task, cluster)
    if res.plan is None or res.oom:
        raise UserError(f"--alg {cfg.alg} found no plan for the tables within {cfg.ndevices} x {cfg.max_mem} GB; "
                        "raise --max_mem")
    return [[(s.table, s.col_start, s.dim) for s in dev] for dev in res.plan.per_device()]


# ----------------------------------------------------------------------------- one rank

def train_rank(rank: int, world: int, emit, data_path: str, cfg_dict: dict, rank_shards) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = TrainConfig(**cfg_dict)
    data = CTRData(**torch.load(data_path, weights_only=True))
    T, D, B = len(data.num_rows), cfg.emb_dim, cfg.batch_size
    stats = CommStats()
    torch.manual_seed(cfg.seed)
    model = DDP(dense_arch(cfg, data.dense.shape[1], T))
    freeze_at = cfg.dp_adam_freeze_after if cfg.uses_dp else 0  # only DCT-DP runs freeze Adam
    if cfg.uses_dp:
        state = DCTState(keep=cfg.dp_keep, refresh=cfg.dp_refresh, error_feedback=cfg.error_feedback, stats=stats,
                         drift=cfg.dp_drift, sync=cfg.dp_sync, dense_until=freeze_at)
        model.register_comm_hook(state, dct_hook)
    else:
        state = HookState(stats=stats, sync=cfg.dp_sync)
        model.register_comm_hook(state, dense_hook)
    emb = ShardedEmbeddings(rank_shards[rank], data.num_rows, D, cfg.seed)
    widths = [sum(w for _, _, w in s) for s in rank_shards]
    my_tables = sorted({t for t, _, _ in rank_shards[rank]})
    opt_dense = getattr(torch.optim, DENSE_OPTIMIZERS[cfg.dense_opt][0])(model.parameters(), lr=cfg.lr)
    dense_step = opt_dense.step  # after --dp_adam_freeze_after steps: FrozenAdam's
    opt_emb = torch.optim.SGD(emb.parameters(), lr=cfg.emb_lr) if len(list(emb.parameters())) else None
    mp_keep = cfg.mp_keep if cfg.uses_mp else None
    segments = [[w for _, _, w in s] for s in rank_shards]
    mp_generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + rank)  # --mp_scope sign's backward
    num_train = data.num_train
    if cfg.eval_every:  # the last tenth of the training split becomes the validation set
        num_train -= max(B, data.num_train // VALID_SHARE)
    valid, test = torch.arange(num_train, data.num_train), torch.arange(data.num_train, data.num_samples)
    perm_gen = torch.Generator().manual_seed(cfg.seed + 1)
    order = torch.randperm(num_train, generator=perm_gen)
    pos, losses, per_step, evals, scored = 0, [], [], [], None

    def sparse_for(idx):
        _, sp, _ = data.batch(idx, my_tables)
        full = [None] * T
        for t, s in zip(my_tables, sp):
            full[t] = s
        return full

    def forward(idx, dense_model, comm_stats):
        """Logits and labels of this rank's slice of the global batch `idx` (len divisible by world)."""
        b = len(idx) // world
        recv = pooled_all_to_all(emb(sparse_for(idx), len(idx)), widths, comm_stats, mp_keep, segments,
                                 cfg.mp_scope, mp_generator)
        x, _, y = data.batch(idx[rank * b:(rank + 1) * b], [])
        return dense_model(x, assemble(recv, rank_shards, b, T, D)), y

    def predict(split):
        """All ranks' predictions and labels of `split` (global batches of B, trimmed to the ranks), on every rank."""
        preds, labels = [], []
        model.eval()
        with torch.no_grad():
            for start in range(0, len(split) - world + 1, B):
                idx = split[start:start + B]
                logit, y = forward(idx[: len(idx) - len(idx) % world], model.module, CommStats())
                preds.append(torch.sigmoid(logit))
                labels.append(y)
        model.train()
        return [torch.cat(p) for p in _gather((torch.cat(preds or [torch.zeros(0)]),
                                               torch.cat(labels or [torch.zeros(0)])), world)]

    for step in range(cfg.steps):
        if pos + B > num_train:
            order, pos = torch.randperm(num_train, generator=perm_gen), 0
        idx = order[pos:pos + B]
        pos += B
        stats.reset()
        state.step_reset()
        t0 = time.perf_counter()
        logit, y = forward(idx, model, stats)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y)
        opt_dense.zero_grad()
        if opt_emb:
            opt_emb.zero_grad()
        loss.backward()
        if not cfg.dp_sync and state.compute_done_at is not None:  # the wait for DP after autograd's last gradient
            stats.seconds["dp"] += time.perf_counter() - state.compute_done_at
        if opt_emb:
            for p in emb.parameters():  # each rank's loss is a mean over its B/N samples: average over ranks
                if p.grad is not None:
                    p.grad.div_(world)
            opt_emb.step()
        dense_step()
        if freeze_at and step + 1 == freeze_at:  # dense warm-up over: freeze Adam's second moment
            dense_step = FrozenAdam(opt_dense, cfg.dp_adam_floor).step
        per_step.append((time.perf_counter() - t0, stats.seconds["mp"], stats.seconds["dp"],  # STEP_RECORD's order
                         stats.bytes["mp"], stats.bytes["dp"], state.codec_s, stats.mp_codec_s))
        losses.append(float(loss.detach()))
        if rank == 0 and ((step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps):
            emit(("loss", step + 1, float(np.mean(losses[-cfg.log_every:]))))
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            (vp, vl), scored = predict(valid), predict(test)  # every rank takes part; rank 0 scores
            tp, tl = scored
            if rank == 0:
                evals.append((step + 1, auc(vp, vl), auc(tp, tl), log_loss(tp, tl)))
    # test predictions at the end (every rank's slice of each global test batch), gathered; the last
    # scoring of --eval_every already made them after the last step
    preds, labels = scored if scored is not None and cfg.evaluate else predict(test if cfg.evaluate else test[:0])
    steps_all, losses_all = _gather((torch.tensor(per_step, dtype=torch.float64),
                                     torch.tensor(losses, dtype=torch.float64)), world)
    if rank == 0:
        emit(("done", preds.tolist(), labels.tolist(), torch.stack(steps_all).numpy(),
              getattr(state, "refreshed_at", []), [x.tolist() for x in losses_all], evals))


VALID_SHARE = 10  # with --eval_every, 1/VALID_SHARE of the training split (at least one batch) validates


def _gather(tensors, world: int) -> list[list[torch.Tensor]]:
    """All ranks' copies of each tensor (same shape on every rank), through the process group."""
    import torch.distributed as dist

    out = []
    for t in tensors:
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t)
        out.append(parts)
    return out


# ----------------------------------------------------------------------------- metrics and the driver

def auc(scores, labels) -> float:
    from scipy.stats import rankdata

    scores, labels = np.asarray(scores), np.asarray(labels)
    pos = labels == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def log_loss(scores, labels) -> float:
    p = np.clip(np.asarray(scores, np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(labels, np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


RESULT_COLUMNS = ("dataset", "dct", "test_auc", "step_ms", "dp_bytes_per_step")  # also in older files
# what a rank records per step, in order (seconds, or bytes sent): the step, the collectives' wait, the bytes,
# the coding; the summary's compute is the step less every other part of STEP_PARTS
STEP_RECORD = ("step_ms", "mp_comm_ms", "dp_comm_ms", "mp_bytes", "dp_bytes", "dp_codec_ms", "mp_codec_ms")


def train_dlrm(cfg: TrainConfig, results_csv: str | Path | None = None, models=None, progress: bool = True,
               data=None) -> dict | None:
    """Train on `cfg.ndevices` ranks; returns (and appends to `results_csv`) the run's measurements.

    Run by itself it spawns the ranks; launched by `torchrun` (one or several nodes), every process
    calls it and runs its own rank: rank 0 writes and returns the results, the others return None.
    `data` (a `CTRData`) replaces `cfg.dataset` when given (tests plant problems this way)."""
    from tqdm import tqdm

    torchrun = in_torchrun()
    rank0 = True
    if torchrun:
        rank0 = torchrun_ranks(cfg.ndevices)[0] == 0  # before anything else: a bad environment is one line
    cfg = cfg.check().resolved()
    if torchrun:
        progress = progress and rank0
        results_csv = results_csv if rank0 else None
    check_output_file(results_csv, "--results_csv")
    check_results_csv(results_csv, "--results_csv", RESULT_COLUMNS, "training")
    if torchrun:  # every rank present (or one line within --rendezvous_timeout_s) before the expensive work
        join_torchrun_group("cpu", cfg.rendezvous_timeout_s, timeout_flag="--rendezvous_timeout_s")
    simulator = None
    if cfg.alg == "neuroshard":
        compute, fw, bw = models or (None, None, None)
        files = CostModelFiles(compute or CostModelFiles.compute_model, fw, bw)
        mp = cfg.mp_keep if cfg.uses_mp and cfg.mp_keep < 1 else None  # plan for DCT-MP's all-to-all when its
        fw_bw = files.paths(cfg.ndevices, mp)[1:]
        if mp is not None and not all(p.exists() for p in fw_bw):  # comm models exist
            if progress:
                print(f"note: no comm models for DCT-MP's all-to-all at mp_keep {mp:g} ({fw_bw[0]} missing): planning "
                      f"for the uncompressed all-to-all; make them with collect_comm_cost_data.py and "
                      f"train_comm_cost_model.py --ndevices {cfg.ndevices} --mp_keep {mp:g}", file=sys.stderr)
            mp = None
        simulator = Simulator.from_files(files, cfg.ndevices, mp)
    data = data if data is not None else load_data(cfg.dataset, cfg.seed, cfg.num_samples, cfg.max_rows)
    data.check_batch(cfg.batch_size)
    rank_shards = shard_training_tables(data, cfg, simulator)
    done: list = []
    bar = tqdm(total=cfg.steps, desc=f"train DLRM ({cfg.dataset}, {cfg.arch}, {cfg.ndevices} ranks, dct {cfg.dct})",
               disable=not progress)

    def on_message(indexed):
        _, msg = indexed  # the one run's index, 0
        if msg[0] == "loss":  # rank 0's
            _, step, value = msg
            bar.update(step - bar.n)
            bar.set_postfix(loss=f"{value:.4f}", refresh=False)
        else:
            done.append(msg[1:])

    t0 = time.perf_counter()
    try:
        _run_group(data, [(asdict(cfg), rank_shards)], on_message)
    finally:
        bar.close()
    if not rank0:
        return None
    result = summarize(cfg, data, done[0], time.perf_counter() - t0)
    if results_csv:
        append_result(results_csv, {k: v for k, v in result.items() if not k.startswith("_")})
    return result


def _run_group(data, runs: list[tuple[dict, list]], on_message, before_run=None) -> None:
    """Write the data once, then run `runs` ((config dict, rank shards) each) one after another on
    one group of ranks (spawned here, or this process's rank under torchrun). Every message reaches
    `on_message` as (run index, message)."""
    with tempfile.TemporaryDirectory(prefix="neuroshard-train-") as tmp:
        path = Path(tmp) / "data.pt"
        torch.save({k: getattr(data, k) for k in ("name", "table_names", "num_rows", "dense", "ids", "offsets",
                                                  "labels", "num_train")}, path)
        world = len(runs[0][1])
        run_processes(_train_runs_rank, world, (str(path), runs, before_run), on_message, group_device="cpu")


def _train_runs_rank(rank: int, world: int, emit, data_path: str, runs, before_run) -> None:
    import torch.distributed as dist

    for i, (cfg_dict, rank_shards) in enumerate(runs):
        if rank == 0 and before_run is not None:
            before_run(i)
        dist.barrier()
        train_rank(rank, world, lambda msg, i=i: emit((i, msg)), data_path, cfg_dict, rank_shards)


def train_runs(cfgs: list[TrainConfig], data, before_run=None, shards: list | None = None) -> list[dict]:
    """Several runs (same --ndevices) on one group of ranks spawned once, so benchmarks pay process
    start-up once. Run i trains on `shards[i]` (per rank, its (table, col_start, width) shards, as
    `shard_training_tables` returns) when given, else on the plan of its --alg without cost models.
    `before_run(i)` (picklable) runs on rank 0 before run i while the other ranks wait. Returns each
    run's result, as `train_dlrm` does."""
    cfgs = [c.check().resolved() for c in cfgs]
    if len({c.ndevices for c in cfgs}) != 1:
        raise UserError("train_runs: every run needs the same --ndevices")
    if shards is not None and (len(shards) != len(cfgs) or any(len(s) != cfgs[0].ndevices for s in shards)):
        raise UserError("train_runs: shards needs one plan per run, each with one shard list per rank")
    runs = [(asdict(c), shards[i] if shards is not None else shard_training_tables(data, c))
            for i, c in enumerate(cfgs)]
    done: dict[int, tuple] = {}

    def on_message(msg):
        i, inner = msg
        if inner[0] == "done":
            done[i] = inner[1:]

    t0 = time.perf_counter()
    _run_group(data, runs, on_message, before_run)
    wall = (time.perf_counter() - t0) / len(cfgs)
    return [summarize(c, data, done[i], wall) for i, c in enumerate(cfgs)]


def summarize(cfg: TrainConfig, data, done: tuple, wall: float) -> dict:
    """Rank 0's report of a run -> the result row (plus `_`-prefixed details for callers). `code` is the
    digest of the neuroshard sources that trained it (benchmarks resume only rows of the same code)."""
    preds, labels, steps, refreshed_at, rank_losses, evals = done  # steps: [ranks, steps, STEP_RECORD]
    per = steps.mean(axis=0)                                     # averaged over ranks
    skip = min(len(per) - 1, max(1, len(per) // 10))           # the first steps warm up
    recorded = [c for _, c in STEP_PARTS if c != "compute_ms"]  # compute is what the other parts leave
    timed = {c: 1e3 * float(statistics.median(per[skip:, STEP_RECORD.index(c)])) for c in ("step_ms", *recorded)}
    timed["compute_ms"] = timed["step_ms"] - sum(timed[c] for c in recorded)
    dense_params = sum(p.numel() for p in dense_arch(cfg, data.dense.shape[1], len(data.num_rows)).parameters())
    mean_loss = np.mean(np.array(rank_losses), axis=0)
    ends = sorted({*range(cfg.log_every, cfg.steps + 1, cfg.log_every), cfg.steps})
    result = {
        "dataset": cfg.dataset, "dct": cfg.dct, "arch": cfg.arch, "bottom_mlp": cfg.bottom_mlp,
        "top_mlp": cfg.top_mlp, "emb_dim": cfg.emb_dim, "ndevices": cfg.ndevices, "alg": cfg.alg,
        "steps": cfg.steps, "batch_size": cfg.batch_size, "seed": cfg.seed,
        # DCT's settings only where the run used them: a row never records a keep share nothing was kept at
        "dp_keep": cfg.dp_keep if cfg.uses_dp else None, "dp_refresh": cfg.dp_refresh if cfg.uses_dp else None,
        "dp_drift": cfg.dp_drift if cfg.uses_dp else None, "mp_keep": cfg.mp_keep if cfg.uses_mp else None,
        "mp_scope": cfg.mp_scope, "dp_adam_freeze_after": cfg.dp_adam_freeze_after, "dp_adam_floor": cfg.dp_adam_floor,
        "error_feedback": cfg.error_feedback, "dp_sync": cfg.dp_sync, "dense_opt": cfg.dense_opt, "lr": cfg.lr, "emb_lr": cfg.emb_lr,
        "test_auc": auc(preds, labels) if labels else float("nan"),
        "test_logloss": log_loss(preds, labels) if labels else float("nan"), "num_test": len(labels),
        **timed,
        "mp_bytes_per_step": float(steps[:, :, STEP_RECORD.index("mp_bytes")].sum(axis=0).mean()),
        "dp_bytes_per_step": float(steps[:, :, STEP_RECORD.index("dp_bytes")].sum(axis=0).mean()),
        "dense_params": dense_params, "wall_s": wall,
        "loss_curve": json.dumps({e: float(mean_loss[max(0, e - cfg.log_every):e].mean()) for e in ends}),
        "tau_refreshes": len(refreshed_at), "code": source_digest(),
    }
    if evals:  # test scores at the step of the best validation AUC (the first such step on ties)
        best = max(range(len(evals)), key=lambda i: (evals[i][1], -i))
        result.update(eval_every=cfg.eval_every, best_step=evals[best][0], best_valid_auc=evals[best][1],
                      test_auc_at_best=evals[best][2], test_logloss_at_best=evals[best][3],
                      eval_curve=json.dumps({s: [round(v, 5), round(t, 5)] for s, v, t, _ in evals}))
    # for callers (tests, benchmarks), not the CSV: exact per-rank losses, predictions, threshold refreshes
    result.update(_preds=preds, _refreshed_at=refreshed_at, _losses=rank_losses, _steps=steps)
    return result


def append_result(path, row: dict) -> None:
    """Add one row to a results CSV (rewritten atomically) with a provenance sidecar."""
    import pandas as pd

    path = Path(path)
    old = pd.read_csv(path) if path.is_file() else pd.DataFrame()
    df = pd.concat([old, pd.DataFrame([row])], ignore_index=True)
    atomic_write_text(path, df.to_csv(index=False))
    write_json(meta_path(path), provenance(device="cpu", backend="gloo", device_name=cpu_name()), indent=2)
