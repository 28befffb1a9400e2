"""Worker functions for the launch tests (importable by spawned processes)."""
import os
import signal
import sys
import time


def fail_on_rank_1(rank, world, emit):
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()  # the others wait for rank 1, then lose it


def killed_rank_2(rank, world, emit):
    import torch.distributed as dist

    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def emit_then_sleep(rank, world, emit, n, flag_dir):
    for i in range(n):
        emit((rank, i))
    time.sleep(2)  # the queue's feeder thread has written them to the pipe
    open(os.path.join(flag_dir, f"sent_{rank}"), "w").close()
    time.sleep(600)  # far past any bound the test sets: only terminate() ends it in time


def report_pid_and_sleep(rank, world, emit):
    emit(os.getpid())
    time.sleep(120)


if __name__ == "__main__":  # a parent that prints its workers' pids, then waits to be killed
    sys.path.insert(0, os.path.dirname(__file__))
    from neuroshard.hardware.launch import run_processes

    run_processes(report_pid_and_sleep, int(sys.argv[1]), (), lambda pid: print(pid, flush=True), what="worker")


def report_env(rank, world, emit, name):
    """Send (rank, $name, working folder, the parent's pid)."""
    emit((rank, os.environ.get(name), os.getcwd(), os.getppid()))
