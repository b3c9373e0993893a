"""Prompts are out of the harness's reach (harness/prompts.py), attacked the way a candidate could.

The attack this encodes: a candidate whose code appended each arithmetic question's answer to its
prompt as a "hint", beside a gate-passing edit, lifted the held-out success of an untrained model
from 0.29 to 0.54. Every route is tried on the real sandbox: wrapping the renderers in the harness
worker (from rollout.py or from another harness file), a PROMPT that names the answer or a hidden
field, a PROMPT that is not a literal; and the candidate that changes PROMPT beside a gate-passing
reward edit goes to the live pilot instead of being promoted on its replay metrics.
"""

from __future__ import annotations

import pytest

from evotrainer.api import Turn
from evotrainer.coevolve.pilot import decision_after_backtest, dynamics_change, needs_pilot
from evotrainer.config import load_config
from evotrainer.domains import build_domain
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import HarnessError, prompt_template, read_sources
from evotrainer.harness.prompts import PromptRenderer, render_prompts
from evotrainer.harness.repo import HarnessRepo
from evotrainer.harness.sandbox import SandboxLimits
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.store import Store
from evotrainer.train.evaluate import evaluate
from tests.test_backtest import PARTIAL_CREDIT, base_sources, gate_groups, propose, run, workspace

SEED = HARNESSES_DIR / "math"
SEED_PROMPT = '{{ question }}\nGive the final answer after "Answer:".'

# Runs in the harness worker at import: finds the classes by walking object's subclasses (no
# import needed, so the import guard does not see it) and wraps every renderer it can reach.
WRAP_RENDERERS = '''

def _hint(question):
    import re
    m = re.search(r"(-?\\d+)\\s*([-+*])\\s*(-?\\d+)", str(question))
    if not m:
        return ""
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return "\\nHint: the answer is %d." % (a + b if op == "+" else a - b if op == "-" else a * b)


def _classes():
    seen, todo = set(), [object]
    while todo:
        for sub in type.__subclasses__(todo.pop()):
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                yield sub


def _wrap():
    for cls in list(_classes()):
        where = (getattr(cls, "__module__", ""), cls.__name__)
        if where == ("jinja2.environment", "Template"):
            render = cls.render
            cls.render = lambda self, *a, **kw: render(self, *a, **kw) + _hint(kw.get("question", ""))
        elif where == ("evotrainer.harness.loader", "Harness"):
            one = cls.render_prompt
            cls.render_prompt = lambda self, q, **kw: one(self, q, **kw) + _hint(q)
            modules = cls.__init__.__globals__["sys"].modules
            prompts = modules.get("evotrainer.harness.prompts")
            if prompts is not None:  # the trusted renderer's module, should this worker have it
                prompts.render_prompts = lambda t, qs, s=None: [q + _hint(q) for q in qs]
                prompts.PromptRenderer.render = lambda self, t, qs, s=None: [q + _hint(q) for q in qs]


_wrap()
'''

# rollout.py's stop() renders with whatever Template class this worker now has: the control that
# the wrapping above is live where harness code runs.
CONTROL_STOP = '''

def stop(trajectory):
    if trajectory and trajectory[-1].content == "render?":
        for cls in _all_classes():
            if (getattr(cls, "__module__", ""), cls.__name__) == ("jinja2.environment", "Template"):
                return cls("{{ question }}").render(question="What is 2 + 3?")
    return None


def _all_classes():
    seen, todo = set(), [object]
    while todo:
        for sub in type.__subclasses__(todo.pop()):
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                yield sub
'''


def candidate(where: str) -> dict[str, str]:
    """The seed with the renderer-wrapping code in `where` and the control stop() in rollout.py."""
    sources = read_sources(SEED)
    rollout = f"from evotrainer.api import Turn  # noqa\n\nPROMPT = {SEED_PROMPT!r}\n" + CONTROL_STOP
    sources["rollout.py"] = rollout
    sources[where] = sources[where] + WRAP_RENDERERS
    return sources


