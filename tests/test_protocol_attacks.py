"""Harness code attacks the parent's side of the worker protocol (issue 32, parts 3 and 6).

Red-team style, on the real OS sandbox: each test is a harness that writes its own frames on its
worker's socket (well-formed ones of the wrong kind, oversized or costly ones), forges the
watchdog's shared page, or returns values each finite whose aggregate is not. Every one must
be a rejection of that candidate with a redacted reason (CandidateFailure in the backtest, a
HarnessError naming the harness commit in training), never an exception of ours, never a
stopped stage, never a parent that allocates gigabytes or waits out the 600 s message limit.
"""

# ruff: noqa: F811 -- the fixtures imported from test_sandbox are parameters here
from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from test_sandbox import GATE, rejected, reward, score, seed, ws  # noqa: F401 -- fixtures

from evotrainer.api import Outcome, Rollout, TaskStats
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import HarnessError, validate_weights
from evotrainer.harness.sandbox import CandidateFailure, SandboxLimits, SandboxPool
from evotrainer.report.distributions import RewardJob

SECRET = "sk-proj-Qw7rT2yU9iO4pA6sD1fG3hJ5kL8zX0cV"
COMMIT = "0123456789abcdef0123456789abcdef01234567"

# Harness code that writes `payload` (bytes) as one length-prefixed frame on every socket it holds.
SEND = '''
def _send(payload, size=None):
    import random
    os = random._os
    for f in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + f).startswith("socket:"):
                os.write(int(f), struct.pack("!i", len(payload) if size is None else size) + payload)
        except OSError:
            pass
'''


def _frame(message) -> bytes:
    return json.dumps(message).encode()


def _rollout() -> Rollout:
    return Rollout(id="r-1", task_id="t", group_id="g", domain="math", prompt="p", completion="c", turns=(),
                   outcome=Outcome(True, 1.0, "ok", ()), num_tokens=3, truncated=False, meta={})


def _isolated(seed, limits: SandboxLimits = SandboxLimits(), **files: str) -> IsolatedHarness:
    sources = {**seed, **{f"{name}.py": text for name, text in files.items()}}
    return IsolatedHarness(sources, "harnesses", version=COMMIT, limits=limits)


# ---------------------------------------------------------------- well-formed frames of the wrong kind

WRONG_KINDS = [
    ["ready", [{"candidate": "x"}, {"seccomp": True}]],  # a second ready, while busy
    ["error", f"Traceback: the key is {SECRET}"],  # "our" code failing, with a secret in the text
    ["failed", "base", f"blame the other side {SECRET}"],  # a failure naming the base harness
    ["done", {"ids": []}],  # a reply before the real one (the real one then answers nothing)
]


