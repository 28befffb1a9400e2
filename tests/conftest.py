import atexit
import contextlib
import io
import json
import os
import platform
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from neuroshard.core.config import Preset
from neuroshard.data.dataset import DLRMDataset, process_raw
from neuroshard.data.synthetic import SyntheticConfig, generate_synthetic_raw

ROOT = Path(__file__).resolve().parent.parent

# In-process torch work runs on one thread, whatever the test order: before, the first test of
# tests/hardware/test_hardware.py set this for the rest of the session, so a test's numbers depended on
# what ran before it, and the tests ahead of it ran small ops on two threads that stall for seconds on a
# busy 2-core machine. Workers and ranks set their own (neuroshard.hardware.launch); scripts are untouched.
torch.set_num_threads(1)


def pytest_configure(config):
    """TorchRec imported once, before any run starts its processes' server: the server then has it loaded for every
    rank that builds a TorchRec step (neuroshard.hardware.launch), rather than each rank importing it (5-6 s). Not in
    pytest-xdist's controller, which runs no test."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    try:
        import torchrec  # noqa: F401
    except ImportError:  # the tests that need it skip
        pass


@pytest.fixture(scope="session")
def small_raw():
    """A small synthetic dataset in the real raw format: 24 tables, batch 256."""
    return generate_synthetic_raw(SyntheticConfig(num_tables=24, batch_size=256, seed=3, row_scale=1e-3),
                                  progress=False)


@pytest.fixture(scope="session")
def small_dataset(small_raw, tmp_path_factory) -> DLRMDataset:
    out = tmp_path_factory.mktemp("ds")
    return process_raw(*small_raw, out_dir=out, source={"source": "test"}, progress=False)


# The pipeline's tiny preset: every step on a few samples (the cost-model fits need 10 of each kind;
# the family mix collects 1.5 x compute_samples), one compute worker, 3 test tasks for the paired intervals.
TINY = Preset(num_tables=24, batch_size=256, row_scale=1e-3, task_max_mem=0.02, max_mem=0.01, T_range=(4, 8),
              num_train_tasks=2, num_test_tasks=3, ndevices=(2,), compute_samples=10, compute_workers=1,
              comm_samples=10, epochs=3, eval_warmup=1, eval_iters=2, eval_rounds=1, collective_samples=10,
              families=True)


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory) -> SimpleNamespace:
    """The whole pipeline (`run_pipeline`, preset TINY) run once for the test run: `work` (its folder:
    data/dlrm_datasets, data/cost_data, models, results; read it, copy it to change it), `report` (the summary's
    path) and `stdout` (what the run printed). Under pytest-xdist the first worker to need it runs it, holding a
    lock in the run's shared temporary folder, and the others read what it left there."""
    import fcntl

    from neuroshard.core.config import PipelineConfig
    from neuroshard.experiments.pipeline import PRESETS, run_pipeline

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    work, done = shared / "tiny_pipeline", shared / "tiny_pipeline.json"
    with open(shared / "tiny_pipeline.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(work, ignore_errors=True)  # what a worker killed while running it left
            work.mkdir()
            out = io.StringIO()
            PRESETS["tiny"] = TINY
            try:
                with contextlib.redirect_stdout(out):
                    report = run_pipeline(PipelineConfig("tiny", str(work)))
            finally:
                del PRESETS["tiny"]
            done.write_text(json.dumps({"report": str(report), "stdout": out.getvalue()}))
    got = json.loads(done.read_text())
    return SimpleNamespace(work=work, report=Path(got["report"]), stdout=got["stdout"])


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_interruptible(args, **kwargs) -> subprocess.Popen:
    """Start `args` in a new process group with Ctrl-C (SIGINT) handled as in a terminal. A shell
    that runs a job in the background without job control (`nohup make test &`) makes its children
    ignore SIGINT, and Python keeps an inherited SIG_IGN, so Ctrl-C tests would otherwise depend on how
    pytest was launched."""
    return subprocess.Popen(args, start_new_session=True, preexec_fn=_sigint_as_in_a_terminal, **kwargs)


class ScriptServer:
    """`python SCRIPT ARGS...` for the tests, forked from one process that has already imported torch and
    the other heavy packages (`tests/script_server.py`): the same script run as `__main__` with the same
    argv, environment and working folder, about 4 s faster a launch. One per session, started on first use."""

    def __init__(self):
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "script_server.py"), str(write_fd)],
                                     stdin=subprocess.PIPE, text=True, pass_fds=(write_fd,))
        os.close(write_fd)
        self.answers = os.fdopen(read_fd, "r")
        self.lock = threading.Lock()
        assert self._answer(120) == {"ready": True}, "tests/script_server.py did not start"

    def _answer(self, timeout_s: float) -> dict | None:
        if not select.select([self.answers], [], [], timeout_s)[0]:
            return None
        line = self.answers.readline()
        if not line:
            raise RuntimeError("tests/script_server.py stopped")
        return json.loads(line)

    def run(self, argv: list[str], cwd, timeout_s: float) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory(prefix="neuroshard-test-script-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            self.proc.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd), "env": dict(os.environ),
                                              "stdout": str(out), "stderr": str(err)}) + "\n")
            self.proc.stdin.flush()
            pid = self._answer(60)["pid"]
            done = self._answer(timeout_s)
            if done is None:
                os.killpg(pid, signal.SIGKILL)
                self._answer(60)
                raise subprocess.TimeoutExpired(argv, timeout_s, out.read_text(), err.read_text())
            return subprocess.CompletedProcess([sys.executable, *argv], done["returncode"], out.read_text(),
                                               err.read_text())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


