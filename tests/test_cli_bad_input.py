"""Every command of the CLI, given bad input, says so in one `Error:` line and exits 2: no traceback.

The commands are read from the typer app, so a new command fails `test_bad_input_exits_2` until
CASES says how to give it bad input. Each case is `python -m evotrainer ARGS` in a process of its
own, with input that fails before any model is loaded or any network is reached. A cold start of
the CLI costs seconds of imports, so one driver process imports it once and forks a child per case,
which runs the `evotrainer` module as `-m` does (runpy) with its own cwd, stdout and stderr;
`test_cold_start_answers_the_same` checks that a real `python -m evotrainer` answers alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

from evotrainer.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
MAX_ERROR_LINES = 8  # click's usage errors take four: usage, "Try ... --help", blank, "Error: ..."

# {missing}: a path that does not exist; {tmp}: an empty folder; {ws}: a fresh math workspace
# (harness repo only, no store). Each argv is one bad input.
CASES: dict[str, list[list[str]]] = {
    "init": [["--domain", "no-such-domain", "--workdir", "{tmp}/new"],
             ["--domain", "code", "--workdir", "{ws}"]],  # a math workspace
    "train": [["not-a-key-value"], ["--domain", "no-such-domain"], ["--config", "{missing}.yaml"],
              ["--domain", "no_such_package.tasks:make"], ["--domain", "json:loads", "--workdir", "{tmp}"],
              ["--domain", "math", "domain.options.nope=1", "--workdir", "{tmp}"]],
    "coevolve": [["not-a-key-value"], ["--workdir", "{tmp}", "train.no_such_key=1"]],
    "eval": [["not-a-key-value"], ["--adapter", "{missing}"]],
    "config": [["not-a-key-value"], ["--domain", "no-such-domain"]],
    "backtest": [["main", "--workdir", "{missing}"], ["main", "--workdir", "{ws}"],  # no store
                 ["main", "--workdir", "{ws}", "--rollouts", "run"]],
    "backtests list": [["--workdir", "{missing}"]],
    "backtests show": [["some-id", "--workdir", "{missing}"]],
    "backtests replay": [["some-id", "--workdir", "{missing}"]],
    "diagnose": [["--workdir", "{missing}"], ["--workdir", "{ws}"]],
    "grade": [["--tasks", "{missing}.jsonl", "--predictions", "{missing}.jsonl"],
              ["--domain", "math", "--predictions", "{missing}.jsonl"],
              ["--domain", "no-such-domain", "--predictions", "{missing}.jsonl"],
              ["--domain", "tasks", "--tasks", "{missing}.jsonl", "--predictions", "{missing}.jsonl"]],
    "domains": [["--no-such-flag"]],
    "bench harness": [["--cases-dir", "{missing}"], ["no-such-case"], ["--agent", "nope"],
                      ["--cases-dir", "{tmp}"]],
    "judge": [["not-a-key-value"], ["--workdir", "{missing}", "judge.model=m", "judge.base_url=http://127.0.0.1:9"]],
    "review": [["--workdir", "{missing}"]],
    "report": [["--workdir", "{missing}"]],
    "status": [["--workdir", "{missing}"]],
    "rollouts ls": [["--workdir", "{missing}"]],
    "rollouts show": [["some-id", "--workdir", "{missing}"]],
    "rollouts export": [["{tmp}/out.jsonl", "--workdir", "{missing}"]],
    "rollouts import": [["{missing}.jsonl", "--workdir", "{tmp}"]],
    "harness log": [["--workdir", "{missing}"]],
    "harness show": [["main", "--workdir", "{missing}"], ["no-such-rev", "--workdir", "{ws}"]],
    "harness diff": [["main", "no-such-rev", "--workdir", "{ws}"]],
    "skills list": [["--workdir", "{missing}"]],
    "skills show": [["no-such-skill"]],
    "skills search": [["retry", "--workdir", "{missing}"]],
    "experience list": [["--workdir", "{missing}"]],
    "experience show": [["some-id", "--workdir", "{missing}"]],
    "experience search": [["retry", "--workdir", "{missing}"]],
    "experience distill": [["--workdir", "{missing}"]],
    "tasks synth": [["--repo", "{missing}", "--out", "{tmp}/tasks.jsonl"]],
    "tasks import": [["{missing}.jsonl", "--out", "{tmp}/tasks.jsonl"]],
    "tasks fetch": [["--pack", "{missing}"]],
    "tasks list": [["{missing}.jsonl"]],
    "mcp": [["--workdir", "{missing}"], ["--workdir", "{ws}"],  # no coevolve.json to say which round
            ["--workdir", "{ws}", "--max-calls", "0"]],
    "tasks frontier": [["--workdir", "{missing}"], ["--workdir", "{tmp}", "--domain", "swe"]],
    "export verl": [["--workdir", "{missing}"], ["--workdir", "{ws}", "--rev", "no-such-rev", "-o", "{tmp}/r.py"]],
}

# Imports the CLI once, then per job: fork, take the job's cwd, stdout and stderr, run the module
# as `python -m evotrainer` does, and exit as the interpreter would (a traceback and 1 on an
# uncaught exception).
DRIVER = r"""
import json, os, runpy, sys, traceback
import evotrainer.cli.main
evotrainer.cli.main.quiet_libraries()  # what main() imports, too
codes = []
for job in json.load(sys.stdin):
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.chdir(job["cwd"])
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(os.path.join(job["cwd"], name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = ["evotrainer", *job["args"]]
        try:
            runpy.run_module("evotrainer", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (exc.code is not None)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
json.dump(codes, sys.__stdout__)
"""


def _commands(group: TyperGroup, prefix: tuple[str, ...] = ()) -> list[str]:
    out = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, TyperGroup):
            out += _commands(command, prefix + (name,))
        else:
            out.append(" ".join(prefix + (name,)))
    return out


COMMANDS = _commands(typer.main.get_command(app))


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EVOTRAINER_WORKDIR", "EVOTRAINER_STORE_URL")}
    env.update(EVOTRAINER_HOME=str(home), PYTHONPATH=str(ROOT), COLUMNS="200")
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, int], tuple[dict, int, str, str]]:
    """(job, exit code, stdout, stderr) of every case; a job is the cwd and the arguments."""
    from evotrainer.workspace import ensure_workspace

    base = tmp_path_factory.mktemp("bad-input")
    ws = ensure_workspace(base / "ws", "math").root
    jobs = {}
    for command, cases in CASES.items():
        for i, argv in enumerate(cases):
            tmp = base / f"case-{len(jobs)}"
            tmp.mkdir()
            args = [a.format(missing=tmp / "missing", tmp=tmp, ws=ws) for a in argv]
            jobs[command, i] = {"cwd": str(tmp), "args": [*command.split(), *args]}
    done = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(list(jobs.values())), cwd=base,
                          env=_env(base / "home"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    codes = json.loads(done.stdout)
    return {key: (job, code, *(Path(job["cwd"], name).read_text() for name in ("stdout", "stderr")))
            for (key, job), code in zip(jobs.items(), codes)}


def _check(command: str, argv: list[str], code: int, out: str, err: str) -> None:
    shown = f"`evotrainer {command} {' '.join(argv)}` exit {code}\n{out}{err}"
    assert "Traceback" not in out + err, shown
    assert code == 2, shown
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("Error: ") and line[len("Error: "):].strip()]
    assert len(errors) == 1 and len(lines) <= MAX_ERROR_LINES, shown


@pytest.mark.parametrize("command", COMMANDS)
def test_bad_input_exits_2(command, runs):
    assert command in CASES, f"give `{command}` a bad-input case in CASES"
    for i, argv in enumerate(CASES[command]):
        _check(command, argv, *runs[command, i][1:])


def test_cases_name_real_commands():
    assert not set(CASES) - set(COMMANDS), "CASES names a command the app does not have"


def test_cold_start_answers_the_same(runs, tmp_path):
    """The forked runs stand for real ones: a fresh `python -m evotrainer` answers alike."""
    job, *forked = runs["harness show", 1]  # a bad revision in a real harness repo
    proc = subprocess.run([sys.executable, "-m", "evotrainer", *job["args"]], cwd=job["cwd"],
                          env=_env(tmp_path / "home"), capture_output=True, text=True, timeout=120)
    assert [proc.returncode, proc.stdout, proc.stderr] == forked
