"""Output that is not a terminal is not hard-wrapped: messages and paths stay on one line.

Each command runs as a user's would, in a subprocess with stdout and stderr piped, inside a
folder whose path is far longer than any terminal is wide.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evotrainer.console import make_console


@pytest.fixture
def deep(tmp_path: Path) -> Path:
    folder = tmp_path.joinpath(*["a-folder-name-long-enough-to-need-wrapping"] * 5)
    folder.mkdir(parents=True)
    return folder


def _run(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR")}
    done = subprocess.run([sys.executable, "-m", "evotrainer", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)
    return done.stdout + done.stderr


def _whole_on_one_line(text: str, output: str) -> bool:
    return any(text in line for line in output.splitlines())


def test_piped_errors_and_tables_keep_paths_whole(deep: Path) -> None:
    absent = deep / "absent-pack"
    out = _run("tasks", "fetch", "--pack", str(absent), cwd=deep)
    assert _whole_on_one_line(f"task pack '{absent}' is neither a pack name", out), out

    ws = deep / "ws"
    out = _run("init", "--workdir", str(ws), cwd=deep)
    assert _whole_on_one_line(f"new math workspace {ws}", out), out
    assert _whole_on_one_line("curriculum.py, diagnostics.py, filters.py, harness.yaml, reward.py, rollout.py", out), out

    missing = deep / "missing.jsonl"
    out = _run("rollouts", "import", str(missing), "--workdir", str(ws), cwd=deep)
    assert _whole_on_one_line(str(missing), out), out

    not_a_folder = deep / "no-such-sdists"
    out = _run("tasks", "fetch", "--pack", str(deep), "--sdist-dir", str(not_a_folder), cwd=deep)
    assert _whole_on_one_line(str(deep / "sources.json"), out), out


def test_a_usage_error_off_a_terminal_is_one_line(deep: Path) -> None:
    bad = "--no-such-option-" + "x" * 90
    out = _run("backtest", "--workdir", str(deep / "ws"), bad, "main", cwd=deep)
    assert not any(ch in out for ch in "╭╰│"), out  # click's plain error, not a boxed panel
    assert _whole_on_one_line(f"No such option: {bad}", out), out


def test_tables_are_as_wide_as_their_cells_off_a_terminal(capsys) -> None:
    from rich.table import Table

    cell = "/" + "p" * 300
    table = Table()
    table.add_column("path")
    table.add_row(cell)
    make_console().print(table)
    make_console().print("a message " + cell)
    out = capsys.readouterr().out
    assert _whole_on_one_line(cell, out) and _whole_on_one_line("a message " + cell, out), out