_server: list[ScriptServer] = []


def run_python(script, *args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS...` with captured text output, as `subprocess.run` would run it (see ScriptServer)."""
    if not _server or _server[0].proc.poll() is not None:
        _server[:] = [ScriptServer()]
        atexit.register(_server[0].close)
    return _server[0].run([str(script), *map(str, args)], cwd or ROOT, timeout)


def run_script(script: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    """Run a step script as a user would; returns the finished process."""
    return run_python(ROOT / script, *args, cwd=cwd)


# ----------------------------------------------------------------------------- hostile pickles

class MarkerPayload:
    """Unpickling this runs `touch MARKER` through os.system: a loader that runs code creates the file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


class TorchBytesPayload:
    """The same payload hidden behind torch.storage._load_from_bytes (a torch.load without weights_only)."""

    def __init__(self, marker):
        import io

        import torch

        buf = io.BytesIO()
        torch.save(MarkerPayload(marker), buf)
        self.data = buf.getvalue()

    def __reduce__(self):
        import torch.storage

        return (torch.storage._load_from_bytes, (self.data,))


def hostile_objects(marker):
    """Objects whose unpickling would create `marker`, wrapped as a plausible artifact."""
    return [MarkerPayload(marker), {"kind": "x", "meta": {"evil": TorchBytesPayload(marker)}},
            {"tasks": [MarkerPayload(marker)]}]


# ----------------------------------------------------------------------------- native kernels

def compiler_found() -> bool:
    """Whether this x86-64 machine has the C compiler `neuroshard.core.native` compiles with ($CC, else cc): where it
    does, a kernel that fails to load is a bug, not the machine."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        return shutil.which(shlex.split(os.environ.get("CC") or "cc")[0]) is not None
    except (ValueError, IndexError):  # a $CC that shlex cannot split, or an empty one
        return False


# ----------------------------------------------------------------------------- scripts in this process, and refusals

_scripts: dict[str, object] = {}


def load_script(script: str):
    """SCRIPT (a path from the repository root: `eval.py`, `tools/shard_tables.py`, `benchmarks/dct.py`) imported as
    a module, once a session: its `main(argv)` is what `python SCRIPT ARGV` runs, and a test may monkeypatch the
    names it imported. While it is imported its folder comes first on sys.path, as `python SCRIPT` puts it there
    (a benchmark imports `benchmarks/common.py` as `common`)."""
    import importlib.util

    if script not in _scripts:
        name = "script_" + "".join(c if c.isalnum() else "_" for c in script[:-len(".py")])
        spec = importlib.util.spec_from_file_location(name, ROOT / script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a script's config is a dataclass, which looks its module up
        folder = str((ROOT / script).parent)
        sys.path.insert(0, folder)
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(folder)
        _scripts[script] = module
    return _scripts[script]


def run_in_process(capsys, script, *argv, cwd=None) -> tuple[int, str, str]:
    """`python SCRIPT ARGV` in this process (SCRIPT a path as load_script takes, or a loaded script module): its
    main through `run_main`, as the script's last line runs it, in `cwd` (the repository root unless given, as
    run_script runs it). Returns (exit code, stdout, stderr)."""
    from neuroshard.core.cli import run_main

    module = load_script(script) if isinstance(script, str) else script
    here, args, sigterm = os.getcwd(), sys.argv, signal.getsignal(signal.SIGTERM)
    os.chdir(cwd or ROOT)
    sys.argv = [module.__file__, *map(str, argv)]  # argparse names the script from it: "(see SCRIPT --help)"
    try:
        with pytest.raises(SystemExit) as e:
            run_main(module.main, [str(a) for a in argv])
    finally:
        os.chdir(here)
        sys.argv = args
        signal.signal(signal.SIGTERM, sigterm)  # run_main set its own
    out = capsys.readouterr()
    return e.value.code or 0, out.out, out.err


def run_here(capsys, script, *argv, cwd=None) -> subprocess.CompletedProcess:
    """`run_script` in this process (run_in_process), for a test of what the run does rather than of its process:
    its ranks fork from this process's warm server instead of a new one (neuroshard.hardware.launch)."""
    code, out, err = run_in_process(capsys, script, *argv, cwd=cwd)
    return subprocess.CompletedProcess([str(script), *map(str, argv)], code, out, err)


def tree(*folders) -> dict:
    """Every file, folder and other entry under `folders` (themselves included): a file's bytes, else its type.
    Equal before and after a run: the run added, removed and changed nothing there."""
    import stat

    out = {}
    for top in map(Path, folders):
        for p in [top, *top.rglob("*")] if top.exists() else []:
            mode = p.lstat().st_mode
            out[str(p)] = p.read_bytes() if stat.S_ISREG(mode) else stat.S_IFMT(mode)
    return out


def refused(capsys, script, *argv, match: str, untouched=(), quiet: bool = True, cwd=None) -> str:
    """`python SCRIPT ARGV` (run_in_process) is refused as a user sees it: exit 2; one line `error: ...` that the
    regular expression `match` matches whole (re.fullmatch: write `.*` only where a part is not the point); no file
    or folder under `untouched` added, removed or changed. Where `quiet` (a refusal before any work) that line is
    all the run printed; else it is stderr's last line and its only error, after what the work printed (progress,
    notes). Returns stdout."""
    import re

    before = tree(*untouched)
    code, out, err = run_in_process(capsys, script, *argv, cwd=cwd)
    assert code == 2, (code, out, err)
    lines = err.splitlines()
    assert lines and [l for l in lines if l.startswith("error:")] == lines[-1:] and "Traceback" not in err, (out, err)
    assert not quiet or (out == "" and len(lines) == 1), (out, err)
    line = lines[-1]
    assert re.fullmatch(match, line), f"{line!r} does not match {match!r}"
    assert tree(*untouched) == before, "the refused run wrote there"
    return out


# ----------------------------------------------------------------------------- a full disk

def no_space() -> OSError:
    """The error a write gets on a full disk."""
    import errno

    return OSError(errno.ENOSPC, "No space left on device")


def disk_full(monkeypatch, writes_ok: int = 0) -> None:
    """The disk is full: every write of the package's writers (`neuroshard.core.artifacts`) after the first
    `writes_ok` fails with ENOSPC (a run's first write is its output lock's pid). `monkeypatch.undo()` frees the
    space."""
    from neuroshard.core import artifacts

    real, done = artifacts.atomic.os.write, []

    def write(fd, data):
        if len(done) >= writes_ok:
            raise no_space()
        done.append(fd)
        return real(fd, data)

    monkeypatch.setattr(artifacts.atomic.os, "write", write)
