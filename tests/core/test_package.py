"""The package as a user installs it: `pip install .` builds a wheel holding every module; installed into
a fresh virtual environment (no editable path, no checkout on sys.path) every module imports and every
step script answers --help. Also: `core/` imports nothing above it."""
import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT

SCRIPTS = ["tools/gen_dlrm_data.py", "tools/gen_tasks.py", "collect_compute_cost_data.py", "collect_comm_cost_data.py",
           "train_compute_cost_model.py", "train_comm_cost_model.py", "eval_simulator.py", "eval.py",
           "tools/shard_tables.py", "tools/run_pipeline.py", "tools/train_dlrm.py"]


def _modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "neuroshard").rglob("*.py"))


def test_core_imports_nothing_above_it():
    for path in (ROOT / "neuroshard/core").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                assert node.module is None and all(a.name == "__version__" for a in node.names), \
                    f"{path.name} imports ..{node.module} (core/ may import only core/)"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith("neuroshard."), f"{path.name} imports {node.module}"


def test_wheel_installs_into_a_fresh_venv_with_every_module(tmp_path):
    import shutil

    # build from a copy: an in-tree build leaves build/ behind, whose stale modules a later wheel would carry
    src = tmp_path / "src"
    shutil.copytree(ROOT / "neuroshard", src / "neuroshard", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.py", src / "setup.py")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, timeout=300, cwd=tmp_path)
    (wheel,) = wheels.glob("neuroshard-*.whl")
    in_wheel = sorted(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py"))
    assert in_wheel == _modules()

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=env)
    py = venv / "bin/python"
    # the fresh venv sees the test venv's third-party packages (torch, ...) through a plain path entry,
    # whose own .pth files (the checkout's editable install among them) are not processed
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    deps = next(p for p in sys.path if p.endswith("site-packages"))
    Path(site, "deps.pth").write_text(deps + "\n")
    # --ignore-installed: the checkout's editable install is visible through deps.pth, and must not count
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
                   check=True, capture_output=True, timeout=300, env=env, cwd=tmp_path)

    work = tmp_path / "elsewhere"
    work.mkdir()
    for s in SCRIPTS:  # the scripts, away from the checkout
        (work / Path(s).name).write_text((ROOT / s).read_text())
    check = f"""
import importlib, runpy, sys, pkgutil, io, contextlib
import neuroshard
assert neuroshard.__file__.startswith({str(venv)!r}), neuroshard.__file__
mods = sorted(m.name for m in pkgutil.walk_packages(neuroshard.__path__, 'neuroshard.'))
for m in mods:
    importlib.import_module(m)
print(len(mods) + 1, 'modules')
for s in {[Path(s).name for s in SCRIPTS]!r}:
    sys.argv = [s, '--help']
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(s, run_name='__main__')
    except SystemExit as e:
        assert e.code in (0, None), (s, e.code)
    assert 'usage:' in out.getvalue(), s
print('scripts ok')
"""
    proc = subprocess.run([str(py), "-c", check], cwd=work, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(_modules())} modules" in proc.stdout and "scripts ok" in proc.stdout
