"""Runs the tests' `python SCRIPT ARGS...` launches without paying the heavy imports every time.

Started once per test session by `tests/conftest.py` (`ScriptServer`). It imports torch, fbgemm-gpu,
scipy and pandas (about 4 s of every script launch on the CI machine), runs nothing with them (no
thread pools exist yet, so forking is safe), then serves one request per line on stdin: a JSON object
{"argv": [...], "cwd": ..., "env": {...}, "stdout": path, "stderr": path}. For each it forks a child that does what
`python SCRIPT ARGS...` does (argv, sys.path[0] = the script's folder, `__main__`, stdin from
/dev/null, stdout/stderr to the files, atexit handlers at exit, exit status from SystemExit or 1 with
a traceback) in a process group of its own, and answers one line on the fd given as argv[1]:
{"pid": ...} when it starts, {"returncode": ...} when it ends (negative: killed by that signal, as
`subprocess` reports).
"""
import json
import os
import sys


def _child(req: dict) -> None:
    import atexit
    import runpy
    import traceback

    os.setpgid(0, 0)
    os.close(int(sys.argv[1]))
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        new = os.open(path, flags, 0o644)
        os.dup2(new, fd)
        os.close(new)
    script = os.path.abspath(req["argv"][0])
    sys.argv = [script, *req["argv"][1:]]
    sys.path[0] = os.path.dirname(script)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


def main() -> None:
    import importlib

    for name in ("torch", "fbgemm_gpu", "scipy.stats", "pandas", "tqdm"):
        try:
            importlib.import_module(name)
        except Exception:  # a missing optional package: the script that needs it will say so itself
            pass
    answer = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    answer.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        answer.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        answer.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    main()
