"""Untrusted harness code: each test attacks one property of the sandbox.

Every bad candidate must come back as a rejected backtest whose reason names the fault, and the
process running the backtest must carry on (the next backtest in the same test still works).
Real worker processes, real SQLite stores, real git harness repos.
"""

from __future__ import annotations

import multiprocessing

import pytest
from factories import make_rollout, make_stored

from evotrainer.backtest import Selector, backtest, run_backtest
from evotrainer.backtest.engine import HarnessVersion
from evotrainer.config import GateConfig
from evotrainer.harness.repo import HarnessRepo
from evotrainer.harness.sandbox import ALLOWED_MODULES
from evotrainer.store import Store, StoredRollout
from evotrainer.workspace import ensure_workspace

GATE = GateConfig(call_timeout_s=1.0, load_timeout_s=10.0)


def rows() -> list[StoredRollout]:
    out = []
    for g in range(4):
        for k in range(4):
            kind = "ok" if k < g else "wrong"
            out.append(make_stored(make_rollout(
                f"g{g}-{k}", task_id=f"t{g}", group_id=f"g{g}", completion="Answer: 4" if kind == "ok" else f"Answer: {k}",
                success=kind == "ok", kind=kind, flags=("answer_marker",), num_tokens=5 + k,
                meta={"level": g, "tags": ["synthetic"]})))
    return out


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    ws = ensure_workspace(tmp_path_factory.mktemp("sandbox") / "work", "math")
    with Store.open(ws.root) as store:
        store.add_rollouts(rows())
    return ws


@pytest.fixture(scope="module")
def seed(ws) -> dict[str, str]:
    return HarnessRepo(ws.harnesses).sources()


def score(ws, seed, gate: GateConfig = GATE, chunk_size: int = 4096, **files: str):
    """Backtest the seed against the seed with `files` replaced (reward= means reward.py)."""
    cand = {**seed, **{f"{name}.py": text for name, text in files.items()}}
    with Store.open(ws.root) as store:
        return run_backtest(store, HarnessVersion("seed", seed), HarnessVersion("cand", cand),
                            Selector(), gate, workers=1, chunk_size=chunk_size)


def rejected(ws, seed, match: str, gate: GateConfig = GATE, chunk_size: int = 4096, **files: str) -> str:
    out = score(ws, seed, gate, chunk_size, **files)
    assert out.failure is not None, "the candidate was not rejected"
    assert out.failure.harness == "candidate"
    assert match in out.failure.reason, out.failure.reason
    assert not multiprocessing.active_children()  # no worker left behind
    return out.failure.reason


def reward(body: str, head: str = "") -> str:
    return f"{head}\ndef reward(rollout):\n" + "".join(f"    {line}\n" for line in body.splitlines())


# ---------------------------------------------------------------- through the harness repo


def test_crash_hang_and_forbidden_import_are_rejected_and_the_run_carries_on(ws):
    repo = HarnessRepo(ws.harnesses)
    bad = {
        "crash": (reward("return {'x': 1 / 0}"), "ZeroDivisionError"),
        "hang": (reward("while True:\n    pass"), "did not return within 1 s"),
        "import-os": ("import os\n" + reward("return {'x': 1.0}"), "import of 'os'"),
        "dunder-import": (reward("__import__('subprocess')\nreturn {'x': 1.0}"), "import of 'subprocess'"),
    }
    with Store.open(ws.root) as store:
        for slug, (text, reason) in bad.items():
            branch = repo.propose(2, slug, {"reward.py": text}, diagnosis="d", targets="proxy_auc",
                                  expected="e").branch
            report = backtest(ws.root, branch, store=store, gate=GATE)
            assert report["decision"] == "reject"
            assert report["failure"]["harness"] == "candidate"
            assert reason in report["reasons"][0], report["reasons"]
            assert report["n_rollouts"] == 16 and report["rollout_ids_sha256"]
        ok = repo.propose(2, "fine", {"reward.py": reward("return {'correct': float(rollout.outcome.success)}")},
                          diagnosis="d", targets="proxy_auc", expected="e").branch
        report = backtest(ws.root, ok, store=store, gate=GATE)
    assert report["failure"] is None and report["metrics"]["candidate"]["n_rollouts"] == 16
    with Store.open(ws.root) as store:
        assert len({b["id"] for b in store.backtests()}) == 5


