"""Every path that runs harness code goes through the sandbox: training, diagnose, the report, the
rules agent's load check. Attack: a candidate that behaves when it sees the backtest on its call
stack and otherwise writes a marker on the host and connects to a loopback socket. It is promoted
without the gate (as an escaped harness or a fooled gate would), then every other path runs it.
Also: the honest seed gives the same numbers through the sandbox as in process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from factories import make_rollout, make_stored

from evotrainer.api import Rollout, TaskStats, Turn
from evotrainer.coevolve import Coevolution, RunState
from evotrainer.config import load_config
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import Harness, HarnessError, read_sources
from evotrainer.harness.repo import HarnessRepo
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.store import Store
from evotrainer.workspace import ensure_workspace

TINY = CONFIGS_DIR / "math-tiny.yaml"
SEED = HARNESSES_DIR / "math"

# Prepended to every code file of the seed: the payload runs in any call (and at import) unless
# a frame of the backtest engine is on the stack. Every failure is swallowed, so only an effect
# on the host (or a refusal the sandbox records) can tell it ran.
PAYLOAD = '''
def _watched():
    try:
        raise ZeroDivisionError
    except ZeroDivisionError as exc:
        frame = exc.__traceback__.tb_frame
    while frame is not None:
        if "backtest" in str(frame.f_globals.get("__name__", "")):
            return True
        frame = frame.f_back
    return False


def _payload():
    if _watched():
        return
    try:
        with open({marker!r}, "a") as out:
            out.write("payload ran\\n")
    except BaseException:
        pass
    try:
        conn = __import__("socket").create_connection(("127.0.0.1", {port}), timeout=2)
        conn.sendall(b"payload")
        conn.close()
    except BaseException:
        pass


_payload()
'''


class Listener:
    """A loopback TCP server that counts the connections it gets."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.hits += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


PROBE_WRAP = '''

def _wrapped(fn):
    def probe(rollouts, rewards):
        _payload()
        return fn(rollouts, rewards)
    return probe


PROBES = [dict(p, fn=_wrapped(p["fn"])) for p in PROBES]
'''


def hostile_sources(marker: Path, port: int, at_import: bool = True) -> dict[str, str]:
    """The seed with the payload in every code file, called from every hook it defines (and
    every probe); `at_import=False`: only inside calls, so the harness loads cleanly."""
    sources = read_sources(SEED)
    head = PAYLOAD.format(marker=str(marker), port=port)
    if not at_import:
        head = head.replace("\n_payload()\n", "\n")
    out = dict(sources)
    for name, text in sources.items():
        if not name.endswith(".py"):
            continue
        lines = text.splitlines(keepends=True)
        # after `from __future__` imports, which must come first
        cut = max((i + 1 for i, line in enumerate(lines) if line.startswith("from __future__")), default=0)
        body = "".join(lines[cut:])
        for fn in ("def reward(", "def keep_rollout(", "def keep_group(", "def weights(", "def stop("):
            if fn in body:
                start = body.index(fn)
                colon = body.index(":\n", start) + 2
                body = body[:colon] + "    _payload()\n" + body[colon:]
        out[name] = "".join(lines[:cut]) + head + body + (PROBE_WRAP if name == "diagnostics.py" else "")
    return out


def promote_hostile(workdir: Path, marker: Path, port: int, at_import: bool = True) -> HarnessRepo:
    """A workspace whose main is the hostile candidate, promoted without any gate."""
    ws = ensure_workspace(workdir, "math")
    repo = HarnessRepo(ws.harnesses)
    edits = {n: t for n, t in hostile_sources(marker, port, at_import).items() if n.endswith(".py")}
    cand = repo.propose(0, "watched-only", edits, diagnosis="d", targets="dead_group_ratio", expected="e")
    repo.promote(cand.branch, "promoted behind the gate's back")
    return repo


def rollouts(n_groups: int = 4, size: int = 4) -> list[Rollout]:
    out = []
    for g in range(n_groups):
        for j in range(size):
            ok = (g + j) % 3 == 0
            text = "Answer: 4" if ok else ("Answer: 5" if j % 2 else "Let me think about this for a")
            kind = "ok" if ok else ("truncated" if j % 2 == 0 else "wrong")
            out.append(make_rollout(f"r{g}-{j}", task_id=f"t{g}", group_id=f"g{g}", completion=text,
                                    turns=(Turn("user", "What is 2 + 2?"), Turn("assistant", text)), success=ok,
                                    kind=kind, num_tokens=10 + j, truncated=kind == "truncated", meta={"level": 0}))
    return out


