"""Harness code attacks the backtest's protocol: one test per attack, each on the real thing.

The parent alone reads the store; each worker holds one harness version and returns raw values,
which the parent checks and joins with the verified outcomes it kept. Every test here commits a
candidate to a real workspace's git harness repo, backtests it over a real SQLite store in real
sandbox worker processes, and asserts the attack had no effect on the numbers or the gate.
"""

from __future__ import annotations

import pytest
from test_backtest import BASE_REWARD, LENGTH_BONUS, PARTIAL_CREDIT, SEED_REWARD_HEAD, propose

from evotrainer.backtest import Selector, backtest
from evotrainer.config import GateConfig
from evotrainer.store import Store

# Every attack gets at the worker's interpreter the way harness code can: the standard library's
# `collections` keeps `sys` as `collections._sys`, and importlib imports past the guard.
REACH = '''
import collections
_sys = collections._sys
_gc = _sys.modules["importlib"].import_module("gc")
'''


def backtest_of(ws, reward_py: str, slug: str, targets: str = "dead_group_ratio", **kwargs) -> dict:
    branch = propose(ws, slug, reward_py, targets)
    with Store.open(ws.root) as store:
        return backtest(ws.root, branch, store=store, selector=Selector(run="default", round=0), **kwargs)


@pytest.fixture
def ws(tmp_path):
    from test_backtest import gate_groups, workspace

    ws = workspace(tmp_path / "work")
    with Store.open(ws.root) as store:
        run = store.get_or_create_run("default", "math", {})
        round_id = store.start_round(run, 0, "seed", "base")
        store.add_rollouts(gate_groups(run_id=run, round_id=round_id))
    return ws


@pytest.fixture
def honest(ws) -> dict:
    """The numbers of the base and of the length-bonus candidate when nobody attacks."""
    return backtest_of(ws, LENGTH_BONUS, "honest-length")["metrics"]


def test_a_candidate_cannot_replace_the_bases_reward_through_sys_modules_or_gc(ws, honest):
    # A length bonus that, at load and on every call, looks for the base's reward module in
    # sys.modules and for the base's Harness object through gc, and makes the base score 0.
    attack = REACH + '''
_found = {"own": 0, "other": 0}


def _zero(rollout):
    return {"correct": 0.0}


def _sabotage(loaded=True):
    for name, module in list(_sys.modules.items()):
        if name.startswith("_evoharness_") and name.endswith("_reward") and module is not _sys.modules[__name__]:
            module.reward = _zero
            _found["other"] += 1
    for obj in _gc.get_objects():
        if type(obj).__name__ == "Harness" and hasattr(obj, "_reward"):
            if getattr(obj._reward, "__module__", None) == __name__:
                _found["own"] += 1
            else:
                obj._reward = _zero
                _found["other"] += 1
    if loaded and not _found["own"]:
        raise RuntimeError("the gc scan is blind: it did not even find this harness")


_sabotage(loaded=False)  # the base was loaded first, when it shared this process
''' + LENGTH_BONUS.replace("def reward(rollout: Rollout) -> dict[str, float]:\n",
                             "def reward(rollout: Rollout) -> dict[str, float]:\n    _sabotage()\n")
    # Many chunks through one worker: where the base shares it, the base's later chunks would
    # be scored after the candidate's first.
    report = backtest_of(ws, attack, "sabotage-base", workers=1, chunk_size=16)
    assert report["failure"] is None, report["reasons"]  # the attack ran (its scan is not blind)
    assert report["metrics"]["base"] == honest["base"]  # the base scored as if nobody attacked
    assert report["metrics"]["candidate"] == honest["candidate"]
    assert report["decision"] == "reject"