# ---------------------------------------------------------------- one property each


def test_hang_in_c_code_is_killed(ws, seed):
    # catastrophic regex backtracking never returns to the interpreter: only a kill stops it
    rejected(ws, seed, "did not return within", reward=reward(
        "re.match(r'(a+)+$', 'a' * 64 + 'b')\nreturn {}", head="import re"))


def test_hang_while_loading_is_killed(ws, seed):
    rejected(ws, seed, "loading the harness files did not return within 1 s",
             GateConfig(load_timeout_s=1.0), filters="while True:\n    pass\n")


def test_exception_in_every_hook_names_the_hook(ws, seed):
    rejected(ws, seed, "filters.py: keep_rollout() raised KeyError",
             filters="def keep_rollout(r):\n    return {}['x']\ndef keep_group(rs, w):\n    return True\n")
    rejected(ws, seed, "rollout.py: stop() raised", rollout="PROMPT = '{{ question }}'\ndef stop(t):\n    return t[5]\n")
    rejected(ws, seed, "reward.py: reward() raised SystemExit", reward=reward("raise SystemExit(3)"))


def test_reason_names_the_rollout(ws, seed):
    rejected(ws, seed, "(on rollout g2-1)", reward=reward(
        "if rollout.id == 'g2-1':\n    raise ValueError('boom')\nreturn {}"))


@pytest.mark.parametrize("module", ["os", "sys", "subprocess", "socket", "importlib", "ctypes",
                                    "threading", "evotrainer.store", "evotrainer"])
def test_forbidden_runtime_imports(ws, seed, module):
    rejected(ws, seed, f"import of '{module}'", reward=reward(f"__import__({module!r})\nreturn {{}}"))


def test_swallowed_import_error_still_rejects(ws, seed):
    rejected(ws, seed, "import of 'socket'", reward=reward(
        "try:\n    import socket\nexcept ImportError:\n    pass\nreturn {'x': 1.0}"))


def test_import_through_exec_is_caught(ws, seed):
    rejected(ws, seed, "import of 'os'", reward=reward("exec('import os', {})\nreturn {}"))


def test_os_reached_through_an_allowed_module_still_cannot_run_commands(ws, seed, tmp_path):
    marker = tmp_path / "pwned"
    rejected(ws, seed, "os.system", reward=reward(
        f"random._os.system('touch {marker}')\nreturn {{}}", head="import random"))
    assert not marker.exists()
    rejected(ws, seed, "subprocess.Popen", reward=reward(
        "random._os.popen('id').read()\nreturn {}", head="import random"))
    rejected(ws, seed, "os.kill", reward=reward("random._os.kill(1, 0)\nreturn {}", head="import random"))


def test_writes_outside_the_temp_dir_are_refused(ws, seed, tmp_path):
    target = tmp_path / "written.txt"
    rejected(ws, seed, "for writing", reward=reward(f"open({str(target)!r}, 'w').write('x')\nreturn {{}}"))
    assert not target.exists()
    rejected(ws, seed, "os.remove", reward=reward(f"random._os.remove({str(target)!r})\nreturn {{}}",
                                                  head="import random"))


def test_writes_inside_the_temp_dir_are_fine(ws, seed):
    out = score(ws, seed, reward=reward(
        "with open('scratch.txt', 'w') as f:\n    f.write(rollout.id)\n"
        "return {'correct': float(rollout.outcome.success)}"))
    assert out.failure is None


