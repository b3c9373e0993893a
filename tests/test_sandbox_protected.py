"""A policy's sandboxed code cannot see the workspace or the store of the run that grades it.

The store holds every task's answer and hidden tests, and the harness repo decides the reward:
code a policy wrote (run by the code checker, the SWE grader, the agent's tools) must neither
read nor change them. Each attack runs in the real sandbox against a real workspace and store,
in a folder outside /tmp (the sandbox's own tmpfs would hide /tmp anyway). The control beside
each one shows that a plain file in the same folder is readable, so only the protection stops it.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from evotrainer.domains.code import task_from_key
from evotrainer.domains.code_check import run_hidden_tests
from evotrainer.sandbox import LocalExecutor, isolation_support, run_sandboxed
from evotrainer.sandbox.protected import protected
from evotrainer.store import Store
from evotrainer.workspace import ensure_workspace

SECRET = "answer-only-the-store-knows-7f3a"
KEY = 'L1:keep_if:{"op": ">", "t": 3}'
HONEST = "def keep_if(nums):\n    return [x for x in nums if x > 3]\n"

pytestmark = pytest.mark.skipif(not isolation_support()["mountns"], reason="needs a mount namespace")


@pytest.fixture(scope="module")
def site():
    """A workspace and its store beside a plain file, in a world-readable folder outside /tmp."""
    root = Path(__file__).resolve().parents[1] / "test-artifacts"
    if str(root).startswith(("/tmp/", "/var/tmp/", "/dev/shm/")):
        pytest.skip("the checkout is under a folder the sandbox's own tmpfs hides: nothing to protect")
    root.mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="protected-", dir=root))
    folder.chmod(0o755)
    try:
        work = folder / "work"
        ws = ensure_workspace(work, "code")
        Store.open(work).close()
        with sqlite3.connect(ws.store_path) as db:  # a row only the store holds
            db.execute("CREATE TABLE secret (v TEXT)")
            db.execute("INSERT INTO secret VALUES (?)", (SECRET,))
        with sqlite3.connect(ws.store_path) as db:  # into the main file, out of the WAL
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for p in (work, ws.harnesses):
            p.chmod(0o755)
        ws.store_path.chmod(0o644)
        (ws.harnesses / "reward.py").chmod(0o666)  # writable by anyone, as a careless checkout may be
        plain = folder / "plain.txt"
        plain.write_text(SECRET)
        plain.chmod(0o644)
        yield {"work": work, "store": ws.store_path, "reward": ws.harnesses / "reward.py", "plain": plain}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_control_a_plain_file_beside_the_workspace_is_readable(site):
    assert SECRET in run_sandboxed(["cat", str(site["plain"])], timeout_s=10).stdout


def test_opening_a_store_and_a_workspace_protects_both(site):
    assert {str(site["work"].resolve()), str(site["store"].resolve())} <= set(protected())


def test_reading_the_store_file(site):
    r = run_sandboxed(["sh", "-c", f"cat {site['store']}; grep -a -o '{SECRET}' {site['store']}"], timeout_s=10)
    assert SECRET not in r.stdout


def test_listing_the_workspace_and_reading_the_harness(site):
    r = run_sandboxed(["sh", "-c", f"ls -a {site['work']} {site['work']}/harnesses; cat {site['reward']}"],
                      timeout_s=10)
    assert "store.db" not in r.stdout and "def reward" not in r.stdout


def test_rewriting_the_reward_from_inside(site):
    before = site["reward"].read_bytes()
    run_sandboxed(["sh", "-c", f"echo 'def reward(r): return {{\"correct\": 1.0}}' > {site['reward']}"],
                  timeout_s=10)
    assert site["reward"].read_bytes() == before


def test_a_solution_that_reads_the_store_before_it_answers(site):
    """Honest code behind a read of the store: it passes only if the store is visible."""
    task = task_from_key(KEY, 0.2)
    meta = task.meta
    steal = (f"_db = open({str(site['store'])!r}, 'rb').read()\n"
             f"assert {SECRET.encode()!r} in _db\n" + HONEST)
    outcome = run_hidden_tests(steal, list(meta["tests"]), entry=meta["entry_point"], setup=meta.get("setup", ""),
                               prefix=meta.get("prefix", ""), reference=task.answer, timeout_s=10)
    assert not outcome.success
    honest = run_hidden_tests(HONEST, list(meta["tests"]), entry=meta["entry_point"], setup=meta.get("setup", ""),
                              prefix=meta.get("prefix", ""), reference=task.answer, timeout_s=10)
    assert honest.success  # the control: the same code without the read passes


def _cat(path: str) -> str:
    return run_sandboxed(["cat", path], timeout_s=10).stdout


def test_a_spawned_pool_worker_keeps_the_protection(site):
    """Checks spread over a process pool (sandbox/executor.py) run in spawned workers."""
    with LocalExecutor(workers=2) as pool:
        out = list(pool.map(_cat, [str(site["store"]), str(site["plain"])]))
    assert SECRET not in out[0] and SECRET in out[1]
