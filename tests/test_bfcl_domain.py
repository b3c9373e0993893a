"""The bfcl domain on the real bfcl-eval data: loading, splits, gold answers, the AST reader and the check."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest
from factories import make_rollout

from evotrainer.domains import DomainError, get_domain, resolve
from evotrainer.domains.bfcl import CATEGORIES, VERSION_PREFIX, BfclDomain, wheel_data_dir
from evotrainer.domains.bfcl_parse import MAX_DEPTH, parse_calls

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None,
                                reason="needs the bfcl-eval wheel's data: pip install --no-deps bfcl-eval==2026.3.23")

# Measured on bfcl-eval 2026.3.23: tasks kept per category, and the entries whose ground truth
# contradicts its own docs (docs/domains-bfcl.md explains each).
KEPT = {"simple": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 198, "irrelevance": 240,
        "live_simple": 256, "live_multiple": 1044, "live_parallel": 16, "live_parallel_multiple": 24,
        "live_irrelevance": 884, "live_relevance": 16}
EXCLUDED = {"parallel_multiple_21", "parallel_multiple_94",
            "live_simple_106-63-0", "live_simple_112-68-0", "live_multiple_507-149-4", "live_multiple_552-153-1",
            "live_multiple_595-158-1", "live_multiple_596-158-2", "live_multiple_731-167-2",
            "live_multiple_733-167-4", "live_multiple_735-167-6", "live_multiple_862-181-3",
            "live_multiple_964-207-0"}


@pytest.fixture(scope="module")
def dom() -> BfclDomain:
    return BfclDomain()


@pytest.fixture(scope="module")
def by_id(dom: BfclDomain) -> dict:
    return {t.task_id: t for t in dom.all_tasks()}


def _ok(dom, task, text, truncated=False):
    return dom.check(task, text, truncated)


# ---------------------------------------------------------------- data, ids, splits


def test_counts_ids_and_exclusions_match_the_wheel(dom: BfclDomain) -> None:
    counts = Counter(t.meta["category"] for t in dom.all_tasks())
    assert dict(counts) == KEPT
    assert set(dom.excluded) == EXCLUDED
    assert all(reasons and all(isinstance(r, str) and r for r in reasons) for reasons in dom.excluded.values())
    data = wheel_data_dir()
    for cat, (stem, _, _) in CATEGORIES.items():
        ids = [json.loads(line)["id"] for line in (data / f"{VERSION_PREFIX}_{stem}.json").read_text().splitlines()]
        kept = [t.task_id for t in dom.all_tasks() if t.meta["category"] == cat]
        assert kept == [i for i in ids if i not in EXCLUDED]  # the dataset's own ids, in its order
    assert len({t.task_id for t in dom.all_tasks()}) == len(dom.all_tasks())


def test_exclusion_reasons_name_the_contradiction(dom: BfclDomain) -> None:
    assert any("not a parameter in the docs" in r for r in dom.excluded["live_multiple_862-181-3"])
    assert any("allows no value (an empty list)" in r for r in dom.excluded["live_simple_106-63-0"])
    assert any("allows no value (only leaving it out)" in r for r in dom.excluded["live_multiple_507-149-4"])
    assert any("no allowed value is a array" in r for r in dom.excluded["parallel_multiple_94"])
    assert any("required by the docs, absent" in r for r in dom.excluded["live_multiple_964-207-0"])
    assert any("no allowed value is a string (True)" in r for r in dom.excluded["live_multiple_552-153-1"])


def test_split_is_a_stable_hash_of_the_id(dom: BfclDomain) -> None:
    tasks = dom.all_tasks()
    heldout = [t for t in tasks if t.split == "heldout"]
    assert 0.15 < len(heldout) / len(tasks) < 0.25
    again = {t.task_id: t.split for t in BfclDomain(categories=["simple"], heldout_fraction=0.2).all_tasks()}
    assert all(again[t.task_id] == t.split for t in tasks if t.meta["category"] == "simple")
    bigger = {t.task_id: t.split for t in BfclDomain(categories="simple", heldout_fraction=0.5).all_tasks()}
    assert all(bigger[t.task_id] == "heldout" for t in tasks if t.split == "heldout" and t.task_id in bigger)


def test_tasks_are_deterministic_and_disjoint(dom: BfclDomain) -> None:
    a = dom.tasks("train", 50, seed=3)
    assert [t.task_id for t in a] == [t.task_id for t in dom.tasks("train", 50, seed=3)]
    assert [t.task_id for t in a] != [t.task_id for t in dom.tasks("train", 50, seed=4)]
    assert all(t.split == "train" for t in a) and len({t.task_id for t in a}) == 50
    held = dom.tasks("heldout", 10**6, seed=0)
    assert not {t.task_id for t in held} & {t.task_id for t in dom.tasks("train", 10**6, seed=0)}
    assert len(held) + len(dom.tasks("train", 10**6, seed=0)) == len(dom.all_tasks())
    with pytest.raises(ValueError):
        dom.tasks("test", 1, 0)


def test_options_through_the_registry() -> None:
    d = get_domain("bfcl", categories="simple,live_relevance", max_prompt_chars=1500)
    cats = Counter(t.meta["category"] for t in d.all_tasks())
    assert set(cats) <= {"simple", "live_relevance"} and d.too_long > 0
    assert all(len(t.prompt) <= 1500 for t in d.all_tasks())
    assert {t.level for t in get_domain("bfcl", levels=[2]).all_tasks()} == {2}
    assert resolve("bfcl").seed_harness().name == "bfcl"
    assert (resolve("bfcl").seed_harness() / "harness.yaml").is_file()
    with pytest.raises(DomainError, match="not one of"):
        get_domain("bfcl", categories=["simple", "multi_turn_base"])
    with pytest.raises(DomainError):
        get_domain("bfcl", source="/nonexistent/folder")


def test_prompt_shows_docs_conversation_and_format(by_id: dict) -> None:
    t = by_id["simple_python_0"]
    assert "calculate_triangle_area" in t.prompt and '"required": ["base", "height"]' in t.prompt
    assert "User: Find the area of a triangle with a base of 10 units" in t.prompt
    assert "[func_name1(param1=value1, param2=value2)" in t.prompt
    live = by_id["live_relevance_0-0-0"]
    assert "generate_image" in live.prompt and "search_engine.query" in live.prompt


# ---------------------------------------------------------------- gold answers


def test_every_gold_answer_succeeds(dom: BfclDomain) -> None:
    checked = Counter()
    for t in dom.all_tasks():
        if t.meta["check"] == "relevance":
            continue
        out = dom.check(t, t.answer, False)
        assert out.success and out.score == 1.0, (t.task_id, t.answer, out)
        checked[t.meta["check"]] += 1
    assert checked == {"ast": 2338, "irrelevance": 1124}


def test_undocumented_but_optional_ground_truth_params_are_kept(dom, by_id) -> None:
    """parallel_multiple_12 lists `permeability` (allowed: "" or 0.1), which its docs lack: the task
    stays, the parameter can only be left out."""
    t = by_id["parallel_multiple_12"]
    assert "permeability" not in t.answer and dom.check(t, t.answer, False).success
    assert not dom.check(t, t.answer.replace("distance=3.0", "distance=3.0, permeability=0.1"), False).success


def test_gold_answers_are_in_call_syntax(by_id: dict) -> None:
    assert by_id["simple_python_0"].answer == "[calculate_triangle_area(base=10, height=5)]"
    assert by_id["parallel_0"].answer == ("[spotify.play(artist='Taylor Swift', duration=20), "
                                          "spotify.play(artist='Maroon 5', duration=15)]")
    assert by_id["live_multiple_1038-265-0"].answer.endswith("start_date=None)]")


# ---------------------------------------------------------------- the reader


@pytest.mark.parametrize("text,names", [
    ("[f(a=1), g.h(b='x')]", ["f", "g.h"]),
    ("f(a=1)", ["f"]),
    ("f(a=1), g(b=2)", ["f", "g"]),
    ("```python\n[f(a=1)]\n```", ["f"]),
    ("```\n[f(a=-1.5)]\n```", ["f"]),
    ("Sure, here you go: [f(a=[1, (2, 3)], b={'k': None})] Hope it helps.", ["f"]),
    ("`[f(a=True)]`", ["f"]),
    ("[]", []),
])
def test_reader_accepts(text: str, names: list) -> None:
    parsed = parse_calls(text)
    assert parsed.calls is not None, parsed
    assert [c.name for c in parsed.calls] == names


@pytest.mark.parametrize("text,error", [
    ("[f(a=x)]", "bad_value:Name"),
    ("[f(a=g(b=1))]", "bad_value:Call"),
    ("[f(a=1+2)]", "bad_value:BinOp"),
    ("[f(a=lambda: 1)]", "bad_value:Lambda"),
    ("[f(a=f'{x}')]", "bad_value:JoinedStr"),
    ("[f(a=1j)]", "bad_value:complex"),
    ("[f(a=b'x')]", "bad_value:bytes"),
    ("[f(a=...)]", "bad_value:ellipsis"),
    ("[f(a=-True)]", "bad_value:UnaryOp"),
    ("[f(a=[1][0])]", "bad_value:Subscript"),
    ("[f(1)]", "positional_arg"),
    ("[f(**{'a': 1})]", "star_kwargs"),
    ("[f(a=1, a=2)]", "duplicate_kwarg"),
    ("[f(a={**d})]", "bad_value:DictUnpack"),
    ("[f(a=1), 3]", "mixed_list"),
    ("[x[0](a=1)]", "bad_name"),
    ("[f(a=1" , "syntax_error"),
    ("I cannot help with that.", "syntax_error"),
    ("'just a string'", "no_calls"),
    ("[1, 2, 3]", "no_calls"),
])
def test_reader_rejects(text: str, error: str) -> None:
    parsed = parse_calls(text)
    assert parsed.calls is None and parsed.error == error, parsed


def test_reader_never_evaluates(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for text in (f"[f(a=open({str(marker)!r}, 'w'))]",
                 f"[f(a=__import__('os').system('touch {marker}'))]",
                 f"[f(a=(lambda: __import__('pathlib').Path({str(marker)!r}).touch())())]",
                 f"[__import__('os').system('touch {marker}')]"):
        parsed = parse_calls(text)
        assert parsed.calls is None
    assert not marker.exists()
    assert parse_calls("[f(a=__import__('os'))]").error == "dunder"
    assert parse_calls("[f.__class__(a=1)]").error == "dunder"


def test_reader_bounds_size_and_depth() -> None:
    deep = "[f(a=" + "[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2) + ")]"
    assert parse_calls(deep).error == "too_deep"
    assert parse_calls("[f(a=" + "[" * 400 + "]" * 400 + ")]").calls is None  # Python's own limit
    assert parse_calls("[" + ", ".join("f(a=1)" for _ in range(100)) + "]").error == "too_many_calls"
    assert parse_calls("[f(a='" + "x" * 30_000 + "')]").error == "too_long"
    assert parse_calls("```python\n" + "a" * 10**6).error == "too_long"
    assert parse_calls("[" + "f(a=1)," * 2800 + "]").error == "too_long"  # node count
    assert parse_calls("[f(a=" + "-" * 19_000 + "1)]").calls is None
    assert parse_calls("[f(a=" + "9" * 5000 + ")]").calls is None
    assert parse_calls("[f(a=" + "{'k': " * 300 + "1" + "}" * 300 + ")]").calls is None


# ---------------------------------------------------------------- the AST check


def test_simple_values_types_and_optional_params(dom, by_id) -> None:
    t = by_id["simple_python_0"]  # base, height required ints; unit optional ("units" or omitted)
    assert _ok(dom, t, "[calculate_triangle_area(base=10, height=5, unit='units')]").success
    assert _ok(dom, t, "calculate_triangle_area(height=5, base=10)").success
    for wrong in ("[calculate_triangle_area(base=10, height=6)]",
                  "[calculate_triangle_area(base=10)]",
                  "[calculate_triangle_area(base=10, height=5, unit='cm')]",
                  "[calculate_triangle_area(base=10, height=5, color='red')]",
                  "[calculate_triangle_area(base=10.0, height=5)]",  # a float is no integer
                  "[calculate_triangle_area(base='10', height=5)]",
                  "[triangle_area(base=10, height=5)]",
                  "[calculate_triangle_area(base=10, height=5), calculate_triangle_area(base=10, height=5)]"):
        out = _ok(dom, t, wrong)
        assert not out.success and out.kind == "wrong", (wrong, out)
    assert _ok(dom, t, "[calculate_triangle_area(base=10, height=5), x(a=1)]").score == 0.5


def test_strings_normalize_like_bfcl(dom, by_id) -> None:
    t = by_id["simple_python_89"]  # school: "Bluebird High School" / "Bluebird HS"
    base = "[db_fetch_records(database_name='StudentDB', table_name='students', conditions={cond})]"
    assert _ok(dom, t, base.format(cond="{'department': 'Science', 'school': 'Bluebird High School'}")).success
    assert _ok(dom, t, base.format(cond="{'department': 'science', 'school': 'bluebird-high_school.'}")).success
    assert not _ok(dom, t, base.format(cond="{'department': 'Science', 'school': 'Bluebird Elementary'}")).success
    assert not _ok(dom, t, base.format(cond="{'department': 'Science'}")).success  # school may not be left out
    assert not _ok(dom, t, base.format(cond="{'department': 'Science', 'school': 'Bluebird HS', 'x': 1}")).success
    # the allowed-value lists themselves are no answer
    assert not _ok(dom, t, base.format(cond="{'department': ['Science'], 'school': ['Bluebird HS']}")).success
    assert not _ok(dom, t, base.format(cond="'Science'")).success


def test_int_for_float_and_tuple_for_list(dom, by_id) -> None:
    t = by_id["simple_python_13"]  # interval: array of float, [1.0, 3.0]
    assert _ok(dom, t, "[calculate_area_under_curve(function='x**2', interval=[1, 3])]").success
    assert _ok(dom, t, "[calculate_area_under_curve(function='x**2', interval=(1.0, 3.0))]").success
    assert not _ok(dom, t, "[calculate_area_under_curve(function='x**2', interval=[3, 1])]").success
    assert not _ok(dom, t, "[calculate_area_under_curve(function='x**2', interval=[True, 3])]").success
    assert not _ok(dom, t, "[calculate_area_under_curve(function='x**2', interval=['1', '3'])]").success
    t = by_id["simple_python_37"]  # stops: either order is listed
    for stops in ("['Santa Barbara', 'Monterey']", "['Monterey', 'Santa Barbara']"):
        text = f"[route.estimate_time(start_location='San Francisco', end_location='Los Angeles', stops={stops})]"
        assert _ok(dom, t, text).success
    assert not _ok(dom, t, "[route.estimate_time(start_location='San Francisco', end_location='Los Angeles', "
                           "stops=['Monterey'])]").success


def test_list_of_dicts_and_booleans(dom, by_id) -> None:
    t = by_id["simple_python_96"]
    good = ("[database.query(table='user', conditions=[{'field': 'age', 'operation': '>', 'value': '25'}, "
            "{'field': 'job', 'operation': '=', 'value': 'engineer'}])]")
    assert _ok(dom, t, good).success
    assert not _ok(dom, t, good.replace("'25'", "25")).success
    assert not _ok(dom, t, good.replace("'>'", "'<'")).success
    assert not _ok(dom, t, "[database.query(table='user', conditions=[{'field': 'age', 'operation': '>', "
                           "'value': '25'}])]").success
    t = by_id["multiple_0"]
    assert _ok(dom, t, "[triangle_properties.get(side1=5, side2=4, side3=3, get_area=True)]").success
    assert not _ok(dom, t, "[triangle_properties.get(side1=5, side2=4, side3=3, get_area=1)]").success
    assert not _ok(dom, t, "[triangle_properties.get(side1=5, side2=4, side3=3, get_area=False)]").success


def test_multiple_needs_the_right_function(dom, by_id) -> None:
    t = by_id["multiple_0"]
    others = [n for n in json.loads(t.meta["functions"]) if n["name"] != "triangle_properties.get"]
    assert others
    wrong = f"[{others[0]['name']}(side1=5, side2=4, side3=3)]"
    assert not _ok(dom, t, wrong).success


def test_parallel_any_order_no_duplicates(dom, by_id) -> None:
    t = by_id["parallel_0"]
    a, b = "spotify.play(artist='Taylor Swift', duration=20)", "spotify.play(artist='Maroon 5', duration=15)"
    assert _ok(dom, t, f"[{a}, {b}]").success and _ok(dom, t, f"[{b}, {a}]").success
    dup = _ok(dom, t, f"[{a}, {a}]")
    assert not dup.success and dup.score == 0.5
    missing = _ok(dom, t, f"[{a}]")
    assert not missing.success and missing.score == 0.5 and "wrong_count" in missing.flags
    extra = _ok(dom, t, f"[{a}, {b}, {b}]")
    assert not extra.success and extra.score == pytest.approx(2 / 3)
    swapped = "spotify.play(artist='Taylor Swift', duration=15), spotify.play(artist='Maroon 5', duration=20)"
    assert _ok(dom, t, f"[{swapped}]").score == 0.0


def test_parallel_multiple_matching(dom, by_id) -> None:
    t = by_id["parallel_multiple_0"]
    a = "math_toolkit.sum_of_multiples(lower_limit=1, upper_limit=1000, multiples=[3, 5])"
    b = "math_toolkit.product_of_primes(count=5)"
    assert _ok(dom, t, f"[{b}, {a}]").success
    assert not _ok(dom, t, f"[{a}, {a}]").success


def test_gaming_every_function_with_every_value_fails(dom: BfclDomain) -> None:
    """Emit, for each function, one call per combination of first/last allowed values: never a success."""
    for t in dom.all_tasks():
        if t.meta["check"] != "ast" or t.meta["category"] not in ("multiple", "parallel_multiple"):
            continue
        gt = json.loads(t.meta["ground_truth"])
        calls = []
        for entry in gt:
            ((name, allowed),) = entry.items()
            for pick in (0, -1):
                kwargs = ", ".join(f"{k}={v[pick]!r}" for k, v in allowed.items() if v and v[pick] != "")
                calls.append(f"{name}({kwargs})")
        for f in json.loads(t.meta["functions"]):
            calls.append(f"{f['name']}()")
        out = dom.check(t, "[" + ", ".join(calls) + "]", False)
        assert not out.success, t.task_id


def test_hedging_between_answers_fails(dom, by_id) -> None:
    t = by_id["simple_python_0"]
    right, wrong = "[calculate_triangle_area(base=10, height=5)]", "[calculate_triangle_area(base=5, height=10)]"
    for text in (f"{wrong} or {right}", f"{wrong}\n{right}", f"{right} if x else {wrong}", f"({wrong}, {right})",
                 f"```python\n{right}\n```\n```python\n{wrong}\n```"):
        assert not dom.check(t, text, False).success, text
    assert dom.check(t, f"```python\n{wrong}\n```\nOn second thought:\n```python\n{right}\n```", False).success


def test_malformed_empty_truncated_and_tampering(dom, by_id) -> None:
    t = by_id["simple_python_0"]
    assert _ok(dom, t, "").kind == "empty" and _ok(dom, t, "  \n").kind == "empty"
    assert _ok(dom, t, "The area is 25.").kind == "format_error"
    assert _ok(dom, t, "[calculate_triangle_area(base=10, height=5").kind == "format_error"
    assert _ok(dom, t, "[calculate_triangle_area(base=10, height=5", truncated=True).kind == "truncated"
    assert _ok(dom, t, "[calculate_triangle_area(base=10, height=5)] and more", truncated=True).success
    assert _ok(dom, t, "[calculate_triangle_area(base=x, height=5)]").kind == "format_error"
    assert _ok(dom, t, "[]").kind == "wrong"
    out = _ok(dom, t, "[calculate_triangle_area(base=__import__('os').getpid(), height=5)]")
    assert out.kind == "tampering" and not out.success
    assert _ok(dom, t, "[calculate_triangle_area(base=10, height=5, **{'unit': 'units'})]").kind == "format_error"
    for odd in (None, 5, "\x00" * 10, "[" * 100_000, "🙂" * 1000):
        out = dom.check(t, odd, False)  # type: ignore[arg-type]
        assert not out.success


def test_a_task_from_elsewhere_is_an_error_not_a_crash(dom, by_id) -> None:
    from evotrainer.domains import Task

    foreign = Task("x", "bfcl", "train", 0, "p", "a", {})
    assert dom.check(foreign, "[f(a=1)]", False).kind == "error"
    t = by_id["simple_python_0"]
    broken = Task(t.task_id, "bfcl", t.split, 0, t.prompt, t.answer, {**t.meta, "ground_truth": "{not json"})
    assert dom.check(broken, t.answer, False).kind == "error"


def test_irrelevance(dom, by_id) -> None:
    t = next(x for x in by_id.values() if x.meta["category"] == "irrelevance")
    name = json.loads(t.meta["functions"])[0]["name"]
    assert _ok(dom, t, "None of these functions can answer that.").success
    assert _ok(dom, t, "[]").success
    assert _ok(dom, t, "```python\n[]\n```").success
    assert not _ok(dom, t, "").success
    assert _ok(dom, t, "I would need more information and", truncated=True).kind == "truncated"
    for call in (f"[{name}()]", f"[{name}(x=1), {name}(y=2)]", "[anything(a=1)]", f"[{name}(a=b)]",
                 f"I think [{name}(a=1)] is the answer", f"{name}(a=g())"):
        out = _ok(dom, t, call)
        assert not out.success and "made_call" in out.flags, call
    assert _ok(dom, t, f"[{name}(a=__import__('os'))]").kind == "tampering"
    t = by_id["live_irrelevance_764-274-0"]  # documents __book_meeting_room: calling it is a call, no tampering
    out = _ok(dom, t, "[__book_meeting_room(room='A')]")
    assert not out.success and out.kind == "wrong" and "made_call" in out.flags


def test_relevance(dom, by_id) -> None:
    t = by_id["live_relevance_0-0-0"]
    docs = {f["name"]: f for f in json.loads(t.meta["functions"])}
    req = docs["generate_image"]["parameters"]["required"]
    args = ", ".join(f"{r}='a masked woman'" for r in req)
    assert _ok(dom, t, f"[generate_image({args})]").success
    assert _ok(dom, t, "[search_engine.query(prompt='Alphonse Mucha')]").success
    assert not _ok(dom, t, "[search_engine.query()]").success
    assert not _ok(dom, t, "[search_engine.query(prompt='x', colour='red')]").success
    assert not _ok(dom, t, "[search_engine.query(prompt=3)]").success
    assert not _ok(dom, t, "[paint(prompt='x')]").success
    assert not _ok(dom, t, "[]").success
    assert _ok(dom, t, "I cannot do that.").kind == "format_error"


def test_seed_harness_loads_and_rewards_real_outcomes(dom, by_id) -> None:
    from evotrainer.harness import load_harness

    harness = load_harness(resolve("bfcl").seed_harness())
    assert harness.spec.grpo["max_completion_length"] == 160
    t = by_id["parallel_0"]
    assert harness.render_prompt(t.prompt) == t.prompt

    def reward(text: str) -> float:
        out = dom.check(t, text, False)
        r = make_rollout("r", task_id=t.task_id, domain="bfcl", prompt=t.prompt, completion=text, outcome=out,
                         num_tokens=10)
        return harness.training_reward(harness.reward(r))

    assert reward(t.answer) == pytest.approx(1.1)
    assert reward("[spotify.play(artist='Taylor Swift', duration=20)]") == pytest.approx(0.1)
    assert reward("I would play them.") == 0.0


def test_shipped_config_builds_the_domain() -> None:
    from evotrainer.config import load_config
    from evotrainer.domains import build_domain
    from evotrainer.paths import CONFIGS_DIR

    cfg = load_config(CONFIGS_DIR / "bfcl.yaml")
    d = build_domain(cfg.domain)
    assert d.name == "bfcl" and len(d.tasks("heldout", cfg.domain.heldout_size, 0)) == cfg.domain.heldout_size
    assert all(len(t.prompt) <= 4000 for t in d.all_tasks()) and len(d.all_tasks()) == 3478 - 679
