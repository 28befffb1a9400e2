"""Run a function in N worker processes, optionally as the ranks of one `torch.distributed` group.

`run_processes` spawns the processes itself (gloo on CPU, NCCL on CUDA, rendezvous over loopback
TCP when a group is asked for). Workers report results with `emit(msg)`; messages travel to the
parent through a multiprocessing queue (a pipe), never through files, and the parent hands each to
`on_message` as it arrives, so finished work is saved while the others run.

Faults:
- an exception in a worker reaches the parent with its message and the worker's rank; a worker
  killed by a signal is named with the signal. When one rank fails, its peers usually fail next
  (their collectives lose a peer); the report names the rank that failed first for its own reason;
- every worker dies with its parent (Linux parent-death signal plus a watchdog thread), so a
  killed parent leaves no worker behind;
- on Ctrl-C the parent (workers ignore SIGINT) first takes what is already in the pipe, so every
  finished result is kept, then terminates the workers and waits for them. SIGINT is held back while
  a message is being read and handled, so a Ctrl-C never cuts a message in half.
Under `torchrun` (several machines), `run_processes` runs this process's rank in-process instead
and only rank 0's messages reach the handler.
"""
from __future__ import annotations

import os
import pickle
import queue as queue_mod
import signal
import socket
import threading
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

from ..core.artifacts import deferred_interrupts
from ..core.errors import UserError

WorkerFn = Callable[..., None]  # fn(rank, world_size, emit, *args)
GRACE_S = 2.0  # after a first failure, how long to wait for the other ranks' reports
DRAIN_S = 1.0  # on Ctrl-C, how long to keep reading results already sent
_SECONDARY = ("connection closed", "connection reset", "broken pipe", "peer", "timed out", "timeout",
              "socket", "gloo", "nccl", "processgroup", "barrier")


def in_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ
                                                   and "MASTER_ADDR" in os.environ)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(device: str, rank: int, world: int, init_method: str | None, gpu_ids: list[int] | None) -> None:
    import torch
    import torch.distributed as dist

    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(gpu_ids[local] if gpu_ids else local)
    else:
        torch.set_num_threads(1)
    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=300)}
    if init_method:
        kwargs.update(init_method=init_method, rank=rank, world_size=world)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", **kwargs)


