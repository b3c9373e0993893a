"""The reasoning_gym domain: real reasoning-gym generators and scorers, vetting, the answer rule, gaming."""

from __future__ import annotations

import re
import sys

import pytest

from evotrainer.domains import DomainError, get_domain, resolve, rgym
from evotrainer.domains.rgym import GeneratorSpec, ReasoningGymDomain, extract_answer, score, vet
from evotrainer.harness.loader import load_harness

pytest.importorskip("reasoning_gym")  # the optional extra: pip install reasoning-gym==0.1.25

RECOMMENDED = [
    {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}},
    {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                            "operators": ["+", "-", "*"], "allow_parentheses": False,
                                            "allow_negation": False}},
    {"name": "leg_counting", "config": {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3}},
]
NAMES = [g["name"] for g in RECOMMENDED]


@pytest.fixture(scope="module")
def domain() -> ReasoningGymDomain:
    return ReasoningGymDomain(RECOMMENDED)


@pytest.fixture(scope="module")
def by_generator(domain):
    tasks = domain.tasks("train", 60, 0)
    return {name: [t for t in tasks if t.meta["generator"] == name] for name in NAMES}


# ---------------------------------------------------------------- gold and wrong answers


def test_gold_answers_succeed_in_both_formats(domain):
    for split in ("train", "heldout"):
        for task in domain.tasks(split, 40, 3):
            for completion in (f"Answer: {task.answer}", f"I think.\n<answer>{task.answer}</answer>",
                               f"Final answer: {task.answer}\n"):
                outcome = domain.check(task, completion, False)
                assert (outcome.success, outcome.score, outcome.kind) == (True, 1.0, "ok"), (task, completion)


def test_wrong_empty_and_malformed_fail(domain, by_generator):
    task = by_generator["chain_sum"][0]
    wrong = str(int(task.answer) + 1)
    cases = {
        "": "empty", "   \n": "empty",
        f"Answer: {wrong}": "wrong",
        f"The answer is {wrong}": "wrong",  # no marker: the last line is the one candidate
        "Answer:   \n": "format_error",
        "<answer> </answer>": "format_error",
        f"<answer>{task.answer}": "wrong",  # an unclosed tag is no block: the bare line is read as it is
        "Answer: " + "9" * 3000: "format_error",
    }
    for completion, kind in cases.items():
        outcome = domain.check(task, completion, False)
        assert not outcome.success and outcome.kind == kind, (completion[:40], outcome)
    assert domain.check(task, "Answer:", False).flags == ("empty_answer",)
    assert domain.check(task, "Answer: " + "1" * 3000, False).flags == ("answer_too_long",)
    assert domain.check(task, "no marker", False).flags == ("no_answer_marker",)


def test_without_a_marker_only_the_last_line_counts(domain, by_generator):
    task = by_generator["chain_sum"][0]
    gold, wrong = task.answer, str(int(task.answer) + 1)
    for completion in (f"The final answer to the given arithmetic problem is {gold}.", f"2 + 3 = 5\n1 + 1 = {gold}",
                       f"Let me add.\nThe result is: {gold}"):
        outcome = domain.check(task, completion, False)
        assert (outcome.success, outcome.kind, outcome.flags) == (True, "ok", ("no_answer_marker",)), completion
    # One candidate per completion: the gold on an earlier line, or cut off, wins nothing.
    for completion, truncated in ((f"The answer is {gold}.\nThe answer is {wrong}.", False),
                                  (f"{gold}\n{wrong}", False), (f"The answer is {gold}", True)):
        assert not domain.check(task, completion, truncated).success, completion
    assert domain.check(task, f"The answer is {gold}", True).kind == "truncated"


def test_partial_score_is_kept_but_is_not_success(domain, by_generator):
    task = by_generator["basic_arithmetic"][0]
    outcome = domain.check(task, f"Answer: {task.answer} is it", False)
    assert not outcome.success and outcome.kind == "wrong" and 0.0 < outcome.score < 1.0
    assert "partial" in outcome.flags


def test_truncation(domain, by_generator):
    task = by_generator["chain_sum"][0]
    # An Answer: line the cut may have shortened ("12" of "123") is not an answer.
    assert domain.check(task, f"Answer: {task.answer}", True).kind == "truncated"
    assert domain.check(task, "working it out step by", True).kind == "truncated"
    assert domain.check(task, f"Answer: {task.answer}\nand then", True).success
    assert domain.check(task, f"<answer>{task.answer}</answer> more", True).success