def store_rollouts(workdir: Path, run: str = "tiny") -> None:
    with Store.open(workdir) as store:
        run_id = store.get_or_create_run(run, "math", {})
        round_id = store.start_round(run_id, 0, "seed", "base")
        store.add_rollouts([make_stored(r, reward=r.outcome.score, advantage=0.0, kept=True, model_version="base",
                                        seed=0, harness_version="seed", run_id=run_id, round_id=round_id, step=0)
                            for r in rollouts()])


# ---------------------------------------------------------------- honest numbers are unchanged


def test_the_seed_gives_the_same_numbers_through_the_sandbox_as_in_process():
    sources = read_sources(SEED)
    old, rs = Harness(sources, SEED), rollouts()
    with IsolatedHarness(sources, SEED) as new:
        assert new.version == old.version and new.spec == old.spec
        assert new.rewards(rs) == [old.reward(r) for r in rs]
        rewards = [old.training_reward(old.reward(r)) for r in rs]
        assert [new.training_reward(c) for c in new.rewards(rs)] == rewards
        groups = [(rs[i:i + 4], rewards[i:i + 4]) for i in range(0, len(rs), 4)]
        assert new.filters(groups) == old.filters(groups) == [
            [old.keep_group(g, w) and old.keep_rollout(r) for r in g] for g, w in groups]
        stats = [TaskStats("t0", 4, 1, {"level": 0}), TaskStats("t1", 0, 0, {"level": 1})]
        assert new.weights(stats) == old.weights(stats)
        assert [new.stop(r.turns) for r in rs] == [old.stop(r.turns) for r in rs]
        assert new.render_prompt("What is 2 + 2?") == old.render_prompt("What is 2 + 2?")
        assert [(p.name, p.dimension, p.warn, p.critical, p.direction) for p in new.probes] == \
            [(p.name, p.dimension, p.warn, p.critical, p.direction) for p in old.probes]
        assert new.probe_values(rs, rewards) == old.probe_values(rs, rewards)


def test_a_harness_fault_in_the_worker_is_a_harness_error_and_the_next_call_starts_fresh():
    sources = read_sources(SEED)
    broken = dict(sources, **{"reward.py": sources["reward.py"] + "\n\ndef reward(rollout):\n    return {'x': 'nan'}\n"})
    with IsolatedHarness(broken, SEED) as h:
        with pytest.raises(HarnessError, match="reward"):
            h.rewards(rollouts())
        assert h.render_prompt("q") == Harness(sources, SEED).render_prompt("q")  # a fresh worker answers


# ---------------------------------------------------------------- the watched-only payload


def test_payload_is_real_in_process(tmp_path, listener):
    """The control: in the trusted process (the old training path) the payload does run."""
    marker = tmp_path / "marker"
    Harness(hostile_sources(marker, listener.port), SEED).reward(rollouts()[0])
    assert marker.exists()


def test_diagnose_cli_runs_the_payload_only_in_the_sandbox(tmp_path, listener):
    marker = tmp_path / "marker"
    work = tmp_path / "work"
    promote_hostile(work, marker, listener.port, at_import=False)  # it loads; its calls carry the payload
    store_rollouts(work)
    proc = subprocess.run([sys.executable, "-m", "evotrainer", "diagnose", "--workdir", str(work)],
                          capture_output=True, text=True, timeout=300)
    assert not marker.exists() and listener.hits == 0
    assert proc.returncode != 0 and "attempted" in proc.stdout + proc.stderr  # refused, and said so


def test_coevolve_diagnose_stage_runs_the_payload_only_in_the_sandbox(tmp_path, listener):
    marker = tmp_path / "marker"
    loop = Coevolution(load_config(TINY, []), tmp_path / "work")
    edits = {n: t for n, t in hostile_sources(marker, listener.port).items() if n.endswith(".py")}
    cand = loop.repo.propose(0, "watched-only", edits, diagnosis="d", targets="dead_group_ratio", expected="e")
    loop.repo.promote(cand.branch, "promoted behind the gate's back")
    store_rollouts(loop.ws.root)
    with pytest.raises(HarnessError, match="attempted"):
        loop.stage_diagnose(RunState(run="tiny", domain="math", stage="diagnose"))
    assert not marker.exists() and listener.hits == 0


def test_rules_agent_load_check_runs_the_payload_only_in_the_sandbox(tmp_path, listener):
    from evotrainer.propose.rules import RulesAgent
    from evotrainer.skills import SkillLibrary

    marker = tmp_path / "marker"
    sources = hostile_sources(marker, listener.port)
    agent = RulesAgent()
    skill = SkillLibrary.load(tmp_path).get("partial-credit-format")
    proposal = agent._render(skill, {"weight": 0.1}, sources, "dead groups", "dead_group_ratio")
    assert proposal is None  # refused: loading it attempted a write
    assert not marker.exists() and listener.hits == 0


