"""benchmarks/real_tables.py checks everything cheap before it calibrates for minutes (issue 39), in-process:
a budget that is not a number, an unknown table set, too few devices, an --out_dir it cannot write or one
another run is writing: one line, exit 2, nothing written, no models loaded."""
import os
import re

import pytest

from neuroshard.core.artifacts import OutputLock

from conftest import ROOT, load_script, refused

real_tables = load_script("benchmarks/real_tables.py")


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    def measured(*a, **k):
        raise AssertionError("work started before the checks")

    monkeypatch.setattr(real_tables, "measure_sets", measured)


@pytest.mark.parametrize("args,line", [
    (["--measure_budget_s", "nan"], "--measure_budget_s must be a finite number > 0, got nan"),
    (["--measure_budget_s", "-5"], "--measure_budget_s must be a finite number > 0, got -5"),
    (["--measure_budget_s", "soon"], "argument --measure_budget_s: invalid float value: 'soon' (see real_tables.py "
                                     "--help)"),
    (["--sets", "criteo_kaggle,criteo_tb"], "--sets: unknown table set 'criteo_tb'; choose from criteo_kaggle, "
                                            "criteo_terabyte_mlperf, criteo_multihot_mlperf_dcnv2, taobao_ad_x1_din"),
    (["--sets", "criteo_kaggle,"], "--sets has an empty entry: 'criteo_kaggle,'"),
    (["--ndevices", "1"], "--ndevices must be >= 2 (an all-to-all needs peers)"),
    (["--max_mem", "inf"], "--max_mem must be a finite number > 0 and <= 1e+06, got inf"),
    (["--num_iter", "0"], "--num_iter must be >= 1 and <= 100000, got 0"),
    (["--refine", "-1"], "--refine must be >= 0 and <= 20, got -1"),
    (["--refine", "21"], "--refine must be >= 0 and <= 20, got 21"),
    (["--refine", "two"], "argument --refine: invalid int value: 'two' (see real_tables.py --help)"),
    (["--cost", "steps"], "argument --cost: invalid choice: 'steps' (choose from 'step', 'paper') (see real_tables.py "
                          "--help)"),
])
def test_bad_flags_get_one_line_before_any_work(capsys, tmp_path, args, line):
    refused(capsys, real_tables, *args, "--out_dir", tmp_path / "out", match=re.escape(f"error: {line}"),
            untouched=[tmp_path])


def test_an_out_dir_it_cannot_write_or_another_run_holds_gets_one_line(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    refused(capsys, real_tables, "--out_dir", tmp_path / "file", untouched=[tmp_path], match=re.escape(
        f"error: --out_dir {tmp_path}/file: cannot write results there (File exists); choose a folder you can write"))
    out = tmp_path / "out"
    with OutputLock([("--out_dir", out / "real_tables.md")]):
        refused(capsys, real_tables, "--out_dir", out, untouched=[tmp_path], match=re.escape(
            f"error: --out_dir {out}/real_tables.md is being written by another run (pid {os.getpid()}); wait for it "
            "to finish or choose another --out_dir"))
    assert not out.exists()  # the refused run wrote nothing there; the holder's lock made the folder and removed it


def test_every_cited_set_is_benchmarked_and_fits_the_default_ranks(tmp_path):
    """Each table list in benchmarks/real_tables/ is a set the benchmarks run (and each set has a file); it names
    its source, and scaled as the benchmarks scale it, it loads as a table list and fits 4 ranks of the default
    --max_mem with room for a plan (at most 3/4 of their memory, no table over one rank's)."""
    import json

    from neuroshard.data.table_list import load_table_list

    files = sorted(p.stem for p in (ROOT / "benchmarks/real_tables").glob("*.json"))
    assert files == sorted(real_tables.SETS)
    max_mem = real_tables.RealTablesConfig().max_mem
    for name, scale in real_tables.SETS.items():
        raw = json.loads((ROOT / "benchmarks/real_tables" / f"{name}.json").read_text())
        assert raw["name"] == name and len(raw["source"]) > 80, name
        tables = load_table_list(real_tables.scaled_table_list(name, scale, tmp_path / f"{name}.json"), max_mem)
        size_gb = tables.task.sizes_gb()
        assert len(size_gb) == len(raw["tables"]) and size_gb.min() > 0, name
        assert size_gb.max() <= max_mem and size_gb.sum() <= 0.75 * 4 * max_mem, (name, size_gb.sum())