def test_mutating_the_rollouts_and_outcomes_it_is_given_changes_nothing_the_parent_counts(ws, honest):
    # Flip every verified outcome to a success (and the flags, tokens and the metric code in
    # its own process) before scoring, hoping the parent reads them back.
    attack = REACH + '''
def _rewrite(rollout):
    object.__setattr__(rollout.outcome, "success", True)
    object.__setattr__(rollout.outcome, "kind", "ok")
    object.__setattr__(rollout.outcome, "flags", ("answer_marker",))
    object.__setattr__(rollout, "num_tokens", 1)
    for name in ("evotrainer.backtest.metrics", "evotrainer.backtest.scoring", "evotrainer.backtest.rows"):
        module = _sys.modules.get(name)
        if module is not None:
            module.is_flagged = lambda kind, flags: False
            if hasattr(module, "Tally"):
                module.Tally.add_group = lambda self, *a, **k: None
    api = _sys.modules["evotrainer.api"]
    api.Outcome.success = True  # and the class: every Outcome made from now on
    for obj in _gc.get_objects():
        if type(obj).__name__ in ("Fact", "_Fact") and hasattr(obj, "success"):
            object.__setattr__(obj, "success", True)


def _honest(rollout):
''' + LENGTH_BONUS.split("def reward(rollout: Rollout) -> dict[str, float]:\n", 1)[1] + '''

_FIRST = {}


def reward(rollout):
    # the honest candidate's reward on the true outcome, remembered: the worker rescoring the
    # same (now rewritten) rollout must see the same value
    value = _FIRST.setdefault(rollout.id, _honest(rollout))
    _rewrite(rollout)
    return dict(value)
'''
    report = backtest_of(ws, attack, "flip-outcomes")
    assert report["metrics"]["candidate"] == honest["candidate"]
    assert report["metrics"]["base"] == honest["base"]
    assert report["metrics"]["candidate"]["false_drop_rate"] == honest["candidate"]["false_drop_rate"]
    with Store.open(ws.root) as store:  # and the store still holds the true outcomes
        assert sum(sr.rollout.outcome.success for sr in store.iter_rollouts()) == 6 * 3 + 2 * 8