@pytest.mark.parametrize("message", WRONG_KINDS, ids=lambda m: m[0])
def test_wrong_kind_frames_in_the_backtest_reject_the_candidate(ws, seed, message, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    why = rejected(ws, seed, "", reward=reward(
        f"_send({_frame(message)!r})\nreturn {{'correct': 1.0}}", head="import struct\n" + SEND))
    assert SECRET not in why


@pytest.mark.parametrize("message", [["error", f"Traceback: {SECRET}"], ["done", [1]],
                                     ["ready", [{}, {}]], ["ready", "x"]], ids=lambda m: m[0] + "-" + type(m[1]).__name__)
def test_wrong_kind_frames_while_loading_reject_the_candidate(ws, seed, message, monkeypatch):
    """Frames written by harness.py's top level, before the worker said ready: an 'error' there
    looks like our start-up code failing; a worker that loads no harness shows it is not."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    why = rejected(ws, seed, "", reward="import struct\n" + SEND + f"\n_send({_frame(message)!r})\n"
                   + reward("return {'correct': 1.0}"))
    assert SECRET not in why


def test_a_wrong_kind_frame_in_training_is_a_harness_error_naming_the_commit(seed):
    h = _isolated(seed, reward=reward(f"_send({_frame(['ready', [{}, {}]])!r})\nreturn {{'correct': 1.0}}",
                                      head="import struct\n" + SEND))
    with h, pytest.raises(HarnessError, match=f"^harness {COMMIT[:12]}: .*broke the message protocol"):
        h.rewards([_rollout()])


def test_a_forged_probe_reply_is_a_harness_error_not_a_type_error(seed):
    diagnostics = seed["diagnostics.py"] + '''

import struct
''' + SEND + '''

def forged(rollouts, rewards):
    _send(b'["done", 7]')
    return 0.0


PROBES.append({"name": "forged", "dimension": "result", "fn": forged, "warn": 1.0, "critical": 2.0,
               "direction": "above"})
'''
    with _isolated(seed, diagnostics=diagnostics) as h:
        forged = next(p for p in h.probes if p.name == "forged")
        with pytest.raises(HarnessError, match="malformed reply|broke the message protocol"):
            forged.evaluate([_rollout()], [1.0])


@pytest.mark.parametrize("payload", [b'["done", [{"correct": 1e999}]]', b'["done", [{"correct": -2e400}]]',
                                     b'["done", [{"correct": NaN}]]', b'["done", [{"correct": Infinity}]]',
                                     b'["done", [{"NaN": 1.0, "correct": 1e9}]]', b'["done", {"x": 1}]'])
def test_a_forged_reply_with_a_non_finite_number_is_a_harness_error_in_training(seed, payload):
    """A 'done' frame written ahead of the real reply is taken as the reply. Python's json reads
    NaN and Infinity (not JSON; our worker never sends them) and 1e999 as inf: the parent's own
    check of the reply refuses them, and a NaN key that sums past the bound with another."""
    with _isolated(seed, reward=reward(f"_send({payload!r})\nreturn {{'correct': 1.0}}",
                                       head="import struct\n" + SEND)) as h:
        with pytest.raises(HarnessError, match=f"^harness {COMMIT[:12]}: "):
            h.rewards([_rollout()])


# ---------------------------------------------------------------- what one frame may cost the parent


def _peak_while(run) -> tuple[int, object]:
    tracemalloc.start()
    try:
        outcome = run()
        return tracemalloc.get_traced_memory()[1], outcome
    finally:
        tracemalloc.stop()


def _pool_failure(seed, body: str) -> CandidateFailure:
    sources = {**seed, "reward.py": reward(body + "\nreturn {'correct': 1.0}", head="import struct\n" + SEND)}
    with pytest.raises(CandidateFailure) as failure:
        # generous: writing 15 MiB waits for the parent to read it, on a machine others share
        with SandboxPool([("candidate", sources)], RewardJob(), 1, SandboxLimits(call_timeout_s=120.0)) as pool:
            list(pool.imap([([0], [_rollout_dict()])]))
    assert failure.value.harness == "candidate"
    return failure.value


def _rollout_dict() -> dict:
    from evotrainer.api import rollout_to_dict

    return rollout_to_dict(_rollout())


# ~15 MiB each, under the frame cap: nested empty lists cost ~27x their size to decode (~400 MB
# here); a flat list of zeros 8 bytes per 2; an object of distinct keys ~10x.
COSTLY = {
    "nested-empty-lists": "b'[' + b'[],' * (5 * 2**20) + b'[]]'",
    "flat-zeros": "b'[' + b'0,' * (15 * 2**19) + b'0]'",
    "deep-dicts": "b'{\"a\":' * 200000 + b'1' + b'}' * 200000",
    "many-keys": "b'{' + b','.join(b'\"%d\":0' % i for i in range(2**20 + 2**10)) + b'}'",
}


@pytest.mark.parametrize("name", COSTLY)
def test_a_frame_costly_to_decode_is_refused_before_decoding(seed, name):
    peak, failure = _peak_while(lambda: _pool_failure(seed, f"_send({COSTLY[name]})"))
    assert "wrote into the sandbox worker's result pipe" in failure.reason
    # The frame itself (~15 MiB, read into one buffer and sliced once) is what the parent holds:
    # without the pre-scan, decoding the nested lists alone allocated ~400 MB.
    assert peak < 64 * 2**20, f"the parent allocated {peak / 2**20:.0f} MiB for one frame"


def test_a_frame_over_the_cap_is_refused_on_its_header(seed):
    failure = _pool_failure(seed, "_send(b'[]', size=(16 << 20) + 1)")
    assert "a frame of 16777217 bytes" in failure.reason


def test_a_frame_claiming_a_huge_length_then_exiting_fails_the_candidate(seed):
    """A header promising 15 MiB, 2 bytes of it, then the worker exits: the parent waits for
    nothing and reads nothing more; the death fails the candidate."""
    failure = _pool_failure(seed, "_send(b'[]', size=15 << 20)\nimport random\nrandom._os._exit(0)")
    assert "died" in failure.reason


@pytest.mark.parametrize("value", ["float('nan')", "float('inf')", "True", "'0.5'", "[0.5]",
                                   "type('F', (float,), {'__float__': lambda self: float('nan')})(0.5)"])
def test_a_probe_value_that_is_not_a_finite_float_is_a_harness_error(seed, value):
    """Probes too: NaN, inf, a bool, a string, a list, a float subclass that turns into NaN."""
    diagnostics = seed["diagnostics.py"] + f'''

def odd(rollouts, rewards):
    return {value}


PROBES.append({{"name": "odd", "dimension": "result", "fn": odd, "warn": 1.0, "critical": 2.0,
               "direction": "above"}})
'''
    with _isolated(seed, diagnostics=diagnostics) as h:
        odd = next(p for p in h.probes if p.name == "odd")
        with pytest.raises(HarnessError, match="odd"):
            odd.evaluate([_rollout()], [1.0])


@pytest.mark.parametrize("frame", [b'[[], 1]', b'[{"a": 1}, 2]', b'[1.5]', b'"done"', b'[]', b'[null, null]'])
def test_a_frame_of_unknown_shape_fails_the_candidate_not_the_parent(seed, frame):
    """A kind that is not a string (on main a list there raised TypeError in the parent)."""
    failure = _pool_failure(seed, f"_send({frame!r})")
    assert "a message of unknown shape" in failure.reason


# ---------------------------------------------------------------- the watchdog's page is the worker's


FORGE_MARKS = '''
try:
    1 / 0
except ZeroDivisionError as exc:
    frame = exc.__traceback__.tb_frame
while frame is not None and "marks" not in frame.f_locals:
    frame = frame.f_back
marks = frame.f_locals["marks"]  # SandboxedHarness._run's view of the shared page
while True:
    marks[1] = 0.0  # "no harness call is running"
    marks[2] = 1.0  # "busy with the message"
'''


def test_forged_call_marks_cannot_stretch_the_per_call_deadline(seed):
    """The harness forges the page so no call looks like running: before, only the 600 s
    message limit stopped it. The parent's own deadline (calls x call timeout) kills it."""
    limits = SandboxLimits(call_timeout_s=1.0, message_timeout_s=600.0)
    with _isolated(seed, limits, reward=reward(FORGE_MARKS)) as h:
        start = time.monotonic()
        with pytest.raises(HarnessError, match=f"^harness {COMMIT[:12]}: one message took over 2 s"):
            h.rewards([_rollout()])
        assert time.monotonic() - start < 15


def test_forged_marks_while_loading_are_blamed_on_the_harness(seed):
    """The same forgery at import time: the parent's start-up deadline passes, and a worker that
    loads no harness starts, so the harness is at fault (not a SandboxError that stops a run)."""
    limits = SandboxLimits(load_timeout_s=1.0)
    sources = {**seed, "reward.py": FORGE_MARKS + reward("return {'correct': 1.0}")}
    pool = SandboxPool([("candidate", sources)], RewardJob(), 1, limits)
    pool.STARTUP_S = 5.0
    with pytest.raises(CandidateFailure, match="no ready message within"):
        with pool:
            pass


# ---------------------------------------------------------------- non-finite aggregates


def test_weights_each_finite_whose_sum_overflows_are_refused():
    with pytest.raises(HarnessError, match="sum overflows"):
        validate_weights({"a": 1e308, "b": 1e308}, ["a", "b"])
    assert validate_weights({"a": 1e300, "b": 1e300}, ["a", "b"]) == {"a": 1e300, "b": 1e300}


def test_overflowing_curriculum_weights_in_the_sandbox_name_the_commit(seed):
    curriculum = "def weights(task_stats):\n    return {s.task_id: 1e308 for s in task_stats}\n"
    with _isolated(seed, curriculum=curriculum) as h:
        with pytest.raises(HarnessError, match=f"^harness {COMMIT[:12]}: .*sum overflows"):
            h.weights([TaskStats("a", 1, 0, {}), TaskStats("b", 1, 1, {})])


@pytest.mark.parametrize("value", ["1e308", "-1e308", "1e10"])
def test_a_huge_training_reward_is_refused_in_training(seed, value):
    """1e308 is finite, but two of them sum to inf: the step's advantages were NaN and it
    learnt nothing, silently. Every reward is bounded, as the backtest bounds it."""
    with _isolated(seed, reward=reward(f"return {{'correct': {value}}}")) as h:
        with pytest.raises(HarnessError, match=f"^harness {COMMIT[:12]}: reward.py: .*within"):
            h.rewards([_rollout(), _rollout()])


def test_a_weighted_sum_past_the_bound_is_refused_in_training_and_backtest(ws, seed):
    huge = {"reward": reward("return {'correct': 1e9, 'format': 1e9}")}
    with _isolated(seed, **huge) as h:
        with pytest.raises(HarnessError, match="training reward"):
            h.rewards([_rollout()])
    rejected(ws, seed, "training reward", **huge)


def test_an_honest_reward_still_passes(ws, seed):
    assert score(ws, seed, reward=reward("return {'correct': float(rollout.outcome.success)}")).failure is None
    with _isolated(seed) as h:
        assert h.rewards([_rollout()])


# ---------------------------------------------------------------- the CLI: a report, not a traceback


@pytest.mark.parametrize("message", [["ready", [{}, {}]], ["failed", "base", f"blame the base {SECRET}"],
                                     ["error", f"our code broke: {SECRET}"]],
                         ids=lambda m: m[0])
def test_evotrainer_backtest_reports_a_protocol_violation_as_a_rejection(tmp_path, monkeypatch, message):
    """On main a 'ready' frame made `evotrainer backtest` die with a traceback and no report;
    coevolve's backtest stage calls the same backtest() (and so does its --resume)."""
    from test_backtest import BASE_REWARD, gate_groups, propose, workspace
    from typer.testing import CliRunner

    from evotrainer.cli.main import app
    from evotrainer.store import Store

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    ws = workspace(tmp_path / "work")
    with Store.open(ws.root) as store:
        run = store.get_or_create_run("default", "math", {})
        store.add_rollouts(gate_groups(run_id=run, round_id=store.start_round(run, 0, "seed", "base")))
    evil = BASE_REWARD.replace("def reward(", "import struct\n" + SEND + "\n_sent = []\n\n\ndef _reward(", 1) + f'''

def reward(rollout):
    if not _sent:
        _sent.append(1)
        _send({_frame(message)!r})
    return _reward(rollout)
'''
    branch = propose(ws, "evil-frames", evil)
    result = CliRunner().invoke(app, ["backtest", branch, "--rollouts", "run=default,round=0", "--workdir",
                                      str(ws.root), "--json"])
    assert result.exit_code == 0 and result.exception is None, result.output
    assert "Traceback" not in result.output and SECRET not in result.output
    report = json.loads(result.stdout)
    assert report["decision"] == "reject"
    assert report["failure"]["harness"] == "candidate", report["failure"]