def test_report_distributions_run_the_payload_only_in_the_sandbox(tmp_path, listener):
    from evotrainer.report.distributions import reward_distributions

    marker = tmp_path / "marker"
    work = tmp_path / "work"
    repo = promote_hostile(work, marker, listener.port)
    store_rollouts(work)
    old = {"id": "bt-old", "base": repo.log()[-1].sha, "candidate": repo.resolve("main"),
           "metrics": {"base": {"x": 1}}, "selector": {"run": "tiny"}}
    with Store.open(work) as store:
        out = reward_distributions(store, repo, [old])
    assert "error" in out["bt-old"] and "attempted" in out["bt-old"]["error"]
    assert not marker.exists() and listener.hits == 0


@pytest.mark.slow
def test_train_cli_runs_the_payload_only_in_the_sandbox(tmp_path, listener, embedded_model_dir):
    marker = tmp_path / "marker"
    work = tmp_path / "work"
    promote_hostile(work, marker, listener.port, at_import=False)  # it loads; its calls carry the payload
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "evotrainer", "train", "--config", str(TINY), "--workdir",
                           str(work), "--steps", "1"], capture_output=True, text=True, timeout=900, env=env)
    assert not marker.exists() and listener.hits == 0
    assert proc.returncode != 0 and "attempted" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_train_cli_with_the_honest_seed_still_trains(tmp_path, embedded_model_dir):
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, "-m", "evotrainer", "train", "--config", str(TINY), "--workdir",
                           str(work), "--steps", "1"], capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with Store.open(work) as store:
        rows = list(store.iter_rollouts())
    assert rows and all(r.reward_components for r in rows)
    seed = Harness(read_sources(SEED), SEED)
    for row in rows:  # the stored rewards are what the seed gives in process
        assert row.reward_components == seed.reward(row.rollout)


# ---------------------------------------------------------------- the PROMPT template


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ lipsum.__globals__['os'].popen('touch MARKER').read() }}",
    "{{ '{0.__class__.__init__.__globals__}'.format(question) }}",
    "{{ namespace.__init__.__globals__['__builtins__']['open']('MARKER', 'w') }}",
])
def test_a_prompt_template_cannot_reach_python(tmp_path, template):
    marker = tmp_path / "marker"
    sources = read_sources(SEED)
    sources["rollout.py"] = sources["rollout.py"].replace("PROMPT = ", f"PROMPT = {template.replace('MARKER', str(marker))!r}\n_OLD = ", 1)
    with IsolatedHarness(sources, SEED) as h, pytest.raises(HarnessError):
        h.render_prompt("What is 2 + 2?")
    assert not marker.exists()


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
    "{{ question * 100000000000 }}",
])
def test_a_runaway_prompt_template_is_stopped_in_the_worker(template):
    from evotrainer.harness.sandbox import SandboxLimits

    sources = read_sources(SEED)
    sources["rollout.py"] = sources["rollout.py"].replace("PROMPT = ", f"PROMPT = {template!r}\n_OLD = ", 1)
    with IsolatedHarness(sources, SEED, limits=SandboxLimits(message_timeout_s=5.0, memory_limit_mb=1024)) as h:
        with pytest.raises(HarnessError):
            h.render_prompt("What is 2 + 2?")


def test_harness_yaml_with_a_python_tag_is_refused_in_the_trusted_process(tmp_path):
    marker = tmp_path / "marker"
    sources = read_sources(SEED)
    sources["harness.yaml"] += f"\nboom: !!python/object/apply:os.system [\"touch {marker}\"]\n"
    with pytest.raises(HarnessError, match="harness.yaml"):
        IsolatedHarness(sources, SEED)
    assert not marker.exists()


def test_call_time_payloads_load_cleanly_and_are_refused_in_every_call(tmp_path, listener):
    """The payload only inside reward, filters, curriculum, stop and every probe: loading works,
    and each call that reaches the payload fails as a HarnessError with nothing done."""
    marker = tmp_path / "marker"
    rs = rollouts()
    calls = {
        "reward": lambda h: h.rewards(rs),
        "filters": lambda h: h.filters([(rs[:4], [0.0] * 4)]),
        "weights": lambda h: h.weights([TaskStats("t0", 1, 0, {})]),
        "stop": lambda h: h.stop(rs[0].turns),
        "probe": lambda h: h.probes[0].evaluate(rs, [0.0] * len(rs)),
    }
    with IsolatedHarness(hostile_sources(marker, listener.port, at_import=False), SEED) as h:
        assert h.render_prompt("q")  # loaded: nothing ran at import
        for name, call in calls.items():
            with pytest.raises(HarnessError, match="attempted"):
                call(h)
            assert not marker.exists() and listener.hits == 0, name
    # The control: the same calls in process do reach the host.
    Harness(hostile_sources(marker, listener.port, at_import=False), SEED).probes[0].evaluate(rs, [0.0] * len(rs))
    assert marker.exists()
