"""Process launch faults: errors reach the parent with the right rank, signals are named, a killed
parent leaves no worker alive, and Ctrl-C keeps results already sent."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuroshard.core.errors import UserError
from neuroshard.hardware.launch import run_processes

import launch_workers as w


def test_exception_in_a_rank_reaches_the_parent_with_its_rank():
    with pytest.raises(UserError) as e:
        run_processes(w.fail_on_rank_1, 3, (), print, group_device="cpu")
    assert "rank 1 failed: ValueError: boom on rank 1" in str(e.value)


def test_rank_killed_by_a_signal_is_named():
    with pytest.raises(UserError, match="rank 2 was killed by SIGKILL"):
        run_processes(w.killed_rank_2, 3, (), print, group_device="cpu")


def test_ctrl_c_keeps_every_result_already_sent(tmp_path):
    got, raised_at = [], []

    def on_message(msg):
        got.append(msg)
        if len(got) == 1:  # Ctrl-C once every worker has sent everything, while 9 results are still in the pipe
            deadline = time.monotonic() + 120
            while len(list(tmp_path.glob("sent_*"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            raised_at.append(time.monotonic())
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_processes(w.emit_then_sleep, 2, (5, str(tmp_path)), on_message, what="worker")
    assert sorted(got) == [(r, i) for r in range(2) for i in range(5)]
    assert time.monotonic() - raised_at[0] < 300  # the workers (asleep for 600 s) were terminated, not waited for


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_killed_parent_leaves_no_worker_alive():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    parent = subprocess.Popen([sys.executable, w.__file__, "3"], stdout=subprocess.PIPE, text=True, env=env)
    pids = [int(parent.stdout.readline()) for _ in range(3)]
    assert all(_alive(p) for p in pids)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "workers outlived their parent"


STOPPED_WHILE_STARTING = """
import multiprocessing.forkserver as forkserver, multiprocessing.popen_forkserver as popen, os, signal, sys
sys.path.insert(0, {here!r})
import launch_workers as w
from neuroshard.core.cli import run_main
from neuroshard.hardware.launch import run_processes

connect, launch, asked = forkserver.connect_to_new_process, popen.Popen._launch, []
def connect_then_sigterm(fds):  # SIGTERM lands once the server is asked to fork the second worker, before
    asked.append(1)              # that worker has its start data
    answer = connect(fds)
    if len(asked) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    return answer
def launch_and_say(self, process_obj):
    launch(self, process_obj)
    print(self.pid, flush=True)
forkserver.connect_to_new_process, popen.Popen._launch = connect_then_sigterm, launch_and_say
run_main(lambda argv: run_processes(w.report_pid_and_sleep, 3, (), lambda pid: None, what="worker"), [])
"""


def test_sigterm_while_workers_start_stops_them_without_a_traceback():
    """A SIGTERM (or Ctrl-C) that arrives while the workers are being started waits until each has its start
    data whole: no worker's bootstrap prints a traceback, the run exits 143, and no worker outlives it (they
    start with the signals held back and let them through again)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", STOPPED_WHILE_STARTING.format(here=str(Path(w.__file__).parent))],
                          capture_output=True, text=True, env=env, timeout=120)
    pids = [int(line) for line in proc.stdout.split()]
    assert proc.returncode == 143, proc.stderr
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr
    assert len(pids) == 3  # every worker was started before the signal was let through
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "workers outlived their parent"


def test_the_worker_server_starts_with_ctrl_c_ignored():
    """The forkserver imports torch (and TorchRec) for seconds after it starts, in the terminal's process group: it
    starts with SIGINT ignored, as the workers run (a Ctrl-C then printed its KeyboardInterrupt traceback beside the
    script's one line), and the parent's own Ctrl-C handler is back at once."""
    code = """
import multiprocessing.forkserver as forkserver, signal
from neuroshard.hardware.launch import _context
_context()
ignored = int(next(l for l in open(f"/proc/{forkserver._forkserver._forkserver_pid}/status") if l.startswith("SigIgn")).split()[1], 16)
print(bool(ignored & (1 << (signal.SIGINT - 1))), signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""
    if not Path("/proc/self/status").exists():
        pytest.skip("reads a process's signal mask from /proc")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.split() == ["True", "True"], proc.stderr


def test_each_run_gets_the_environment_and_folder_of_its_parent_at_that_moment(tmp_path, monkeypatch):
    """Processes fork from a server started with the first run; a variable set and a folder entered after it
    started still reach the next run's processes, as they would reach spawned ones."""
    run_processes(w.report_env, 1, ("NEUROSHARD_TEST_VALUE",), lambda m: None, what="worker")  # the server runs
    monkeypatch.setenv("NEUROSHARD_TEST_VALUE", "set later")
    monkeypatch.chdir(tmp_path)
    got = []
    run_processes(w.report_env, 2, ("NEUROSHARD_TEST_VALUE",), got.append, group_device="cpu")
    assert sorted(m[:3] for m in got) == [(r, "set later", str(tmp_path)) for r in range(2)]


FROM_A_LONG_TMPDIR = """
import sys
sys.path.insert(0, {here!r})
import launch_workers as w
from neuroshard.hardware.launch import run_processes

got = []
run_processes(w.report_env, 2, ("TMPDIR",), got.append, group_device="cpu")
print(sorted(m[:2] for m in got))
"""


def test_a_tmpdir_too_long_for_the_servers_socket_still_runs(tmp_path):
    """The fork server listens on a socket in $TMPDIR; where its path is longer than a socket path may be
    (108 bytes), each process is spawned instead, and the run does what it would."""
    long_tmp = tmp_path / ("d" * 120)
    long_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(long_tmp), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", FROM_A_LONG_TMPDIR.format(here=str(Path(w.__file__).parent))],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() == str([(0, str(long_tmp)), (1, str(long_tmp))])


def test_torchrec_deprecations_are_muted_and_other_warnings_kept():
    """The FutureWarnings TorchRec's own code triggers in torch are muted in the ranks; any other warning still
    shows, a FutureWarning included."""
    import warnings

    from neuroshard.hardware.launch import quiet_torchrec_logs

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_torchrec_logs()
        for text in ("`torch.distributed.all_gather_into_tensor` is deprecated. Please use ...",
                     "`torch.distributed.reduce_scatter_tensor` is deprecated. Please use ...",
                     "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead."):
            warnings.warn(text, FutureWarning)
        warnings.warn("`torch.distributed.all_to_all_single` is deprecated", FutureWarning)
        warnings.warn("`broadcast_buffers` is deprecated", UserWarning)
    assert [(w.category, str(w.message)) for w in seen] == [
        (FutureWarning, "`torch.distributed.all_to_all_single` is deprecated"),
        (UserWarning, "`broadcast_buffers` is deprecated")]
