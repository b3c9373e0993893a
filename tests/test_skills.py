"""The shipped skill library: every skill parses, every grid point renders into a harness that loads
and behaves as its README says, learned skills override shipped ones, and the `skills` CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from factories import make_rollout
from typer.testing import CliRunner

from evotrainer.api import Rollout, TaskStats, Turn
from evotrainer.harness.loader import Harness, read_sources
from evotrainer.paths import FAULT_CASES_DIR, HARNESSES_DIR, SKILLS_DIR
from evotrainer.skills import SkillError, SkillLibrary, parse_skill, save_learned, set_yaml_key

MATH = read_sources(HARNESSES_DIR / "math")
CODE = read_sources(HARNESSES_DIR / "code")
# The seed with its `format` weight at 0: a correctness-only base. The shipped seed already pays
# a clean finish, which is what partial credit adds, so partial credit is tested on this base.
PLAIN = {**MATH, "harness.yaml": MATH["harness.yaml"].replace("format: 0.1", "format: 0.0")}
assert "format: 0.0" in PLAIN["harness.yaml"]
LIB = SkillLibrary.load(None)
ENV = {"COLUMNS": "200", "EVOTRAINER_WORKDIR": None}
REQUIRED = {"partial-credit-format", "zero-variance-group-filter", "mask-truncated", "overlong-penalty",
            "pass-rate-curriculum", "echo-trap-filter", "abandonment-filter", "tampering-penalty",
            "search-before-edit", "edit-then-test", "error-streak-truncation", "judge-step-attribution"}


def roll(kind: str = "wrong", text: str = "Answer: 3", *, marker: bool | None = None, tokens: int = 8,
         truncated: bool = False, turns=(), meta=None, flags=(), group: str = "g", rid: str = "r") -> Rollout:
    marker = ("Answer:" in text) if marker is None else marker
    flags = tuple(flags) + (("answer_marker",) if marker else ())
    return make_rollout(rid, task_id="t", group_id=group, prompt="q", completion=text, turns=turns,
                        success=kind == "ok", kind=kind, flags=flags, num_tokens=tokens, truncated=truncated, meta=meta)


def harness_with(name: str, base: dict | None = None, **params) -> Harness:
    base = base or MATH
    return Harness({**base, **LIB.get(name).render(base, params)}, Path("x"))


def score(h: Harness, r: Rollout) -> float:
    return h.training_reward(h.reward(r))


# ---------------------------------------------------------------- the library


def test_shipped_skills_parse_and_cover_the_field() -> None:
    assert len(LIB) >= 11 and not LIB.errors
    assert REQUIRED <= set(LIB.skills)
    for skill in LIB:
        folder = SKILLS_DIR / skill.name
        assert (folder / "README.md").is_file() and skill.readme.startswith(f"# {skill.name}")
        assert skill.status in ("seed", "validated", "failed") and skill.domains and skill.targets
        assert skill.grid_points() and skill.intervention
    assert not LIB.get("judge-step-attribution").default_on
    assert all(s.default_on for s in LIB if s.name != "judge-step-attribution")
    # The field's numbers are the grids.
    assert LIB.get("search-before-edit").grid["weight"][0] == 0.1
    assert LIB.get("edit-then-test").grid["weight"][0] == 0.15
    assert LIB.get("error-streak-truncation").grid["max_errors"][0] == 2
    assert 15 not in LIB.get("idle-turn-truncation").grid["max_idle_turns"]
    assert max(LIB.get("partial-credit-format").grid["weight"]) <= 0.1


CASES = [(s.name, p) for s in LIB for p in s.grid_points()]
# The dynamics skills put a knob back to the seed's value: they change the harness of the fault
# case they repair (its harness.yaml), not the seed.
FAULT_CASE = {"raise-temperature": "math-temperature-duplicates", "lower-learning-rate": "math-lr-collapse",
              "more-generations": "math-few-generations", "longer-completions": "math-truncation-cuts-successes"}


def test_longer_completions_never_shortens_the_limit() -> None:
    skill = LIB.get("longer-completions")
    case = (FAULT_CASES_DIR / "math-truncation-cuts-successes" / "harness" / "harness.yaml").read_text()
    limit = lambda text: yaml.safe_load(text)["grpo"]["max_completion_length"]  # noqa: E731
    assert limit(case) == 12
    assert [limit(skill.render({**MATH, "harness.yaml": case}, {"length": n})["harness.yaml"]) for n in (64, 256)] == [64, 256]
    long = set_yaml_key(MATH["harness.yaml"], "grpo.max_completion_length", 128)
    # At or under the current limit the render changes nothing, so the rules agent skips it.
    assert skill.render({**MATH, "harness.yaml": long}, {"length": 64}) == {"harness.yaml": long}


@pytest.mark.parametrize("name,params", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_every_grid_point_renders_and_loads_on_the_math_harness(name: str, params: dict) -> None:
    skill = LIB.get(name)
    base = dict(MATH)
    if name in FAULT_CASE:
        base["harness.yaml"] = (FAULT_CASES_DIR / FAULT_CASE[name] / "harness" / "harness.yaml").read_text()
    edits = skill.render(base, params)
    assert edits and all(base[f] != t for f, t in edits.items())
    sources = {**base, **edits}
    h = Harness(sources, Path("x"))
    h.reward(roll())
    h.keep_rollout(roll())
    assert h.keep_group([roll(), roll("ok")], [0.0, 1.0]) in (True, False)
    h.weights([TaskStats("a", 10, 10), TaskStats("b", 0, 0)])
    assert h.stop([Turn("user", "task"), Turn("assistant", "ls")]) in (None, "consecutive_errors", "no_progress")
    # Re-rendering over its own output retunes instead of stacking: same text, one block.
    assert skill.render(sources, params) == edits
    for file, text in edits.items():
        if file.endswith(".py"):
            assert text.count(f"# >>> skill: {name}") == 1
    # All skills together compose (each wraps whatever it finds).
    yaml.safe_load(sources["harness.yaml"])


def test_all_skills_stack_on_one_harness() -> None:
    sources = dict(MATH)
    for skill in LIB:
        if skill.name != "verified-tier-reward":  # rescales every component; checked on the stack below
            sources.update(skill.render(sources, skill.grid_points()[0]))
    h = Harness(sources, Path("x"))
    comps = h.reward(roll("ok", meta={"step_labels": ["GOOD", "BAD", "GOOD"]}))
    assert {"correct", "format", "partial_format", "overlong", "tampering", "search_before_edit",
            "edit_then_test", "step_attribution"} <= set(comps)
    assert comps["step_attribution"] == pytest.approx(1 / 3)
    # Retuning one skill in the stack replaces its block only.
    retuned = LIB.get("partial-credit-format").render(sources, {"weight": 0.05})
    assert retuned["reward.py"].count("# >>> skill: partial-credit-format") == 1
    assert "# >>> skill: tampering-penalty" in retuned["reward.py"]
    assert yaml.safe_load(retuned["harness.yaml"])["reward_weights"]["partial_format"] == 0.05
    Harness({**sources, **retuned}, Path("x"))
    # On top of the whole stack the tiers hold: every success above every failure.
    tiered = Harness({**sources, **LIB.get("verified-tier-reward").render(sources, {"scale": 0.45})}, Path("x"))
    assert {"verified", "correct", "tampering"} <= set(tiered.reward(roll("ok")))
    assert score(tiered, roll("ok", tokens=32, truncated=True)) > max(
        score(tiered, roll(k, text=t, tokens=n)) for k in ("wrong", "format_error") for t in ("Answer: 4", "x")
        for n in (1, 31))


def test_render_errors_name_the_skill() -> None:
    skill = LIB.get("partial-credit-format")
    with pytest.raises(SkillError, match="partial-credit-format: missing param"):
        skill.render(MATH, {})
    no_reward = {k: v for k, v in MATH.items() if k != "reward.py"}
    with pytest.raises(SkillError, match="partial-credit-format: rendering reward.py.j2"):
        skill.render(no_reward, {"weight": 0.1})


# ---------------------------------------------------------------- what the interventions do


def test_partial_credit_rescues_dead_groups_without_ordering_violations() -> None:
    seed = Harness(PLAIN, Path("seed"))
    h = harness_with("partial-credit-format", base=PLAIN, weight=0.1)
    # An all-failing group without answer markers is dead under the seed...
    group = [roll(text="so the result is 7", rid="a"), roll("format_error", "no idea", rid="b"),
             roll("truncated", "let me think about 7 and", truncated=True, tokens=32, rid="c"),
             roll(text="it is 12.", rid="d")]
    assert len({score(seed, r) for r in group}) == 1
    # ...and live under the skill: well-formed, finished answers earn a little.
    rewards = [score(h, r) for r in group]
    assert rewards == pytest.approx([0.1, 0.0, 0.0, 0.1])
    # Every success still outranks every failure.
    successes = [roll("ok", "Answer: 5"), roll("ok", "5"), roll("ok", "Answer: 5 and then", truncated=True)]
    failures = group + [roll(text="Answer: 4"), roll(text="Answer: 4", truncated=True)]
    assert min(score(h, r) for r in successes) > max(score(h, r) for r in failures)
    assert max(score(h, r) for r in failures) <= 0.2 + 1e-9


def test_hidden_test_credit_rescues_dead_code_groups_without_ordering_violations() -> None:
    sparse = {**CODE, "harness.yaml": CODE["harness.yaml"].replace("format: 0.1", "format: 0.0")}
    seed = Harness(sparse, Path("seed"))

    def code(kind: str, share: float, rid: str) -> Rollout:
        return make_rollout(rid, task_id="t", domain="code", prompt="q", completion="def f(x):\n    return x",
                            success=kind == "ok", kind=kind, score=share, num_tokens=12)

    group = [code("wrong", 0.0, "a"), code("wrong", 0.5, "b"), code("wrong", 0.75, "c"), code("format_error", 0.0, "d")]
    assert len({score(seed, r) for r in group}) == 1  # dead under the sparse seed
    for weight in LIB.get("hidden-test-credit").grid["weight"]:
        h = harness_with("hidden-test-credit", base=sparse, weight=weight)
        rewards = [score(h, r) for r in group]
        assert rewards == pytest.approx([0.0, 0.5 * weight, 0.75 * weight, 0.0])
        # A success earns the whole component; a tampering answer the grader scored 0 earns none.
        assert score(h, code("ok", 1.0, "e")) == pytest.approx(1.0 + weight)
        assert score(h, code("ok", 1.0, "e")) > max(rewards)
        assert score(h, code("tampering", 0.0, "f")) == 0.0


def test_overlong_penalty_keeps_successes_above_failures() -> None:
    for weight, buffer in [(0.1, 0.25), (0.2, 0.5)]:
        h = harness_with("overlong-penalty", weight=weight, buffer=buffer)
        lengths = [1, 16, 24, 28, 31, 32]
        successes = [roll("ok", tokens=n, truncated=n == 32) for n in lengths]
        failures = [roll(text=t, tokens=n, truncated=n == 32) for n in lengths for t in ("Answer: 4", "x")]
        assert min(score(h, r) for r in successes) > max(score(h, r) for r in failures)
        # A mixed-length failing group gains signal; short answers are not penalised.
        assert score(h, roll(tokens=8)) == pytest.approx(0.1)
        assert score(h, roll(tokens=31)) < score(h, roll(tokens=20)) <= 0.1
        assert score(h, roll(tokens=32, truncated=True)) == pytest.approx(0.1 - weight)


def test_verified_tier_reward_puts_every_success_above_every_failure() -> None:
    # A shaping term that outweighs correctness: 2.0 per full-length completion.
    paid = {**MATH, "harness.yaml": MATH["harness.yaml"].replace("format: 0.1", "format: 0.1\n  thorough: 2.0"),
            "reward.py": MATH["reward.py"].replace('"format":', '"thorough": rollout.num_tokens / 32.0,\n        "format":')}
    faulty = Harness(paid, Path("faulty"))
    assert score(faulty, roll(tokens=32, truncated=True, kind="truncated")) > score(faulty, roll("ok", tokens=4))
    for scale in LIB.get("verified-tier-reward").grid["scale"]:
        h = harness_with("verified-tier-reward", base=paid, scale=scale)
        successes = [roll("ok", tokens=n) for n in (1, 4, 31)]
        failures = [roll(k, tokens=n, truncated=k == "truncated") for k in ("wrong", "truncated", "format_error")
                    for n in (1, 16, 32)]
        assert min(score(h, r) for r in successes) >= 1 - scale > scale >= max(score(h, r) for r in failures)
        # Within a tier the old shaping still orders: the longer failure still earns more.
        assert score(h, roll(tokens=30)) > score(h, roll(tokens=3))


def test_keep_verified_successes_undoes_only_the_false_drops() -> None:
    short = {**MATH, "filters.py": MATH["filters.py"].replace(
        "def keep_rollout(rollout: Rollout) -> bool:\n    return True",
        "def keep_rollout(rollout: Rollout) -> bool:\n    return rollout.num_tokens >= 12")}
    assert short["filters.py"] != MATH["filters.py"]
    h = harness_with("keep-verified-successes", base=short)
    assert h.keep_rollout(roll("ok", tokens=4)) and not Harness(short, Path("x")).keep_rollout(roll("ok", tokens=4))
    assert not h.keep_rollout(roll("wrong", tokens=4)), "a short failure is still dropped"
    assert h.keep_rollout(roll("wrong", tokens=20))


def test_keep_verified_successes_keeps_the_live_groups_a_group_filter_drops() -> None:
    spread = {**MATH, "filters.py": MATH["filters.py"].replace(
        "def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:\n    return True",
        "def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:\n"
        "    return max(rewards) - min(rewards) < 0.5")}
    assert spread["filters.py"] != MATH["filters.py"]
    faulty, h = Harness(spread, Path("x")), harness_with("keep-verified-successes", base=spread)
    live = [roll("ok"), roll("wrong")]
    assert not faulty.keep_group(live, [1.1, 0.1]) and h.keep_group(live, [1.1, 0.1])
    # A dead group, even of successes, and a live group of failures stay the group filter's call.
    assert h.keep_group([roll("ok"), roll("ok")], [1.1, 1.1]) == faulty.keep_group([roll("ok"), roll("ok")], [1.1, 1.1])
    assert not h.keep_group([roll("wrong"), roll("wrong", text="x")], [0.1, 2.0])


def test_filters_and_curriculum() -> None:
    zv = harness_with("zero-variance-group-filter", min_std=0.0)
    assert zv.keep_group([roll(), roll()], [0.0, 0.0]) is False
    assert zv.keep_group([roll(), roll("ok")], [0.0, 1.1]) is True
    assert harness_with("zero-variance-group-filter", min_std=0.05).keep_group([roll()] * 8, [0.1] + [0.0] * 7) is False

    cut_fail, cut_ok = roll("truncated", "and", truncated=True), roll("ok", "Answer: 3", truncated=True)
    failed = harness_with("mask-truncated", mode="failed")
    assert failed.keep_rollout(cut_fail) is False and failed.keep_rollout(cut_ok) is True
    assert failed.spec.grpo["mask_truncated_completions"] is False
    every = harness_with("mask-truncated", mode="all")
    assert every.keep_rollout(cut_ok) is False and every.keep_rollout(roll()) is True
    assert every.spec.grpo["mask_truncated_completions"] is True

    echo = harness_with("echo-trap-filter", min_repeats=3)
    loop = "Answer: 5\nAnswer: 5\nAnswer: 5"
    assert echo.keep_rollout(roll(text=loop)) is False
    assert echo.keep_rollout(roll("ok", loop)) is True  # a success is never dropped
    assert echo.keep_rollout(roll(text="3 + 4 = 7. Answer: 7")) is True
    looping_agent = [Turn("user", "task")] + [Turn("assistant", "ls -la"), Turn("tool", "x")] * 3
    assert echo.keep_rollout(roll(text="", turns=looping_agent)) is False

    cur = harness_with("pass-rate-curriculum", band=[0.1, 0.9], floor=0.2)
    weights = cur.weights([TaskStats("solved", 8, 8), TaskStats("never", 8, 0), TaskStats("mid", 8, 4),
                           TaskStats("new", 1, 1)])
    assert weights == {"solved": 0.2, "never": 0.2, "mid": 1.0, "new": 1.0}
    # Over a curriculum that starves the band, the band is lifted back to the mean weight.
    starving = {**MATH, "curriculum.py": (FAULT_CASES_DIR / "math-curriculum-starves-mid" / "harness" /
                                          "curriculum.py").read_text()}
    stats = [TaskStats("solved", 8, 8), TaskStats("mid", 8, 4), TaskStats("new", 0, 0), TaskStats("new2", 0, 0)]
    assert Harness(starving, Path("x")).weights(stats)["mid"] == 0.05
    lifted = harness_with("pass-rate-curriculum", base=starving, band=[0.1, 0.9], floor=0.2).weights(stats)
    assert lifted == pytest.approx({"solved": 0.2, "mid": (1 + 0.05 + 1 + 1) / 4, "new": 1.0, "new2": 1.0})


def _agent(*actions: str, kind: str = "wrong", flags=(), observations: str = "ok") -> Rollout:
    turns = [Turn("user", "Fix the bug in calc.py")]
    for a in actions:
        turns += [Turn("assistant", a), Turn("tool", observations)]
    return roll(kind, "", marker=False, turns=turns, flags=flags)


def test_swe_behaviour_skills() -> None:
    sbe = harness_with("search-before-edit", weight=0.1)
    assert sbe.reward(_agent("grep -n add calc.py", "sed -i 's/-/+/' calc.py"))["search_before_edit"] == 1.0
    assert sbe.reward(_agent("sed -i 's/-/+/' calc.py", "grep -n add calc.py"))["search_before_edit"] == 0.0
    assert sbe.reward(_agent("cat calc.py"))["search_before_edit"] == 0.0  # never edited

    ett = harness_with("edit-then-test", weight=0.15)
    assert ett.reward(_agent("cat calc.py", "sed -i 's/-/+/' calc.py", "python -m pytest -q"))["edit_then_test"] == 1.0
    assert ett.reward(_agent("pytest", "sed -i 's/-/+/' calc.py"))["edit_then_test"] == 0.0
    both = {**PLAIN}  # the math seed's clean-finish bonus would add 0.1 to every failure here
    for name, params in (("search-before-edit", {"weight": 0.1}), ("edit-then-test", {"weight": 0.15})):
        both.update(LIB.get(name).render(both, params))
    h = Harness(both, Path("x"))
    good_fail = _agent("grep -rn add .", "sed -i 's/-/+/' calc.py", "pytest")
    assert score(h, good_fail) == pytest.approx(0.25) and score(h, _agent("ls")) == 0.0
    assert score(h, _agent("sed -i 's/-/+/' calc.py", kind="ok")) > score(h, good_fail)

    ab = harness_with("abandonment-filter", max_turns=3)
    assert ab.keep_rollout(_agent("ls", "cat calc.py")) is False
    assert ab.keep_rollout(_agent("ls", "sed -i 's/a/b/' calc.py")) is True
    assert ab.keep_rollout(_agent("ls", kind="ok")) is True
    assert ab.keep_rollout(roll()) is True  # single-turn: not an agent trajectory

    tp = harness_with("tampering-penalty", weight=1.0)
    assert tp.reward(_agent("sed -i 's/assert/#/' tests/test_calc.py"))["tampering"] == -1.0
    assert tp.reward(_agent("cat > conftest.py <<EOF"))["tampering"] == -1.0
    assert tp.reward(roll("tampering", "diff"))["tampering"] == -1.0
    assert tp.reward(_agent("cat tests/test_calc.py", "sed -i 's/-/+/' calc.py"))["tampering"] == 0.0
    patch = "diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n"
    assert tp.reward(roll(text=patch))["tampering"] == -1.0


def test_truncation_skills() -> None:
    es = harness_with("error-streak-truncation", max_errors=2)
    err = "Traceback (most recent call last):\n  File x\nNameError: name 'y' is not defined"
    turns = [Turn("user", "Fix the error in x.py"), Turn("assistant", "python x.py"), Turn("tool", err),
             Turn("assistant", "python x.py")]
    assert es.stop(turns) is None
    assert es.stop(turns + [Turn("tool", "bash: foo: command not found")]) == "consecutive_errors"
    assert es.stop(turns + [Turn("tool", "ok"), Turn("assistant", "ls"), Turn("tool", err)]) is None

    idle = harness_with("idle-turn-truncation", max_idle_turns=20)
    wander = [Turn("user", "task")] + [t for _ in range(19) for t in (Turn("assistant", "ls"), Turn("tool", "."))]
    assert idle.stop(wander) is None
    assert idle.stop(wander + [Turn("assistant", "cat x.py")]) == "no_progress"
    assert idle.stop(wander[:10] + [Turn("assistant", "sed -i 's/a/b/' x")] + wander[10:] + [Turn("assistant", "ls")]) is None


def test_set_yaml_key_keeps_comments_and_layout() -> None:
    text = "# top comment\ngrpo:\n  beta: 0.0  # no KL\n  lr: 1\nreward_weights:\n  correct: 1.0\n"
    out = set_yaml_key(text, "reward_weights.partial", 0.1)
    assert out.startswith("# top comment\n") and "# no KL" in out
    assert yaml.safe_load(out) == {"grpo": {"beta": 0.0, "lr": 1}, "reward_weights": {"correct": 1.0, "partial": 0.1}}
    out = set_yaml_key(out, "grpo.beta", 0.04)
    assert yaml.safe_load(out)["grpo"]["beta"] == 0.04 and out.startswith("# top comment")
    assert yaml.safe_load(set_yaml_key("a: {b: 1}\n", "a.c", True)) == {"a": {"b": 1, "c": True}}
    assert yaml.safe_load(set_yaml_key("x: 1\n", "new.deep.key", "v")) == {"x": 1, "new": {"deep": {"key": "v"}}}
    with pytest.raises(SkillError):
        set_yaml_key("a: 1\n", "a.b", 2)


# ---------------------------------------------------------------- learned skills


def test_save_learned_overrides_the_shipped_skill(tmp_path: Path) -> None:
    skill = LIB.get("partial-credit-format")
    first = {"run": "default", "round": 2, "backtest": "bt-1", "commit": "abc123", "domain": "math",
             "note": "dead groups 0.62 -> 0.31"}
    saved = save_learned(tmp_path, skill, "validated", first)
    assert saved.source == "workspace" and saved.status == "validated" and saved.evidence == (first,)
    folder = tmp_path / "skills" / "partial-credit-format"
    assert {p.name for p in folder.iterdir()} == {"skill.yaml", "README.md", "reward.py.j2"}

    lib = SkillLibrary.load(tmp_path)
    assert lib.get("partial-credit-format").status == "validated"
    assert lib.get("partial-credit-format").source == "workspace" and len(lib) == len(LIB)
    assert SkillLibrary.load(None).get("partial-credit-format").status == "seed"  # shipped copy untouched
    # Rendering from the learned copy is the same intervention.
    assert lib.get("partial-credit-format").render(MATH, {"weight": 0.1}) == skill.render(MATH, {"weight": 0.1})

    again = save_learned(tmp_path, skill, "failed", {"round": 3, "domain": "math", "note": "held-out fell"})
    assert again.status == "failed" and [e.get("round") for e in again.evidence] == [2, 3]
    with pytest.raises(SkillError, match="status"):
        save_learned(tmp_path, skill, "great", {})
    with pytest.raises(SkillError, match="evidence key"):
        save_learned(tmp_path, skill, "seed", {"colour": "red"})

    # A broken workspace skill is skipped and named, not fatal.
    bad = tmp_path / "skills" / "broken"
    bad.mkdir()
    (bad / "skill.yaml").write_text("name: broken\nsummary: x\n")
    lib = SkillLibrary.load(tmp_path)
    assert "broken" not in lib and any("broken" in e for e in lib.errors)


def test_parse_rejects_bad_skills(tmp_path: Path) -> None:
    folder = tmp_path / "zero-variance-group-filter"
    shutil.copytree(SKILLS_DIR / "zero-variance-group-filter", folder)
    raw = yaml.safe_load((folder / "skill.yaml").read_text())
    for change, message in [({"trigger": {"probe": "x", "op": "!=", "value": 1}}, "trigger.op"),
                            ({"status": "great"}, "status"),
                            ({"intervention": [{"file": "../evil.py", "template": "filters.py.j2"}]}, "not a harness file"),
                            ({"intervention": [{"file": "filters.py", "template": "missing.j2"}]}, "not found"),
                            ({"name": "other"}, "differs from its folder"),
                            ({"colour": 1}, "unknown key"),
                            ({"trigger": [{"probe": "x", "op": ">", "value": True}]}, r"trigger\[0\]\.value"),
                            ({"intervention": [{"file": "filters.py"}]}, r"intervention\[0\]: an edit is"),
                            ({"grid": {"min_std": []}}, "grid.min_std: must not be empty"),
                            ({"validation": {"margin": None}}, "validation.margin"),
                            ({"default_on": 1}, "default_on")]:
        (folder / "skill.yaml").write_text(yaml.safe_dump({**raw, **change}))
        with pytest.raises(SkillError, match=message) as caught:
            parse_skill(folder)
        assert str(caught.value).startswith(f"{folder / 'skill.yaml'}: ")  # every message names the file


# ---------------------------------------------------------------- CLI


def test_skills_cli(tmp_path: Path) -> None:
    from evotrainer.cli.main import app

    cli = CliRunner()
    res = cli.invoke(app, ["skills", "list"], env=ENV)
    assert res.exit_code == 0, res.output
    assert f"{len(LIB)} skill(s)" in res.stdout and "partial-credit-format" in res.stdout
    assert "judge-step-attribution (off)" in res.stdout
    res = cli.invoke(app, ["skills", "list", "--domain", "math"], env=ENV)
    assert "partial-credit-format" in res.stdout and "search-before-edit" not in res.stdout
    assert cli.invoke(app, ["skills", "list", "--status", "nope"], env=ENV).exit_code != 0

    res = cli.invoke(app, ["skills", "show", "edit-then-test"], env=ENV)
    assert res.exit_code == 0 and "0.15" in res.stdout and "reward_weights.edit_then_test" in res.stdout
    assert "README.md" in res.stdout
    res = cli.invoke(app, ["skills", "show", "nope"], env=ENV)
    assert res.exit_code == 2 and "no skill named" in res.stderr

    res = cli.invoke(app, ["skills", "search", "dynamic sampling"], env=ENV)
    assert res.exit_code == 0 and "zero-variance-group-filter" in res.stdout and "1 skill(s)" in res.stdout
    res = cli.invoke(app, ["skills", "search", "turns", "--domain", "swe"], env=ENV)
    assert "idle-turn-truncation" in res.stdout and "partial-credit-format" not in res.stdout

    save_learned(tmp_path, LIB.get("overlong-penalty"), "validated", {"run": "r", "round": 1, "backtest": "b1"})
    res = cli.invoke(app, ["skills", "list", "--status", "validated", "--workdir", str(tmp_path)], env=ENV)
    assert res.exit_code == 0 and "1 skill(s)" in res.stdout and "overlong-penalty *" in res.stdout
    res = cli.invoke(app, ["skills", "show", "overlong-penalty", "-w", str(tmp_path)], env=ENV)
    assert "evidence" in res.stdout and "b1" in res.stdout and "workspace" in res.stdout
