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

Start-up: the processes are forked from one server process per parent (multiprocessing's
"forkserver") that has imported torch, and fbgemm-gpu and TorchRec when the parent has, once. A
rank then starts in well under a second instead of importing torch (2-3 s of CPU on a 2-core
machine, 5-6 s with TorchRec) itself, and a parent that launches ranks many times (a pipeline, a
measuring run's rounds) pays the imports once. Each process gets the parent's environment and
working folder as they are when it starts, as a spawned one would. Where the server cannot start (its
socket's path in a $TMPDIR too long), each process is spawned instead.
"""
from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from datetime import timedelta
from typing import Any, Callable

from ..core.artifacts import deferred_interrupts
from ..core.config import RENDEZVOUS_TIMEOUT_S
from ..core.errors import UserError

WorkerFn = Callable[..., None]  # fn(rank, world_size, emit, *args)
GRACE_S = 2.0  # after a first failure, how long to wait for the other ranks' reports
DRAIN_S = 1.0  # on Ctrl-C, how long to keep reading results already sent
JOIN_GRACE_S = 5.0  # a torchrun rank's rendezvous: how long past its timeout before it gives up itself
_SECONDARY = ("connection closed", "connection reset", "broken pipe", "peer", "timed out", "timeout",
              "socket", "gloo", "nccl", "processgroup", "barrier")


def in_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ
                                                   and "MASTER_ADDR" in os.environ)


_TORCHRUN_FIX = ("launch with torchrun (e.g. torchrun --nproc_per_node N ...), which sets it, or unset RANK, "
                 "WORLD_SIZE and MASTER_ADDR to let the script spawn its own ranks")


def _env_int(name: str, lo: int, hi: int | None, what: str) -> int:
    text = os.environ.get(name)
    if text is None:
        raise UserError(f"torchrun's environment: {name} is not set; {_TORCHRUN_FIX}")
    shown = repr(text) if len(text) <= 40 else repr(text[:37]) + "..."
    t = text.strip()
    if not t.lstrip("+-").isdigit() or not t.isascii():
        raise UserError(f"torchrun's environment: {name} must be a whole number ({what}), got {shown}; "
                        f"{_TORCHRUN_FIX}")
    value = int(t)
    if value < lo or (hi is not None and value > hi):
        span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise UserError(f"torchrun's environment: {name} must be {span} ({what}), got {value}; {_TORCHRUN_FIX}")
    return value


def torchrun_env() -> tuple[int, int, int]:
    """torchrun's (RANK, WORLD_SIZE, LOCAL_RANK), checked before anything waits on them: a bad or
    missing value is one `UserError` line naming the variable, its allowed range and the fix."""
    world = _env_int("WORLD_SIZE", 1, 1 << 20, "the number of ranks")
    rank = _env_int("RANK", 0, world - 1, f"this process's rank among WORLD_SIZE {world}")
    local_world = world
    if "LOCAL_WORLD_SIZE" in os.environ:
        local_world = _env_int("LOCAL_WORLD_SIZE", 1, world, f"ranks on this node, at most WORLD_SIZE {world}")
    local = rank
    if "LOCAL_RANK" in os.environ:
        local = _env_int("LOCAL_RANK", 0, min(rank, local_world - 1),
                         f"this process's rank on its node: below LOCAL_WORLD_SIZE {local_world} and at most RANK {rank}")
    if not os.environ.get("MASTER_ADDR", "").strip():
        raise UserError(f"torchrun's environment: MASTER_ADDR is empty; {_TORCHRUN_FIX}")
    _env_int("MASTER_PORT", 1, 65535, "the rendezvous TCP port")
    return rank, world, local


def torchrun_ranks(ndevices: int) -> tuple[int, int, int]:
    """`torchrun_env()`, and a --ndevices other than torchrun's world size refused in one line."""
    rank, world, local = torchrun_env()
    if world != ndevices:
        raise UserError(f"--ndevices {ndevices} but torchrun started {world} ranks; pass --ndevices {world} or "
                        "leave it out")
    return rank, world, local


def default_ndevices(args) -> None:
    """A script's parsed --ndevices, left out (None) under torchrun: torchrun's world size (its environment
    checked as `torchrun_env` checks it)."""
    if args.ndevices is None and in_torchrun():
        args.ndevices = torchrun_env()[1]


# deprecations TorchRec's own code triggers in torch (its row-wise collectives, DMP's buffer option): a line per
# rank and plan that nothing in this package or a user's plan can change
TORCHREC_DEPRECATIONS = (r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
                         r"`broadcast_buffers` is deprecated")


def quiet_torchrec_logs() -> None:
    """TorchRec's KJT asks torch.fx whether it is tracing, and torch then warns once per rank that it was asked: a
    line per rank that says nothing to a user of a TorchRec step or collective. The same for `TORCHREC_DEPRECATIONS`
    (FutureWarnings only; every other warning still shows)."""
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    for message in TORCHREC_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)


def _mute_stderr() -> int | None:
    """Point file descriptor 2 at /dev/null; returns a copy of the old one (None if that failed)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        return saved
    except (OSError, ValueError):
        return None


def _restore_stderr(saved: int | None) -> None:
    if saved is not None:
        os.dup2(saved, 2)
        os.close(saved)


def join_torchrun_group(device: str, timeout_s: float, gpu_ids: list[int] | None = None,
                        collective_timeout_s: float = 300.0, timeout_flag: str | None = None) -> None:
    """Join the process group torchrun's environment describes, waiting at most `timeout_s` for every
    rank to arrive (a process alone, or one pointed at the wrong MASTER_ADDR/MASTER_PORT, is told so
    in one line instead of waiting the collectives' timeout). The wait runs in a helper thread while
    this one polls it, so SIGTERM and Ctrl-C are handled at once during it, and the poll gives up itself
    `JOIN_GRACE_S` after the deadline: torch's store client waits without limit for an answer from a port that
    accepts and never answers (another program's, or a rank 0 that hangs), so every rank has one deadline
    whatever holds MASTER_PORT. Collectives afterwards time out after `collective_timeout_s`. `timeout_flag`: the
    flag that sets `timeout_s`, named in the line (None: the script has none)."""
    import torch.distributed as dist

    rank, world, _ = torchrun_env()
    if dist.is_initialized():
        return
    _prepare_device(device, rank, gpu_ids)
    failed: list[BaseException] = []

    def join():
        try:
            dist.init_process_group(_backend(device), timeout=timedelta(seconds=timeout_s))
        except BaseException as e:  # noqa: BLE001 -- reported by the waiting thread
            failed.append(e)

    helper = threading.Thread(target=join, name="rendezvous", daemon=True)
    where = f"{os.environ['MASTER_ADDR'].strip()}:{int(os.environ['MASTER_PORT'])}"
    deadline = time.monotonic() + timeout_s + JOIN_GRACE_S
    saved = _mute_stderr()  # c10d logs each failed connection attempt with C++ stack frames; the line below says it
    try:
        helper.start()
        while helper.is_alive() and time.monotonic() < deadline:
            helper.join(0.1)  # signal handlers run between these waits
    finally:
        _restore_stderr(saved)
    if helper.is_alive():  # the daemon thread is left waiting; this process stops on the line below
        failed.append(TimeoutError("a program there accepted the connection but never answered as torch's "
                                   "rendezvous store"))
    if failed:
        reason = str(failed[0]).strip().splitlines()[0][:200] if str(failed[0]).strip() else type(failed[0]).__name__
        raise UserError(f"torchrun rank {rank} of {world}: the ranks did not all meet at {where} within {timeout_s:g} s "
                        f"({reason}); start all {world} ranks (torchrun --nnodes/--nproc_per_node), check MASTER_ADDR "
                        f"and MASTER_PORT" + (f", or raise {timeout_flag}" if timeout_flag else ""))
    try:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=collective_timeout_s))
    except (AttributeError, RuntimeError, ValueError):  # older torch: collectives keep the rendezvous timeout
        pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def _prepare_device(device: str, rank: int, gpu_ids: list[int] | None) -> None:
    import torch

    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(gpu_ids[local] if gpu_ids else local)
    else:
        torch.set_num_threads(1)


def init_group(device: str, rank: int, world: int, init_method: str, gpu_ids: list[int] | None) -> None:
    """Join the group of ranks this process spawned (under torchrun: `join_torchrun_group`)."""
    import torch.distributed as dist

    _prepare_device(device, rank, gpu_ids)
    dist.init_process_group(_backend(device), timeout=timedelta(seconds=300), init_method=init_method, rank=rank,
                            world_size=world)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent(parent_pid: int, main_pid: int | None = None) -> None:
    """Make this process exit when `parent_pid` (the process it was forked from) goes away, however it
    ended, or when `main_pid` (the process that asked for it, when another one forked it) does."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def orphaned() -> bool:
        return os.getppid() != parent_pid or (main_pid is not None and not _alive(main_pid))

    def watch():
        while True:
            if orphaned():
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
    if orphaned():  # a parent died before the signal was armed
        os._exit(1)


def pin_to_core(rank: int) -> None:
    """With NEUROSHARD_PIN=1, pin a CPU rank/worker to core `rank % cores`. Off by default: on a machine with
    fewer cores than ranks, pinning makes all-to-all times less repeatable and slower (docs/findings.md)."""
    if os.environ.get("NEUROSHARD_PIN") != "1" or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


def _entry(rank, world, main_pid, env, port, group_device, gpu_ids, fn, args, q):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    # the parent may hold SIGINT/SIGTERM back while it starts us (run_processes): let them through, so
    # that the parent's terminate() stops us
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    die_with_parent(os.getppid(), main_pid)  # forked by the server, which ends when the parent does
    os.environ.clear()  # the parent's environment now, not the server's from when it started
    os.environ.update(env)
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


_PRELOAD = ("torch", "torch.distributed", "neuroshard.hardware.launch")  # what every rank or worker needs
_PRELOAD_IF_LOADED = ("fbgemm_gpu", "torchrec")  # what it needs when the parent does


def _context():
    """The processes' start method: forked from a server that has the heavy imports done (module
    docstring). The server starts with the first process and lives as long as this one."""
    from multiprocessing import forkserver

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*_PRELOAD, *(m for m in _PRELOAD_IF_LOADED if m in sys.modules)])
    # the server starts with SIGINT ignored, as workers run: a Ctrl-C to the terminal's process group during its
    # imports (seconds) printed a KeyboardInterrupt traceback from it; the parent's own handler is back at once
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        forkserver.ensure_running()
    except OSError:  # its socket cannot be made (a $TMPDIR too long for a socket path): spawn each one instead
        return mp.get_context("spawn")
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    return ctx


def run_processes(fn: WorkerFn, world: int, args: tuple, on_message: Callable[[Any], None],
                  group_device: str | None = None, gpu_ids: list[int] | None = None, what: str = "rank") -> None:
    """Run `fn(rank, world, emit, *args)` in `world` processes; `on_message` gets what they emit.

    `group_device` ("cpu" or "cuda") makes the processes the ranks of one process group; None runs
    independent workers (on `gpu_ids[rank]` when given).
    """
    if group_device is not None and in_torchrun():
        import torch.distributed as dist

        join_torchrun_group(group_device, RENDEZVOUS_TIMEOUT_S, gpu_ids)
        rank = dist.get_rank()
        fn(rank, dist.get_world_size(), on_message if rank == 0 else (lambda msg: None), *args)
        dist.barrier()
        dist.destroy_process_group()
        return
    gpu_ids = rank_gpus(group_device, world, gpu_ids, what)
    ctx = _context()
    q = ctx.Queue()
    port = _free_port() if group_device is not None else 0
    env = dict(os.environ)
    procs = [ctx.Process(target=_entry, args=(r, world, os.getpid(), env, port, group_device, gpu_ids, fn, args, q),
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
        with deferred_interrupts():  # a Ctrl-C or SIGTERM waits until every process has its start data whole (one
            for p in procs:          # cut off mid-start printed a traceback from its spawn bootstrap)
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
