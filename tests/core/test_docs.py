"""The manual cannot rot: every command in a fenced shell block of README.md and docs/*.md that runs a project
script names a script that exists and passes only flags its argument parser has (the parser is built in this
process and never run); every table-list and plan example loads with the project's own loaders; Python examples
compile and import names that exist; relative links point to files."""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from unittest import mock

import pytest

from conftest import ROOT, load_script

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}


def fenced_blocks(path: Path) -> list[tuple[str, int, str]]:
    """(language, first line number, text) of every fenced code block in a markdown file."""
    blocks, lang, start, body = [], None, 0, []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.match(r"^\s*```\s*([\w+-]*)", line)
        if fence and lang is None:
            lang, start, body = fence.group(1).lower(), i + 1, []
        elif fence:
            blocks.append((lang, start, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"{path.name}: a code block opened at line {start - 1} is never closed"
    return blocks


def script_commands(text: str) -> list[tuple[str, list[str]]]:
    """(script, the words after it) of every command in a shell block that runs a project script."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        for i, w in enumerate(words):
            if w in ("-m", "-c"):  # python -m pytest ..., python -c ...: not a project script
                break
            if w.endswith(".py"):
                out.append((w, words[i + 1:]))
                break
    return out


def documented_commands() -> list[tuple[str, int, str, list[str]]]:
    found = []
    for doc in DOCS:
        for lang, line, text in fenced_blocks(doc):
            if lang in SHELL:
                found += [(f"{doc.relative_to(ROOT)}:{line}", line, s, args) for s, args in script_commands(text)]
    return found


class _Parser(Exception):
    def __init__(self, parser):
        self.parser = parser


def _grab(parser, *args, **kwargs):
    raise _Parser(parser)


@lru_cache(maxsize=None)
def script_options(script: str) -> dict[str, argparse.Action | None]:
    """Option string -> its argparse action, from the script's own parser: the script is imported (load_script,
    not as __main__) and its main() is called with parse_args replaced by a function that hands back the parser,
    so nothing runs. A script whose main() cannot give its parser that way is asked for --help in a subprocess."""
    try:
        main = load_script(script).main
        with mock.patch.object(argparse.ArgumentParser, "parse_args", _grab), \
                mock.patch.object(argparse.ArgumentParser, "parse_known_args", _grab):
            main([]) if inspect.signature(main).parameters else main()
    except _Parser as got:
        return {o: a for a in got.parser._actions for o in a.option_strings}
    except BaseException:  # noqa: BLE001 - any other way out: fall back to --help
        pass
    r = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, f"{script} --help failed: {r.stderr[-500:]}"
    return {o: None for o in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", r.stdout)}


def bad_flags(script: str, args: list[str]) -> list[str]:
    """What in `args` the script's parser would refuse: unknown flags, and values outside an option's choices."""
    options = script_options(script)
    wrong = []
    for i, word in enumerate(args):
        if not word.startswith("--"):
            continue
        flag, eq, value = word.partition("=")
        if flag not in options:
            wrong.append(flag)
            continue
        action = options[flag]
        if action is not None and action.choices and action.nargs != 0:
            value = value if eq else (args[i + 1] if i + 1 < len(args) else None)
            if value is not None and action.type is None and value not in action.choices:
                wrong.append(f"{flag} {value}")
    return wrong


COMMANDS = documented_commands()


def test_the_manual_documents_commands():
    scripts = {s for _, _, s, _ in COMMANDS}
    assert len(COMMANDS) >= 40 and {"tools/shard_tables.py", "tools/run_pipeline.py", "eval.py"} <= scripts


@pytest.mark.parametrize("where,line,script,args", COMMANDS, ids=[f"{w} {s}" for w, _, s, _ in COMMANDS])
def test_every_documented_command_names_a_script_and_flags_it_accepts(where, line, script, args):
    assert (ROOT / script).is_file(), f"{where}: {script} does not exist"
    assert bad_flags(script, args) == [], f"{where}: {script} does not accept these"


class _Checked(Exception):
    pass


def config_refusal(script: str, args: list[str]) -> str | None:
    """The documented command's flags through the script's own parser and its config's `check()` (the one the
    script runs before any work), in this process; stops there. The refusal line, or None when the config is
    accepted or the script builds no config through `config_from_args` (then only its flags are checked)."""
    from neuroshard.core.errors import UserError

    module = load_script(script)
    real = getattr(module, "config_from_args", None)
    if real is None or not inspect.signature(module.main).parameters:
        return None

    def stop(cls, parsed, **overrides):
        raise _Checked(real(cls, parsed, **overrides))

    try:
        try:
            with mock.patch.object(module, "config_from_args", stop):
                module.main(list(args))
        except _Checked as got:
            cfg = got.args[0]
            check = getattr(cfg, "check", None)
            # a check that needs what only the run knows (e.g. the ranks a launch has) is the run's to make
            if check is not None and not any(p.default is p.empty for p in inspect.signature(check).parameters.values()):
                check()
            return None
    except UserError as e:
        return str(e)
    except SystemExit as e:  # argparse's own refusal
        return f"exit {e.code}"
    raise AssertionError(f"{script}: main() returned without building its config")


@pytest.mark.parametrize("where,line,script,args", COMMANDS, ids=[f"{w} {s}" for w, _, s, _ in COMMANDS])
def test_every_documented_command_passes_its_configs_check(where, line, script, args):
    assert config_refusal(script, args) is None, f"{where}: {script} {' '.join(args)}"


def test_a_combination_the_tool_refuses_is_caught():
    """The check itself: flags each known to the parser, in a combination the config refuses."""
    assert config_refusal("tools/shard_tables.py", ["--tables", "t.csv"]) is None
    assert "--min_gain" in config_refusal("tools/shard_tables.py", ["--tables", "t.csv", "--alg", "dim_greedy",
                                                                     "--min_gain", "0.1"])


def test_a_renamed_flag_is_caught(tmp_path):
    """The check itself: a script whose parser lost a flag makes the documented command fail the test."""
    for n, (kind, call) in enumerate([("step_parser", "step_parser(Cfg).parse_args(argv)"),
                                      ("argparse", "p.parse_args()")]):
        script = tmp_path / f"renamed_{n}.py"
        script.write_text(
            "import argparse\nfrom dataclasses import dataclass\n"
            "from neuroshard.core.cli import step_parser\n\n"
            "@dataclass\nclass Cfg:\n    new_name: int = 1\n    dct: str = 'none'\n\n"
            "def main(argv=None):\n"
            "    p = argparse.ArgumentParser()\n    p.add_argument('--new_name')\n"
            "    p.add_argument('--dct', choices=['none', 'dp'])\n"
            f"    {call}\n    raise SystemExit('ran')\n")
        assert bad_flags(str(script), ["--new_name", "3"]) == [], kind
        assert bad_flags(str(script), ["--old_name", "3"]) == ["--old_name"], kind
    assert bad_flags(str(script), ["--dct", "dp"]) == []
    assert bad_flags(str(script), ["--dct", "mp"]) == ["--dct mp"]


def _examples(lang: str) -> list[tuple[str, str]]:
    return [(f"{doc.relative_to(ROOT)}:{line}", text) for doc in DOCS
            for lg, line, text in fenced_blocks(doc) if lg == lang]


def test_every_table_list_and_plan_example_loads_with_the_projects_loaders(tmp_path):
    from neuroshard.data.table_list import load_table_list
    from neuroshard.sharding.plan_file import PLAN_KIND, read_plan_file
    from neuroshard.sharding.torchrec_export import SPEC_KIND

    loaded = {"table list": 0, "plan": 0}
    for n, (where, text) in enumerate(_examples("csv") + _examples("json")):
        suffix = ".csv" if text.lstrip()[:1] not in "[{" else ".json"
        path = tmp_path / f"example_{n}{suffix}"
        path.write_text(text + "\n", encoding="utf-8")
        kind = json.loads(text).get("kind") if suffix == ".json" and text.lstrip().startswith("{") else None
        if kind in (SPEC_KIND, PLAN_KIND):
            spec = read_plan_file(path)
            assert spec["tables"], where
            loaded["plan"] += 1
        else:
            tables = load_table_list(path)
            assert len(tables.names) >= 1, where
            loaded["table list"] += 1
    assert loaded["table list"] >= 2 and loaded["plan"] >= 1, loaded


def test_python_examples_compile_and_import_names_that_exist():
    examples = _examples("python")
    assert examples
    for where, text in examples:
        compile(text, where, "exec")
        for module, names in re.findall(r"^from (neuroshard[\w.]*) import ([\w, ]+)$", text, re.M):
            mod = importlib.import_module(module)
            if module == "neuroshard" and "NeuroShardPlanner" in names:
                continue  # imports TorchRec; tested in tests/sharding/test_torchrec_planner.py
            for name in (n.strip() for n in names.split(",")):
                assert hasattr(mod, name), f"{where}: {module} has no {name}"


def test_relative_links_point_to_files():
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} links to missing {target}"


def test_every_image_in_docs_is_shown_somewhere():
    text = "".join(d.read_text(encoding="utf-8") for d in DOCS)
    unused = [p.name for p in (ROOT / "docs").glob("*.png") if p.name not in text]
    assert unused == [], "images nothing refers to: " + ", ".join(unused)


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
