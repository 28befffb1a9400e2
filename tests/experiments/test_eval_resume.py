"""eval.py keeps every measured plan: Ctrl-C mid-run, then the same command measures only the rest."""
import csv
import os
import signal
import subprocess
import sys
import time

import numpy as np

from neuroshard.core.artifacts import read_record_log
from neuroshard.data.tasks import generate_tasks, save_tasks
from neuroshard.experiments.evaluate import EVAL_PROGRESS_KIND

from conftest import ROOT, popen_interruptible, run_here


def test_eval_interrupt_and_resume(small_dataset, tmp_path, capsys):
    save_tasks(tmp_path / "t.pkl", generate_tasks(small_dataset, 4, (4, 8), 0.01, 32, seed=0), small_dataset)
    out = tmp_path / "e.csv"
    progress = tmp_path / "e.csv.progress.pkl"
    args = [sys.executable, str(ROOT / "eval.py"), "--data_dir", str(small_dataset.path), "--task_path",
            str(tmp_path / "t.pkl"), "--alg", "random,dim_greedy,size_greedy,lookup_greedy", "--ndevices", "2",
            "--max_mem", "1", "--warmup_iter", "1", "--num_iter", "15", "--results_csv", str(out)]
    proc = popen_interruptible(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        if progress.exists() and len(read_record_log(progress, EVAL_PROGRESS_KIND, "x")[1]) >= 3:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert not out.exists()
    kept = read_record_log(progress, EVAL_PROGRESS_KIND, "x")[1]
    assert 3 <= len(kept) < 16
    done = run_here(capsys, *args[1:])  # the resumed run: in this process (the interrupt above needs its own)
    assert done.returncode == 0, done.stderr
    assert f"{len(kept)} already measured" in done.stdout
    assert f"measuring {16 - len(kept)} plans" in done.stdout
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 16 and all(float(r["cost_ms"]) > 0 for r in rows)
    by_key = {(r["alg"], int(r["task"])): r for r in rows}
    for k in kept:  # the kept measurements are the ones reported
        assert np.allclose([float(x) for x in by_key[(k["alg"], k["task"])]["compute_ms"].split(";")],
                           k["compute_ms"], atol=1e-4)
    assert not progress.exists()  # the CSV now holds everything
