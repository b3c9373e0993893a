"""Hand-made rollouts that move every standard probe off its default: math, code and swe, single-
and multi-turn, with judge labels and the model-state meta the trainer writes."""

from __future__ import annotations

from evotrainer.api import Rollout, Turn
from tests.factories import make_rollout
from tests.test_backtest import gate_groups
from tests.test_diagnose import batch


def _r(rid: str, group: str, domain: str, kind: str, *, flags=(), tokens: int = 20, truncated: bool = False,
       text: str = "done", turns=(), meta=None) -> Rollout:
    ok = kind == "ok"
    return make_rollout(rid, task_id=f"task-{group}", group_id=group, domain=domain, prompt="fix it", completion=text,
                        turns=turns, success=ok, kind=kind, flags=flags, num_tokens=tokens, truncated=truncated,
                        meta=meta)


def _agent(*steps: tuple[str, str]) -> tuple[Turn, ...]:
    """An agent trajectory: the task, then (action, observation) pairs."""
    turns = [Turn("user", "fix the bug")]
    for action, observation in steps:
        turns += [Turn("assistant", action), Turn("tool", observation)]
    return tuple(turns)


def swe_batch() -> list[Rollout]:
    edit = ("sed -i 's/a/b/' x.py", "ok")
    error = ("pytest", "Traceback (most recent call last):\n  boom")
    out = [
        _r("s0", "sg0", "swe", "ok", flags=("f2p_all",), turns=_agent(("ls", "x.py"), edit, ("pytest", "1 passed")),
           meta={"mean_logprob": -0.4, "entropy": 0.9, "kl": 0.01, "judge": {"success": True}}),
        _r("s1", "sg0", "swe", "wrong", flags=("f2p_partial",), turns=_agent(("ls", "x.py"), edit, error, error),
           meta={"mean_logprob": -0.02, "entropy": 0.05, "kl": 0.3, "judge": {"success": True}}),
        _r("s2", "sg0", "swe", "patch_failed", turns=_agent(("cat x.py", "a")),
           meta={"mean_logprob": -0.01, "entropy": 0.01, "kl": 0.6, "judge": {"success": False}}),
        _r("s3", "sg0", "swe", "tampering", flags=("tampering",), turns=_agent(edit, ("rm tests/test_x.py", "")),
           meta={"entropy": True, "judge": {"success": True}}),  # a bool is not a measurement
        _r("s4", "sg1", "swe", "empty", text="", turns=_agent(("ls", "x.py"), ("ls", "x.py"), ("ls", "x.py")),
           meta={"judge": {"success": False}}),
        _r("s5", "sg1", "swe", "timeout", flags=("timeout",), truncated=True, tokens=140,
           turns=_agent(*[(f"echo step {i}", "step") for i in range(62)]), meta={"judge": "unlabelled"}),
        _r("s6", "sg1", "swe", "wrong", turns=_agent(("grep -n foo x.py", "No such file or directory"),
                                                      ("cat y.py", "error: missing"), edit),
           meta={"judge": {"success": True}}),
        _r("s7", "sg1", "swe", "format_error", text="I think\nI think\nI think", tokens=130,
           meta={"judge": {"success": False}, "mean_logprob": "n/a"}),
        _r("s8", "sg2", "swe", "wrong", flags=("f2p_partial", "timeout"), meta={"judge": {"success": True}}),
        _r("s9", "sg2", "swe", "wrong", meta={"judge": {"success": False}}),
    ]
    return out


def code_batch() -> list[Rollout]:
    body = "def f(x):\n    return x + 1\n"
    return [
        _r("c0", "cg0", "code", "ok", text=body, tokens=40, meta={"mean_logprob": -0.3, "entropy": 0.4}),
        _r("c1", "cg0", "code", "wrong", text=body, tokens=40),  # a duplicate of c0's text
        _r("c2", "cg0", "code", "tampering", flags=("tampering",), text="print('PASS')", tokens=110),
        _r("c3", "cg0", "code", "timeout", text="while True: pass", tokens=128, truncated=True),
        _r("c4", "cg1", "code", "wrong", flags=("tampering",), text="x = 1\n" * 4, tokens=125),
        _r("c5", "cg1", "code", "empty", text="   ", tokens=0),
        _r("c6", "cg1", "code", "format_error", text="I would write a function", tokens=60,
           meta={"kl": 0.2}),
        _r("c7", "cg1", "code", "ok", text="def f(x): return x+1", tokens=30),
    ]


def steps_batch() -> list[Rollout]:
    """Four training steps of one prompt whose entropy falls by half within two steps."""
    return [_r(f"e{step}{i}", f"eg{step}", "math", "wrong", meta={"entropy": e, "train_step": step})
            for step, e in enumerate((2.0, 1.0, 0.8, 0.6)) for i in range(2)]


def varied_batch() -> list[Rollout]:
    """Every domain's rollouts together (a diagnose over a whole store sees such a mix)."""
    return batch() + [row.rollout for row in gate_groups()] + code_batch() + swe_batch() + steps_batch()


BATCHES = {"math": batch, "gate": lambda: [row.rollout for row in gate_groups()], "code": code_batch,
           "swe": swe_batch, "varied": varied_batch}