def test_worker_that_exits_is_a_failure_not_a_crash(ws, seed):
    rejected(ws, seed, "died (exit code 7) during reward.py: reward()", reward=reward(
        "random._os._exit(7)", head="import random"))


@pytest.mark.parametrize("value, match", [
    ("float('nan')", "expected a finite float"),
    ("float('inf')", "expected a finite float"),
    ("True", "expected a finite float"),
])
def test_non_finite_or_non_numeric_reward(ws, seed, value, match):
    rejected(ws, seed, match, reward=reward(f"return {{'x': {value}}}"))


def test_weighted_sum_overflow_is_non_finite(ws, seed):
    rejected(ws, seed, "training reward", reward=reward("return {'a': 1e308, 'b': 1e308}"))


@pytest.mark.parametrize("files, match", [
    ({"reward": reward("return [1.0]")}, "returned list, expected dict[str, float]"),
    ({"reward": reward("return {1: 1.0}")}, "expected str"),
    ({"filters": "def keep_rollout(r):\n    return 'yes'\ndef keep_group(rs, w):\n    return True\n"},
     "keep_rollout() returned str, expected bool"),
    ({"filters": "def keep_rollout(r):\n    return True\ndef keep_group(rs, w):\n    return 1\n"},
     "keep_group() returned int, expected bool"),
    ({"rollout": "PROMPT = '{{ question }}'\ndef stop(t):\n    return 0\n"}, "stop() returned 0"),
])
def test_wrong_return_types(ws, seed, files, match):
    rejected(ws, seed, match, **files)


def test_random_reward_is_not_deterministic(ws, seed):
    rejected(ws, seed, "not deterministic: reward()", reward=reward(
        "return {'x': random.random()}", head="import random"))


def test_stateful_filter_is_not_deterministic(ws, seed):
    rejected(ws, seed, "not deterministic: keep_group()", filters=(
        "import itertools\nCALLS = itertools.count()\n"
        "def keep_rollout(r):\n    return True\n"
        "def keep_group(rs, w):\n    return next(CALLS) % 2 == 0\n"))


def test_one_harness_cannot_edit_what_the_other_sees(ws, seed):
    # the base appends to the nested meta of successes; the candidate counts what it finds there
    scribble = reward("if rollout.outcome.success:\n    rollout.meta['tags'].append('x')\nreturn {}")
    count = reward("return {'tags': float(len(rollout.meta['tags']))}")
    with Store.open(ws.root) as store:
        out = run_backtest(store, HarnessVersion("b", {**seed, "reward.py": scribble}),
                           HarnessVersion("c", {**seed, "reward.py": count}), Selector(), GATE)
    assert out.failure is None
    assert out.metrics["candidate"]["proxy_auc"] == 0.5  # every rollout still has one tag


def test_base_failure_is_reported_as_such(ws, seed):
    with Store.open(ws.root) as store:
        out = run_backtest(store, HarnessVersion("b", {**seed, "reward.py": reward("return 1")}),
                           HarnessVersion("c", seed), Selector(), GATE)
    assert out.failure.harness == "base"


def test_allowed_modules_work(ws, seed):
    assert {"math", "re", "json", "collections", "statistics"} <= ALLOWED_MODULES
    out = score(ws, seed, reward=reward(
        "c = Counter(rollout.completion)\n"
        "return {'correct': float(rollout.outcome.success), 'n': float(np.float64(len(c)) / 100),\n"
        "        'j': len(json.dumps(dict(rollout.meta))) / 1000 + math.sqrt(0) + statistics.mean([0, 0])}",
        head="from collections import Counter\nimport json, math, statistics\nimport numpy as np\n"
             "from evotrainer.api import Rollout"))
    assert out.failure is None, out.failure


def test_runaway_memory_is_a_memory_error(ws, seed):
    rejected(ws, seed, "MemoryError", reward=reward("x = bytearray(16 * 2**30)\nreturn {}"))