def die_with_parent(parent_pid: int) -> None:
    """Make this process exit when `parent_pid` goes away (however the parent ended)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)


def pin_to_core(rank: int) -> None:
    """With NEUROSHARD_PIN=1, pin a CPU rank/worker to core `rank % cores`. Off by default: measured
    with a probe of commit fec75ff (docs/findings.md; 4 gloo ranks, 2 cores), pinning doubled the run-to-run
    spread of all-to-all times (median 49% vs 24%) and made them slower."""
    if os.environ.get("NEUROSHARD_PIN") != "1" or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


def _entry(rank, world, parent_pid, port, group_device, gpu_ids, fn, args, q):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    die_with_parent(parent_pid)
    if group_device in (None, "cpu") and not gpu_ids:
        pin_to_core(rank)
    try:
        if group_device is not None:
            import torch.distributed as dist

            init_group(group_device, rank, world, f"tcp://127.0.0.1:{port}", gpu_ids)
        else:
            import torch

            torch.set_num_threads(1)
            if gpu_ids:
                torch.cuda.set_device(gpu_ids[rank])
        fn(rank, world, lambda msg: q.put(("msg", rank, msg)), *args)
        if group_device is not None:
            dist.barrier()
            dist.destroy_process_group()
        q.put(("done", rank, None))
        code = 0
    except BaseException as e:  # report, then die with a non-zero code
        q.put(("error", rank, traceback.format_exception_only(type(e), e)[-1].strip()))
        code = 1
    q.close()
    q.join_thread()  # the report is in the pipe before we exit
    os._exit(code)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _choose_failure(errors: dict[int, str], procs, what: str) -> str:
    """The failure to report: a rank killed by a signal, else the first error not caused by a lost peer."""
    killed = [r for r, p in enumerate(procs) if p.exitcode is not None and p.exitcode < 0]
    if killed:
        r = killed[0]
        return f"{what} {r} was killed by {_signal_name(procs[r].exitcode)}"
    primary = [r for r, m in errors.items() if not any(k in m.lower() for k in _SECONDARY)]
    if primary or errors:
        r = (primary or list(errors))[0]
        extra = f" ({len(errors) - 1} other {what}s failed after it)" if len(errors) > 1 else ""
        return f"{what} {r} failed: {errors[r]}{extra}"
    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
    return f"{what} {dead[0]} exited with code {procs[dead[0]].exitcode} without a report"


def cuda_ranks(world: int, what: str = "rank") -> list[int]:
    """GPU ids for `world` CUDA ranks given no --gpu_devices: one GPU each, 0..world-1. NCCL cannot put
    two ranks on one GPU, so fewer visible GPUs than ranks is refused in one line."""
    import torch

    have = torch.cuda.device_count()
    if world > have:
        raise UserError(f"{world} {what}s on CUDA need {world} GPUs (one each) but {have} "
                        f"{'is' if have == 1 else 'are'} visible; pass --device cpu, or fewer {what}s "
                        f"({'--workers' if what == 'worker' else '--ndevices'} / --gpu_devices)")
    return list(range(world))


def rank_gpus(device: str | None, world: int, gpu_ids: list[int] | None, what: str = "rank") -> list[int] | None:
    """The GPU of each of `world` ranks: --gpu_devices when given, else 0..world-1 on CUDA (checked
    against the visible GPUs); None on CPU and under torchrun (its LOCAL_RANK picks the GPU)."""
    if gpu_ids or device != "cuda" or in_torchrun():
        return gpu_ids
    return cuda_ranks(world, what)


def run_processes(fn: WorkerFn, world: int, args: tuple, on_message: Callable[[Any], None],
                  group_device: str | None = None, gpu_ids: list[int] | None = None, what: str = "rank") -> None:
    """Run `fn(rank, world, emit, *args)` in `world` processes; `on_message` gets what they emit.

    `group_device` ("cpu" or "cuda") makes the processes the ranks of one process group; None runs
    independent workers (on `gpu_ids[rank]` when given).
    """
    if group_device is not None and in_torchrun():
        import torch.distributed as dist

        if not dist.is_initialized():
            init_group(group_device, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, gpu_ids)
        rank = dist.get_rank()
        fn(rank, dist.get_world_size(), on_message if rank == 0 else (lambda msg: None), *args)
        dist.barrier()
        dist.destroy_process_group()
        return
    gpu_ids = rank_gpus(group_device, world, gpu_ids, what)
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port() if group_device is not None else 0
    procs = [ctx.Process(target=_entry, args=(r, world, os.getpid(), port, group_device, gpu_ids, fn, args, q),
                         daemon=True) for r in range(world)]
    finished: set[int] = set()
    errors: dict[int, str] = {}
    failed_at = None

    def handle(item) -> None:
        kind, rank, payload = item
        if kind == "msg":
            on_message(payload)
        elif kind == "done":
            finished.add(rank)
        else:
            errors[rank] = payload

    try:
        for p in procs:
            p.start()
        while len(finished) < world:
            with deferred_interrupts():  # a Ctrl-C waits until this message is read whole and handled
                try:
                    handle(q.get(timeout=0.2))
                except queue_mod.Empty:
                    pass
            broken = errors or any(p.exitcode not in (None, 0) for p in procs)
            if broken and failed_at is None:
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                raise UserError(_choose_failure(errors, procs, what))
            if failed_at is None and all(p.exitcode == 0 for p in procs) and len(finished) < world:
                # every process exited cleanly: whatever is left in the pipe arrives now
                try:
                    while len(finished) < world:
                        handle(q.get(timeout=5))
                except queue_mod.Empty:
                    raise UserError(f"{what}s exited without finishing their work") from None
    except KeyboardInterrupt:
        _drain(q, handle)
        raise
    finally:
        started = [p for p in procs if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.terminate()
        for p in started:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()


def _drain(q, handle) -> None:
    """Take every result already sent (Ctrl-C must not lose finished work)."""
    deadline = time.monotonic() + DRAIN_S
    try:
        while time.monotonic() < deadline:
            with deferred_interrupts():
                try:
                    handle(q.get(timeout=0.1))
                except queue_mod.Empty:
                    continue
                except (EOFError, OSError, ValueError, pickle.UnpicklingError):  # a message cut short: stop
                    return
    except KeyboardInterrupt:
        pass