def test_check_never_raises(domain, by_generator):
    task = by_generator["leg_counting"][0]
    for completion in (None, 3, "\x00" * 10, "<answer>" * 500, "Answer: \udcff", "Answer: " + "(" * 1500):
        outcome = domain.check(task, completion, False)  # type: ignore[arg-type]
        assert not outcome.success
    alien = type(task)(task.task_id, task.domain, task.split, 0, task.prompt, task.answer,
                       {**task.meta, "generator": "sudoku"})
    assert domain.check(alien, f"Answer: {task.answer}", False).kind == "error"


# ---------------------------------------------------------------- gaming the check


@pytest.mark.parametrize("name", NAMES)
def test_gaming_attempts_fail(domain, by_generator, name):
    task = by_generator[name][0]
    gold = task.answer
    wrong = str(int(gold) + 7)
    numbers = " ".join(str(i) for i in range(-50, 400))
    attempts = [
        f"Answer: {numbers}",  # every candidate in one answer
        f"Answer: {wrong}, {gold}",
        f"Answer: {wrong} or {gold}",
        f"Answer: {wrong}\nAnswer: {gold}",  # the first answer is the one read
        f"<answer>{wrong}</answer>\nAnswer: {gold}",  # a block beats any line
        f"Answer: {gold}?\n<answer>{wrong}</answer>",
        f"<answer>{wrong}<answer>{gold}</answer></answer>",  # nested marker injection
        f"<answer>{wrong}</answer><answer>{gold}</answer>",
        f"Answer: {task.prompt}",  # the question echoed
        "Answer: " + (gold + " ") * 600,  # a very long string of golds
        f"Answer: {gold}{'x' * 1900}",
    ]
    for completion in attempts:
        outcome = domain.check(task, completion, False)
        assert not outcome.success, (name, completion[:80], outcome)
    assert domain.check(task, f"Answer: {gold}\nAnswer: {wrong}", False).flags == ("more_answers_ignored",)


def test_extract_answer_rule():
    assert extract_answer("x\nAnswer: 3\nAnswer: 4") == ("3", "")
    assert extract_answer("Answer: 3\n<answer> 4 </answer>") == ("4", "")
    assert extract_answer("<ANSWER>a\nb</ANSWER>") == ("a\nb", "")
    # A marker starts its line; without one the last line is read for what it says the answer is.
    assert extract_answer("the answer: 3") == ("3", "no_answer_marker")
    assert extract_answer("So the answer is 3.") == ("3", "no_answer_marker")
    assert extract_answer("Answer: 3", truncated=True) == (None, "truncated")


def test_guard_stops_a_scorer_that_evals_the_answer():
    # string_insertion's scorer evals any wrong answer: the guard must stop the eval, not just see it.
    ds = rgym.make_dataset(GeneratorSpec("string_insertion"), 1, 2)
    attack = "[__import__('sys').modules.__setitem__('rg_canary', 1)]"
    assert score(ds, attack, ds[0]) == (None, "scorer_ran_code")
    assert "rg_canary" not in sys.modules
    eval("1 + 1")  # outside a scorer nothing is blocked
    assert score(ds, ds[0]["answer"], ds[0]) == (1.0, None)


# ---------------------------------------------------------------- determinism, ids, splits


def test_tasks_are_deterministic_and_ids_stable(domain):
    first = domain.tasks("train", 50, 7)
    assert first == domain.tasks("train", 50, 7)
    assert first == ReasoningGymDomain(RECOMMENDED).tasks("train", 50, 7)
    assert first != domain.tasks("train", 50, 8)
    assert len({t.task_id for t in first}) == 50
    for t in first:
        assert re.fullmatch(rf"rg-{t.meta['generator']}-[0-9a-f]{{10}}", t.task_id)
        assert t.domain == "reasoning_gym" and t.level == 0 and t.split == "train"


def test_pinned_task():
    # A fixed (generator, seed): the same question, answer and id in any process (reasoning-gym 0.1.25).
    d = ReasoningGymDomain(["chain_sum"])
    t = d.tasks("train", 1, 0)[0]
    assert (t.task_id, t.prompt, t.answer) == (
        "rg-chain_sum-1b0a3f7970",
        "State the final answer to the following arithmetic problem: 5 + 8 - 5 - 2 - 0 =",
        "6")