def test_unprintable_exception_is_still_a_reason(ws, seed):
    rejected(ws, seed, "reward.py: reward() raised", reward=reward(
        "raise Bad()", head="class Bad(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\n"))


def test_descriptor_tricks_are_refused(ws, seed, tmp_path, monkeypatch):
    # The in-process guard (lint) on its own: in the OS sandbox the file below does not even
    # exist for the worker (tests/test_harness_escape.py), so the guard's message would not show.
    monkeypatch.setenv("EVOTRAINER_HARNESS_ISOLATION", "none")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    # a descriptor opened for reading outside the temp dir cannot be used to change the file
    rejected(ws, seed, "os.chmod", reward=reward(
        f"fd = random._os.open({str(outside)!r}, random._os.O_RDONLY)\nrandom._os.chmod(fd, 0o777)\nreturn {{}}",
        head="import random"))
    # nor a directory descriptor to delete a file beside it
    rejected(ws, seed, "os.remove with dir_fd", reward=reward(
        f"fd = random._os.open({str(tmp_path)!r}, random._os.O_RDONLY)\n"
        "random._os.remove('outside.txt', dir_fd=fd)\nreturn {}", head="import random"))
    assert outside.read_text() == "keep"
    # and the pipe back to the parent is not a file to write to
    rejected(ws, seed, "for writing", reward=reward(
        "for fd in range(3, 20):\n    try:\n        open(fd, 'wb', closefd=False).write(b'garbage')\n"
        "    except OSError:\n        pass\nreturn {}"))


@pytest.mark.parametrize("payload", [b"garbage", b"\x00\x00\x00\x10cos\nsystem\n(S'id'\ntR."])
def test_writing_into_every_descriptor_fails_the_candidate_not_the_parent(ws, seed, payload):
    # os.write needs no open(): garbage (or a pickle that would run code in the parent if it
    # unpickled it) goes straight into the result pipe. The parent reads JSON frames only,
    # without blocking, and the worker holds no descriptor of the store. The worker's socket keeps
    # the number it has in the parent, which a long test run pushes past 64: try them all.
    rejected(ws, seed, "wrote into the sandbox worker's", reward=reward(  # result pipe or sentinel
        f"for fd in range(3, 1 << 14):\n    try:\n        random._os.write(fd, {payload!r})\n"
        "    except OSError:\n        pass\nreturn {}", head="import random"))
    with Store.open(ws.root) as store:
        assert store.count_rollouts() == 16
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"


def test_no_store_descriptor_is_open_while_harness_code_runs(ws, seed):
    out = score(ws, seed, reward=reward(
        "fds = random._os.listdir('/proc/self/fd')\n"
        "links = [random._os.readlink('/proc/self/fd/' + fd) for fd in fds if fd.isdigit() and "
        "random._os.path.exists('/proc/self/fd/' + fd)]\n"
        "if any('store.db' in link for link in links):\n    raise RuntimeError(links)\n"
        "return {'correct': float(rollout.outcome.success)}", head="import random"))
    assert out.failure is None, out.failure


def test_reading_the_parents_requests_is_a_failure_not_a_hang(ws, seed):
    # One group per chunk, two chunks in flight: the harness swallows (part of) the next
    # request. Either the worker waits for a request that never comes (a stall the parent
    # notices) or it reads a broken stream and exits; both reject, neither hangs.
    out = score(ws, seed, GATE, 4, reward=reward(
        "for fd in range(3, 1 << 14):\n    try:\n        random._os.set_blocking(fd, False)\n"
        "        random._os.read(fd, 1 << 20)\n        random._os.set_blocking(fd, True)\n"
        "    except OSError:\n        pass\nreturn {}", head="import random"))
    assert out.failure is not None and out.failure.harness == "candidate"
    # ...or it answers a later request in place of the swallowed one: the ids do not match.
    assert any(why in out.failure.reason for why in ("lost the parent's request", "died",
                                                       "sent malformed results (ids it was not sent"))
