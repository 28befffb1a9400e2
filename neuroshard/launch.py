"""Run a function on N ranks of one `torch.distributed` group (DESIGN.md §4).

On one machine `run_ranks` spawns the ranks itself (gloo on CPU, NCCL on CUDA, rendezvous over
loopback TCP). Rank functions report results with `emit(msg)`; messages travel to the parent through
a multiprocessing queue (a pipe), never through files. If a rank dies, the others are stopped and
one clear error names the rank; on Ctrl-C every rank is terminated before the parent exits.
Under `torchrun` (several machines), `run_ranks` runs this process's rank in-process instead and
only rank 0's messages reach the handler.
"""
from __future__ import annotations

import os
import queue as queue_mod
import socket
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from .errors import UserError

RankFn = Callable[..., None]  # fn(rank, world_size, emit, *args)


def in_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ
                                                   and "MASTER_ADDR" in os.environ)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_group(device: str, rank: int, world: int, init_method: str | None, gpu_ids: list[int] | None) -> None:
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(gpu_ids[local] if gpu_ids else local)
    else:
        torch.set_num_threads(1)
    backend = "nccl" if device == "cuda" else "gloo"
    kwargs = {"timeout": timedelta(seconds=300)}
    if init_method:
        kwargs.update(init_method=init_method, rank=rank, world_size=world)
    dist.init_process_group(backend, **kwargs)


def _rank_entry(rank, world, port, device, gpu_ids, fn, args, q):
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    try:
        _init_group(device, rank, world, f"tcp://127.0.0.1:{port}", gpu_ids)
        fn(rank, world, lambda msg: q.put(("msg", rank, msg)), *args)
        dist.barrier()
        dist.destroy_process_group()
        q.put(("done", rank, None))
    except BaseException as e:  # report, then die with a non-zero code
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        q.put(("error", rank, last))
        os._exit(1)


def run_ranks(fn: RankFn, world: int, args: tuple, on_message: Callable[[Any], None], device: str = "cpu",
              gpu_ids: list[int] | None = None) -> None:
    """Run `fn` on `world` ranks; `on_message` receives what ranks emit, in the parent."""
    if in_torchrun():
        _init_group(device, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, gpu_ids)
        rank = dist.get_rank()
        fn(rank, dist.get_world_size(), on_message if rank == 0 else (lambda msg: None), *args)
        dist.barrier()
        dist.destroy_process_group()
        return
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_entry, args=(r, world, port, device, gpu_ids, fn, args, q), daemon=True)
             for r in range(world)]
    try:
        for p in procs:
            p.start()
        finished, error = set(), None
        while len(finished) < world:
            try:
                kind, rank, payload = q.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in finished]
                if dead:
                    raise UserError(error or f"rank {dead[0]} died (exit code {procs[dead[0]].exitcode}); "
                                    "see the messages above")
                continue
            if kind == "msg":
                on_message(payload)
            elif kind == "done":
                finished.add(rank)
            else:
                error = f"rank {rank} failed: {payload}"
                raise UserError(error)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
