import signal
import subprocess
import sys
from pathlib import Path

import pytest

from neuroshard.data.dataset import DLRMDataset, process_raw
from neuroshard.data.synthetic import SyntheticConfig, generate_synthetic_raw

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def small_raw():
    """A small synthetic dataset in the real raw format: 24 tables, batch 256."""
    return generate_synthetic_raw(SyntheticConfig(num_tables=24, batch_size=256, seed=3, row_scale=1e-3),
                                  progress=False)


@pytest.fixture(scope="session")
def small_dataset(small_raw, tmp_path_factory) -> DLRMDataset:
    out = tmp_path_factory.mktemp("ds")
    return process_raw(*small_raw, out_dir=out, source={"source": "test"}, progress=False)


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_interruptible(args, **kwargs) -> subprocess.Popen:
    """Start `args` in a new process group with Ctrl-C (SIGINT) handled as in a terminal. A shell
    that runs a job in the background without job control (`nohup make test &`) makes its children
    ignore SIGINT, and Python keeps an inherited SIG_IGN, so Ctrl-C tests would otherwise depend on how
    pytest was launched."""
    return subprocess.Popen(args, start_new_session=True, preexec_fn=_sigint_as_in_a_terminal, **kwargs)


def run_script(script: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    """Run a step script as a user would; returns the finished process."""
    return subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], capture_output=True,
                          text=True, cwd=cwd or ROOT, timeout=600)


def assert_clean_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Non-zero exit, no traceback, and one `error:` line naming the problem."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for f in fragments:
        assert f in errors[0], errors[0]


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).exists() else []


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