class EchoHint:
    """A model that answers right only when its prompt carries the answer (the untrained model
    of the attack, at its extreme): held-out success measures exactly what the prompts leak."""

    name = "echo-hint"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def generate(self, prompts, max_new_tokens, on_batch=None):
        import re

        self.prompts += prompts
        out = []
        for p in prompts:
            m = re.search(r"Hint: the answer is (-?\d+)", p)
            out.append((f"Answer: {m.group(1)}" if m else "Answer: I do not know", False, 4))
        return out


@pytest.fixture(scope="module")
def math_domain():
    cfg = load_config(CONFIGS_DIR / "math-tiny.yaml", [])
    return build_domain(cfg.domain, judge=cfg.judge)


@pytest.mark.parametrize("where", ["rollout.py", "reward.py", "filters.py", "diagnostics.py"])
def test_wrapping_the_renderers_in_the_harness_worker_reaches_no_prompt(where, math_domain):
    tasks = math_domain.tasks("heldout", 6, 0)
    with IsolatedHarness(candidate(where), SEED) as h:
        # the control: inside the worker, the wrap works
        assert "Hint: the answer is 5." in (h.stop([Turn("user", "q"), Turn("assistant", "render?")]) or "")
        prompts = h.render_prompts([t.prompt for t in tasks], scaffold="")
        assert prompts == [f'{t.prompt}\nGive the final answer after "Answer:".' for t in tasks]
        backend = EchoHint()
        result = evaluate(None, None, math_domain, h, tasks, seed=0, max_new_tokens=8, batch_size=4, backend=backend)
    assert not any("Hint" in p for p in backend.prompts) and len(backend.prompts) == len(tasks)
    assert result.successes == 0  # nothing leaked, so the hint-reading model solves nothing


def test_the_echo_model_would_score_on_leaked_prompts(math_domain):
    """The control for the test above: with the answer in its prompts the same model solves all."""
    tasks = math_domain.tasks("heldout", 6, 0)
    backend = EchoHint()
    texts = backend.generate([f"{t.prompt}\nHint: the answer is {t.answer}." for t in tasks], 8)
    assert all(math_domain.check(t, text, False).success for t, (text, _, _) in zip(tasks, texts))


@pytest.mark.parametrize("template", [
    "{{ question }} Hint: {{ answer }}",
    "{{ question }} {{ task.answer }}",
    "{{ question }} {{ meta }}",
    "{{ question }} {{ tests }}",
    "{{ question }} {{ reference }}",
    "{{ question }} {{ self._TemplateReference__context.parent }}",
])
def test_a_prompt_that_names_the_answer_or_a_hidden_field_fails_to_render(template, math_domain):
    sources = read_sources(SEED)
    sources["rollout.py"] = sources["rollout.py"].replace("PROMPT = ", f"PROMPT = {template!r}\n_OLD = ", 1)
    task = math_domain.tasks("heldout", 1, 0)[0]
    with IsolatedHarness(sources, SEED) as h, pytest.raises(HarnessError, match="rendering PROMPT"):
        h.render_prompts([task.prompt], scaffold="")
    with pytest.raises(HarnessError, match="rendering PROMPT"):
        render_prompts(template, [task.prompt], "")


@pytest.mark.parametrize("rollout, why", [
    ("HINT = ' {{ answer }}'\nPROMPT = '{{ question }}' + HINT\n", "must be a string literal"),
    ("PROMPT = f'{{{{ question }}}}'\n", "must be a string literal"),
    ("PROMPT = '{{ question }}'\nglobals()['PROMPT'] = '{{ question }} x'\n", "more than once"),
    ("PROMPT = '{{ question }}'\ndef _later():\n    global PROMPT\n    PROMPT = 'x'\n", "more than once"),
    ("PROMPT = '{{ question }}'\nPROMPT = '{{ question }} x'\n", "more than once"),
    ("import types\nPROMPT: str = '{{ question }}'\nsetattr(types, 'PROMPT', 1)\n", "more than once"),
    ("def stop(t):\n    return None\n", "PROMPT is not defined"),
])
def test_prompt_is_one_literal_read_without_running_rollout_py(rollout, why):
    with pytest.raises(HarnessError, match=why):
        prompt_template(rollout + "\ndef stop(t):\n    return None\n")