# How a candidate rewrites the reply its worker sends: it wraps our job's run() in its process
# (and, for NaN and inf, the worker's JSON encoder, which would refuse them).
TAMPER = REACH + '''
import math
_job = _sys.modules["evotrainer.harness.calls"].HarnessJob
_run = _job.run
_worker = _sys.modules["evotrainer.harness.sandbox_worker"]
_dumps = _worker.json.dumps


class _Json:
    loads = staticmethod(_worker.json.loads)

    @staticmethod
    def dumps(obj, allow_nan=False, **kw):
        return _dumps(obj, allow_nan=True, **kw)


_worker.json = _Json


def _tampered(self, state, harnesses, message):
    out = _run(self, state, harnesses, message)
    if "ids" in out:
        CHANGE(out)
    return out


_job.run = _tampered
'''
CHANGES = {
    "extra id": 'out["ids"].append("ghost"); out["rewards"].append({"x": 9.0}); out["keep"].append(True); '
                'out["cut"].append(False)',
    "missing id": 'del out["ids"][-1]; del out["rewards"][-1]; del out["keep"][-1]; del out["cut"][-1]',
    "duplicate id": 'out["ids"][-1] = out["ids"][0]',
    "reordered ids": 'out["ids"][0], out["ids"][1] = out["ids"][1], out["ids"][0]',
    "nan": 'out["rewards"][0] = {"correct": float("nan")}',
    "inf": 'out["rewards"][0] = {"correct": float("inf")}',
    "huge": 'out["rewards"] = [{"correct": 1e300 if i % 2 else -1e300} for i in range(len(out["rewards"]))]',
    "string": 'out["rewards"][0] = {"correct": "1.0"}',
    "bool reward": 'out["rewards"][0] = {"correct": True}',
    "int keep flag": 'out["keep"][0] = 1',
    "keep_group list short": 'out["keep_group"].pop()',
    "extra key": 'out["success"] = [True] * len(out["ids"])',
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_worker_reply_that_does_not_match_what_was_sent_fails_the_candidate(ws, change):
    code = TAMPER.replace("CHANGE(out)", CHANGES[change]) + PARTIAL_CREDIT
    report = backtest_of(ws, code, "tamper")
    assert report["decision"] == "reject"
    reasons = " ".join(report["reasons"])
    assert "the candidate failed: the sandbox worker sent malformed results" in reasons, reasons
    assert report["metrics"]["candidate"] is None


def test_a_candidate_deterministic_only_within_one_process_is_caught_before_promotion(ws):
    # Partial credit (promoted when honest) plus noise drawn once per rollout and remembered,
    # so scoring a rollout twice in one worker agrees; a fresh process draws other noise.
    noisy = PARTIAL_CREDIT.replace("from evotrainer.api import Rollout\n",
                                   "import random\n\nfrom evotrainer.api import Rollout\n\n_SEEN = {}\n")
    noisy = noisy.replace('        "partial":', '        "noise": _SEEN.setdefault(rollout.id, random.random() * 1e-3),\n'
                                              '        "partial":')
    report = backtest_of(ws, noisy, "noisy-partial")
    checks = {c["name"]: c["passed"] for c in report["checks"]}
    assert checks.pop("deterministic") is False
    assert all(checks.values()), checks  # every other check passed: it would have been promoted
    assert report["decision"] == "reject"
    assert report["reasons"][0].startswith("nondeterministic: a second, fresh worker gave different raw values")


def test_an_honest_promotion_passes_the_rerun_in_a_fresh_worker(ws):
    report = backtest_of(ws, PARTIAL_CREDIT, "partial-credit")
    assert report["decision"] == "promote", report["reasons"]
    assert {"name": "deterministic", "passed": True,
            "detail": "a second, fresh worker gave the candidate's very same raw values for all 128 rollouts"
            } in report["checks"]


def test_a_candidate_that_counts_its_calls_is_caught_by_the_rerun(ws):
    # Honest for the first 20 wrong answers each process scores, then a little generous to every
    # wrong answer: the in-worker rescoring sees the same (remembered) values, the first run
    # promotes, and the rerun (other chunks, reverse order) scores other rollouts first.
    counting = PARTIAL_CREDIT.replace("from evotrainer.api import Rollout\n",
                                      "from evotrainer.api import Rollout\n\n_SEEN = {}\n")
    counting = counting.replace('        "partial": 0.3 if rollout.outcome.kind == "wrong" else 0.0,',
                                '        "partial": _SEEN.setdefault(rollout.id, 0.3 if len(_SEEN) < 20 else 0.31)\n'
                                '            if rollout.outcome.kind == "wrong" else 0.0,')
    report = backtest_of(ws, counting, "counting", workers=1, chunk_size=16)
    checks = {c["name"]: c["passed"] for c in report["checks"]}
    assert checks.pop("deterministic") is False and all(checks.values()), report["checks"]
    assert report["decision"] == "reject"


def test_a_pure_length_hack_is_not_promoted(ws):
    hack = '''from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {"length": float(len(rollout.completion))}
'''
    report = backtest_of(ws, hack, "length-hack", targets="dead_group_ratio")
    assert report["decision"] == "reject"
    assert any("ordering_violations worsened" in r or "proxy_auc worsened" in r for r in report["reasons"])
    other_target = backtest_of(ws, hack, "length-hack-2", targets="proxy_auc")
    assert other_target["decision"] == "reject"


def _finder(ws) -> str:
    """A reward that looks everywhere harness code can look for the workspace or the store: its
    environment, argv, working directory, descriptors, every string in reach of gc (which holds
    our job and the messages the parent sent), and tries to open what it finds. It raises (and so
    fails the candidate, reason "LEAK") on any find, and "BLIND" if its scan missed the rollout
    it is scoring, i.e. if it could not see the messages at all."""
    secrets = (str(ws.root), str(ws.root.resolve()))  # the store URL holds them too
    return REACH + f'''
_os = _sys.modules["os"]
# Kept reversed: a tuple of the paths themselves is a gc-tracked container until a collection
# untracks it, so the scan below would find its own constant, as timing allows.
_REVERSED = {tuple(s[::-1] for s in secrets)!r}


def _strings(obj, out):
    # every list, tuple and dict is itself in gc.get_objects(): one level down reaches all strings
    items = obj.items() if type(obj) is dict else obj
    for item in items:
        for x in (item if type(obj) is dict else (item,)):
            if type(x) is str:
                out.append(x)
            elif type(x) is bytes:
                out.append(x.decode("utf-8", "replace"))


def _look(rollout):
    wanted = tuple(s[::-1] for s in _REVERSED)
    seen = []
    seen += list(_os.environ.values()) + list(_sys.argv) + list(getattr(_sys, "orig_argv", ()))
    seen.append(_os.getcwd())
    for path in ("/proc/self/cmdline", "/proc/self/environ"):
        with open(path, "rb") as f:
            seen.append(f.read().replace(b"\\0", b" ").decode("utf-8", "replace"))
    for fd in _os.listdir("/proc/self/fd"):
        try:
            seen.append(_os.readlink("/proc/self/fd/" + fd))
        except OSError:
            pass
    for obj in _gc.get_objects():
        if obj is seen or obj is wanted:
            continue
        kind = type(obj)  # never isinstance or getattr: a lazy object would run code
        if kind in (list, tuple, dict, set, frozenset):
            _strings(obj, seen)
        elif str(kind.__module__).startswith(("evotrainer", "multiprocessing")):
            try:
                _strings(object.__getattribute__(obj, "__dict__"), seen)  # our job, the worker's state
            except AttributeError:
                pass
    text = "\\n".join(seen)
    if rollout.id not in text:
        raise RuntimeError("BLIND")
    hits = [text[max(0, at - 40):at].replace("\\n", "/") for at in range(len(text)) if text.startswith(wanted, at)]
    if hits:
        raise RuntimeError("LEAK " + " | ".join(hits[:6]))
    for guess in ("store.db", "../store.db", "work/store.db"):  # relative to where it is
        try:
            open(guess, "rb").close()
            raise RuntimeError("LEAK opened " + guess)
        except OSError:
            pass


_DONE = []


def reward(rollout):
    if not _DONE:  # once per process: the scan takes a while
        _look(rollout)
        _DONE.append(1)
    return {{"correct": 1.0 if rollout.outcome.success else 0.0}}
'''


def test_a_worker_finds_no_store_url_or_workspace_path_in_its_job_messages_or_arguments(ws, monkeypatch):
    # As when `evotrainer backtest -w WORKSPACE` runs from inside the workspace: multiprocessing
    # would hand each worker this argv and this directory (ReplayJob.open makes it forget them).
    monkeypatch.chdir(ws.root)
    monkeypatch.setattr("sys.argv", ["evotrainer", "backtest", "candidate/x", "-w", str(ws.root)])
    report = backtest_of(ws, _finder(ws), "finder", gate=GateConfig(call_timeout_s=120.0))
    reasons = " ".join(report["reasons"])
    assert "LEAK" not in reasons and "BLIND" not in reasons, reasons
    assert report["metrics"]["candidate"] is not None, reasons


def test_a_worker_finds_no_workspace_path_in_its_environment_or_its_fork_servers_command_line(ws, monkeypatch):
    # Closed by the OS sandbox (harness/sandbox_launch.py): no fork server, a scrubbed
    # environment, a root with no workspace in it. On main before it, this found the path.
    # `cd WORKSPACE && python -m evotrainer backtest ...`: the shell's PWD, and sys.path[0] is
    # the workspace, which the fork server's command line (the worker's /proc/self/cmdline) holds.
    import multiprocessing.forkserver

    multiprocessing.forkserver._forkserver._stop()  # a fork server started from here
    monkeypatch.chdir(ws.root)
    monkeypatch.setenv("PWD", str(ws.root))
    monkeypatch.syspath_prepend(str(ws.root))
    report = backtest_of(ws, _finder(ws), "finder-env", gate=GateConfig(call_timeout_s=120.0))
    reasons = " ".join(report["reasons"])
    assert "LEAK" not in reasons and "BLIND" not in reasons, reasons


def test_a_worker_cannot_reach_the_parents_store_through_proc(ws, monkeypatch):
    # Closed by the OS sandbox's pid namespace: the worker's ancestors are not in its /proc.
    monkeypatch.chdir(ws.root)
    probe = REACH + '''
_os = _sys.modules["os"]


def reward(rollout):
    pid = _os.getppid()
    for _ in range(4):  # up the ancestors: a launcher or fork server, then the backtest itself
        try:
            fds = _os.listdir(f"/proc/{pid}/fd")
        except OSError:
            break  # not in this /proc
        for fd in fds:
            try:
                link = _os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.endswith("store.db"):
                raise RuntimeError("LEAK " + link)
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return {"correct": 1.0 if rollout.outcome.success else 0.0}
'''
    report = backtest_of(ws, probe, "proc-probe")
    assert "LEAK" not in " ".join(report["reasons"]), report["reasons"]
    assert report["failure"] is None, report["reasons"]


def test_base_and_candidate_never_share_a_worker_process(ws):
    # The candidate raises if any other loaded harness is in reach of gc in its process.
    probe = REACH + BASE_REWARD.split("from evotrainer.api import Rollout\n", 1)[1].replace(
        "def reward(rollout: Rollout) -> dict[str, float]:\n",
        "def reward(rollout):\n"
        "    others = [o for o in _gc.get_objects() if type(o).__name__ == 'Harness'"
        " and getattr(getattr(o, '_reward', None), '__module__', __name__) != __name__]\n"
        "    if others:\n        raise RuntimeError('SHARED with %d other harness(es)' % len(others))\n")
    report = backtest_of(ws, probe, "alone", workers=2)
    assert "SHARED" not in " ".join(report["reasons"]), report["reasons"]
    assert report["metrics"]["candidate"] == report["metrics"]["base"]


def test_seed_reward_head_is_what_the_attacks_build_on():
    # The attacks splice their code around these lines; if the shared fixtures change, say so here.
    assert "from evotrainer.api import Rollout\n" in SEED_REWARD_HEAD
    assert "def reward(rollout: Rollout) -> dict[str, float]:\n" in LENGTH_BONUS