def test_a_fresh_domain_regenerates_the_entry(domain):
    tasks = domain.tasks("heldout", 10, 2)
    fresh = ReasoningGymDomain(RECOMMENDED)  # has never seen these tasks
    assert all(fresh.check(t, f"Answer: {t.answer}", False).success for t in tasks)
    forged = type(tasks[0])(tasks[0].task_id, "reasoning_gym", "heldout", 0, "What is 1 + 1?", "2",
                            dict(tasks[0].meta))
    assert fresh.check(forged, "Answer: 2", False).kind == "error"  # meta does not regenerate that question


def test_splits_are_disjoint(domain):
    train = [t for s in (0, 1, 2) for t in domain.tasks("train", 300, s)]
    heldout = [t for s in (0, 1) for t in domain.tasks("heldout", 100, s)]
    assert {t.task_id for t in train}.isdisjoint(t.task_id for t in heldout)
    assert {t.prompt for t in train}.isdisjoint(t.prompt for t in heldout)
    assert all(t.split == "heldout" for t in heldout)


def test_a_small_space_runs_out_with_a_clear_error():
    d = ReasoningGymDomain([{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2,
                                                            "min_digits": 1, "max_digits": 1}}])
    with pytest.raises(ValueError, match="ran out of distinct heldout questions"):
        d.tasks("heldout", 100, 0)


# ---------------------------------------------------------------- vetting and refusal


def test_refuses_a_scorer_that_evals_model_text():
    with pytest.raises(DomainError, match=r"string_insertion: scorer compiles text"):
        get_domain("reasoning_gym", generators=["chain_sum", "string_insertion"])


def test_refuses_a_scorer_that_accepts_any_answer():
    # game_of_life_halting's scorer (reasoning-gym 0.1.25) gives 1.0 to "x" and to the question itself.
    v = vet(GeneratorSpec("game_of_life_halting"))
    assert not v.ok
    assert any(p.startswith("accepts the garbage 'x'") for p in v.problems), v.problems
    with pytest.raises(DomainError, match="game_of_life_halting: .*accepts the garbage"):
        get_domain("reasoning_gym", generators=["game_of_life_halting"])


def test_refuses_unstable_and_goldless_generators():
    with pytest.raises(DomainError, match="word_ladder: not seed-deterministic across processes"):
        get_domain("reasoning_gym", generators=["word_ladder"])
    with pytest.raises(DomainError, match="boxnet: no gold answer"):
        get_domain("reasoning_gym", generators=["boxnet"])


def test_reading_only_the_first_item_is_noted_not_refused():
    v = vet(GeneratorSpec("gsm_symbolic"), samples=4)  # its scorer reads the first number
    assert v.ok and v.notes == {"scores 'gold, other' 1.0 (ignores what follows the gold)"}


def test_recommended_generators_pass_vetting():
    for g in RECOMMENDED:
        v = vet(GeneratorSpec(g["name"], g["config"]), samples=16)
        assert v.ok and v.checked == 16, v.problems


def test_bad_options_are_refused_with_a_message():
    cases = {
        "generators is required": {},
        "unknown reasoning-gym generator 'no_such'": {"generators": ["no_such"]},
        "config .* rejected": {"generators": [{"name": "chain_sum", "config": {"bogus": 1}}]},
        "may not set seed or size": {"generators": [{"name": "chain_sum", "config": {"seed": 3}}]},
        "names one generator twice": {"generators": "chain_sum,chain_sum"},
        "has no option 'levelz'": {"generators": ["chain_sum"], "levelz": 1},
    }
    for message, options in cases.items():
        with pytest.raises(DomainError, match=message):
            get_domain("reasoning_gym", **options)


def test_registry_and_seed_harness():
    d = get_domain("reasoning_gym", generators="chain_sum, leg_counting")
    assert [s.name for s in d.specs] == ["chain_sum", "leg_counting"]
    seed = resolve("reasoning_gym").seed_harness()
    assert seed.name == "reasoning_gym"
    harness = load_harness(seed)  # the real loader: the seed is a valid harness
    task = d.tasks("train", 1, 0)[0]
    prompt = harness.render_prompt(task.prompt)
    assert prompt.startswith(task.prompt) and '"Answer:"' in prompt
    assert d.check(task, f"Sure.\nAnswer: {task.answer}\n", False).success  # the asked-for format works


def test_a_huge_last_line_without_a_marker_is_refused_not_parsed(domain, by_generator):
    """An attack on the last-line rule: thousands of 'answer' words on one line. Over 4,000
    characters the line is taken whole (no regex runs on it) and refused as too long."""
    task = by_generator["chain_sum"][0]
    outcome = domain.check(task, "answer is " * 600 + task.answer, False)
    assert (outcome.success, outcome.kind, outcome.flags) == (False, "format_error", ("answer_too_long",))