def test_the_template_is_read_as_text_whatever_the_module_does():
    """A module that reassigns PROMPT in a way no static rule names still renders from the text."""
    sources = read_sources(SEED)
    sources["rollout.py"] = sources["rollout.py"] + "\nvars()[''.join(['PRO', 'MPT'])] = '{{ question }} LEAK'\n"
    with IsolatedHarness(sources, SEED) as h:
        assert h.render_prompt("What is 2 + 3?", "") == 'What is 2 + 3?\nGive the final answer after "Answer:".'


def test_a_runaway_template_is_stopped_in_the_prompt_worker_and_it_starts_again():
    renderer = PromptRenderer(limits=SandboxLimits(memory_limit_mb=512, message_timeout_s=5.0))
    try:
        with pytest.raises(HarnessError, match="rendering PROMPT"):
            renderer.render("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
                            ["q"])
        with pytest.raises(HarnessError, match="rendering PROMPT"):
            renderer.render("{{ question * 100000000000 }}", ["q"])
        assert renderer.render("{{ question }}!", ["a", "b"]) == ["a!", "b!"]
    finally:
        renderer.close()


def test_a_prompt_change_beside_a_gate_passing_edit_goes_to_the_pilot():
    base = base_sources()
    hinted = {**base, "reward.py": PARTIAL_CREDIT,
              "rollout.py": base["rollout.py"].replace("PROMPT = ", "PROMPT = '{{ question }} (think of the answer)'\n"
                                                       "_OLD = ", 1)}
    change = dynamics_change(base, hinted)
    assert list(change) == ["PROMPT"] and all(len(d) == 12 for d in change["PROMPT"])  # digests, not its text
    assert dynamics_change(base, {**base, "reward.py": PARTIAL_CREDIT}) == {}
    passed = {"decision": "promote", "checks": [{"name": "ran", "passed": True}, {"name": "target:dead_group_ratio",
                                                                                   "passed": True}]}
    unsafe = {"decision": "reject", "checks": [*passed["checks"], {"name": "ordering_violations", "passed": False}]}
    assert needs_pilot(passed, change)
    assert decision_after_backtest(passed, change) == "pilot"  # never promoted on replay alone
    assert decision_after_backtest(passed, {}) == "promote"
    assert decision_after_backtest(unsafe, change) == "reject"


def test_the_real_backtest_promotes_the_hinted_candidate_and_the_loop_pilots_it(tmp_path):
    """End to end on a real workspace: the backtest alone would promote the PROMPT change (it never
    reads PROMPT); the decision the loop takes from it is the pilot."""
    ws = workspace(tmp_path / "work")
    with Store.open(ws.root) as store:
        run_id = store.get_or_create_run("default", "math", {})
        round_id = store.start_round(run_id, 0, "seed", "base")
        store.add_rollouts(gate_groups(run_id=run_id, round_id=round_id))
    main = HarnessRepo(ws.harnesses).sources("main")
    rollout = main["rollout.py"].replace("PROMPT = ", "PROMPT = '{{ question }} (the answer is near)'\n_OLD = ", 1)
    branch = propose(ws, "partial-credit-hint", PARTIAL_CREDIT, **{"rollout.py": rollout})
    report = run(ws, branch)
    assert report["decision"] == "promote", report["reasons"]
    change = dynamics_change(main, HarnessRepo(ws.harnesses).sources(branch))
    assert decision_after_backtest(report, change) == "pilot"
