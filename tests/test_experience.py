"""The experience pool: rule and LLM distillation from a real SQLite store, offline embedding
retrieval with its store cache, injection into prompts, the CLI, and the proof that lessons
never reach the loss (the real trainer, one step on the tiny model)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from factories import make_rollout, make_stored
from typer.testing import CliRunner

from evotrainer.api import Outcome
from evotrainer.chat import ReplyError
from evotrainer.domains import get_domain
from evotrainer.experience import ExperiencePool, LessonDraft, distill_store, get_distiller
from evotrainer.experience.embed import get_embedder, to_bytes
from evotrainer.experience.inject import ExperienceInjector, render_block
from evotrainer.experience.llm import parse_lessons
from evotrainer.experience.rules import RULES
from evotrainer.harness.loader import HarnessError, parse_spec
from evotrainer.store import Store, StoredRollout
from tests.llm_server import ChatServer

ENV = {"COLUMNS": "200", "EVOTRAINER_STORE_URL": None, "EVOTRAINER_WORKDIR": None}


def stored(task, text: str, outcome: Outcome, group: str, run_id: int, round_id: int, n: int,
           split: str = "train", domain: str = "math") -> StoredRollout:
    return make_stored(
        make_rollout(f"{group}-{n}", task_id=task.task_id, group_id=group, domain=domain, prompt=task.prompt,
                     completion=text, outcome=outcome, num_tokens=len(text.split()),
                     truncated=outcome.kind == "truncated",
                     meta={"level": task.level, "answer": task.answer, "split": split}),
        reward=float(outcome.success), reward_components={}, advantage=0.0, kept=True, model_version="base", seed=0,
        harness_version="h0", run_id=run_id, round_id=round_id, step=0)


def checked_group(domain, task, texts, group, run_id, round_id, split="train"):
    """Rollouts whose outcomes come from the domain's own trusted checker."""
    return [stored(task, t, domain.check(task, t, False), group, run_id, round_id, i, split, domain.name)
            for i, t in enumerate(texts)]


@pytest.fixture
def math_work(tmp_path: Path):
    """A workspace whose store holds four groups of checked math rollouts; the last is held-out."""
    math = get_domain("math", levels=(1,))
    tasks = math.tasks("train", 4, 0)
    workdir = tmp_path / "work"
    with Store.open(workdir) as store:
        run = store.get_or_create_run("r1", "math", {})
        rnd = store.start_round(run, 0, "h0", "base")
        a = [t.answer for t in tasks]
        wrong = [str(int(x) + 1) for x in a]
        groups = {
            # contrast: a marked success next to an unmarked wrong, a format error, a marked wrong
            "g1": checked_group(math, tasks[0], [f"Answer: {a[0]}", f"I think it is {wrong[0]}", "no idea",
                                                 f"Answer: {wrong[0]}"], "g1", run, rnd),
            "g2": checked_group(math, tasks[1], [f"Answer: {a[1]}", f"The result is {wrong[1]}", "hmm", ""],
                                "g2", run, rnd),
            # no success: the contrast rules must not count these failures
            "g3": checked_group(math, tasks[2], [f"The result is {wrong[2]}", f"Answer: {wrong[2]}", "so", "well"],
                                "g3", run, rnd),
            "held": checked_group(math, tasks[3], ["a", "b", "c", "d"], "held", run, rnd, split="heldout"),
        }
        store.add_rollouts(r for g in groups.values() for r in g)
    return workdir, groups


@pytest.fixture(scope="module")
def embedder():
    return get_embedder("minilm")


def kinds(groups, gid):
    return [r.rollout.outcome.kind for r in groups[gid]]


# ---------------------------------------------------------------- rules


def test_rules_distill_lessons_from_stored_rollouts(math_work):
    workdir, groups = math_work
    assert kinds(groups, "g1") == ["ok", "wrong", "format_error", "wrong"]  # the real checker's verdicts
    assert kinds(groups, "g3") == ["wrong", "wrong", "format_error", "format_error"]
    with Store.open(workdir) as store:
        [summary] = distill_store(store, get_distiller("rules", min_support=2), run_id=store.run_id("r1"))
        assert (summary.domain, summary.groups, summary.rollouts) == ("math", 3, 12)  # held-out never read
        by_kind = {d.kind: d for d in summary.drafts}
        # format errors: g1, g2, and both of g3; the four held-out ones do not count
        assert by_kind["math_format"].support == 4
        assert set(by_kind["math_format"].evidence) == {"g1-2", "g2-2", "g3-2", "g3-3"}
        # unmarked wrong answers count only where a sibling succeeded with the marker (not g3-0)
        assert set(by_kind["math_marker"].evidence) == {"g1-1", "g2-1"}
        # wrong answers where a sibling got it right (not g3's, where none did)
        assert set(by_kind["math_recheck"].evidence) == {"g1-1", "g1-3", "g2-1"}
        assert "empty" not in by_kind  # one empty reply: below min_support, so no lesson
        assert "Answer: <number>" in by_kind["math_format"].text
        stored_rows = {row["kind"]: row for row in store.lessons(domain="math")}
        assert set(stored_rows) == {"math_format", "math_marker", "math_recheck"}
        assert stored_rows["math_format"]["source"] == "rules" and stored_rows["math_format"]["support"] == 4

        # distilling again updates the same rows, with the same support
        [again] = distill_store(store, get_distiller("rules", min_support=2))
        assert (again.added, again.updated) == (0, 3)
        assert {r["kind"]: r["support"] for r in store.lessons()} == {"math_format": 4, "math_recheck": 3,
                                                                        "math_marker": 2}

        [loose] = distill_store(store, get_distiller("rules", min_support=1), domain="math")
        assert {d.kind for d in loose.drafts} == {"math_format", "math_marker", "math_recheck", "empty"}
        assert loose.added == 1


def test_rules_read_code_checker_outcomes_and_swe_edit_flags(tmp_path):
    code = get_domain("code")
    task = code.tasks("train", 1, 0)[0]
    with Store.open(tmp_path) as store:
        run = store.get_or_create_run("c", "code", {})
        rnd = store.start_round(run, 0, "h0", "base")
        texts = ["I am not sure how to write this.", "Here it is, in words only.",
                 "```python\ndef f(:\n  return 1\n```", "```python\ndef g(x:\n  pass\n```"]
        rows = checked_group(code, task, texts, "c1", run, rnd)
        assert [r.rollout.outcome for r in rows][1:3] == [Outcome(False, 0.0, "format_error"),
                                                           Outcome(False, 0.0, "wrong", ("syntax_error",))]
        # The swe edit checker's outcomes (domains/swe.py check_edit) for SEARCH text that is not in
        # the file, an edit that changes nothing, and a resolved fix.
        swe = [Outcome(False, 0.0, "patch_failed", ("format_ok", "search_not_found"))] * 2 + [
            Outcome(False, 0.0, "empty", ("format_ok", "no_change"))] * 2 + [
            Outcome(True, 1.0, "ok", ("format_ok", "f2p_all"))]
        rows += [stored(task, "edit", o, "s1", run, rnd, i, domain="swe") for i, o in enumerate(swe)]
        store.add_rollouts(rows)
        summaries = {s.domain: s for s in distill_store(store, get_distiller("rules"))}
    assert {d.kind for d in summaries["code"].drafts} == {"code_format", "code_syntax"}
    swe_kinds = {d.kind: d for d in summaries["swe"].drafts}
    assert set(swe_kinds) == {"swe_search_exact", "swe_no_change"}  # the generic `empty` rule skips no_change
    assert "SEARCH text must match the file exactly" in swe_kinds["swe_search_exact"].text


# ---------------------------------------------------------------- embeddings


def all_rule_lessons(store: Store, only: tuple[str, ...] = ()) -> None:
    store.add_lessons(LessonDraft(r.domains[0] if r.domains else "math", r.text, "rules", r.name, 3).to_row()
                      for r in RULES if not only or r.name in only)


@pytest.fixture(scope="module")
def warm_db(tmp_path_factory, embedder) -> Path:
    """A store with every rule's lesson and their embeddings cached (embedded once per module)."""
    folder = tmp_path_factory.mktemp("lessons")
    with Store.open(folder) as store:
        all_rule_lessons(store)
        ExperiencePool(store, embedder).lessons()
    return folder / "store.db"


@pytest.fixture
def lesson_store(tmp_path, warm_db):
    shutil.copy(warm_db, tmp_path / "store.db")
    with Store.open(tmp_path) as store:
        yield store


@pytest.mark.parametrize("query, domain, expected", [
    ("my patch did not apply: the search block does not match the file contents", None, "swe_search_exact"),
    ("the function I defined had the wrong name", "code", "code_entry_point"),
    ("SyntaxError: invalid syntax, unbalanced parenthesis", None, "code_syntax"),
])
def test_embedding_search_ranks_the_relevant_lesson_first(lesson_store, embedder, query, domain, expected):
    hits = ExperiencePool(lesson_store, embedder).search(query, domain=domain, k=3)
    assert hits[0].lesson.kind == expected
    assert hits[0].score > hits[1].score + 0.05
    assert domain is None or {h.lesson.domain for h in hits} == {domain}


def test_lesson_embeddings_are_cached_in_the_store_and_read_back(tmp_path, embedder):
    with Store.open(tmp_path) as store:
        all_rule_lessons(store, ("math_format", "code_timeout", "swe_search_exact", "swe_no_change"))
        ids = [r["id"] for r in store.lessons()]
        assert store.lesson_vectors(embedder.name, ids) == {}
        ExperiencePool(store, embedder).search("anything", k=1)
        cached = store.lesson_vectors(embedder.name, ids)
        assert set(cached) == set(ids)
        first = store.lessons()[0]
        np.testing.assert_allclose(np.frombuffer(cached[first["id"]], "<f4"),
                                   embedder.embed([first["text"]])[0], atol=1e-5)
        # A fresh pool reads the cache instead of re-embedding: plant the query's own vector on
        # an unrelated lesson, and that lesson now ranks first.
        query = "bake the bread at two hundred degrees for forty minutes"
        planted = next(r for r in store.lessons() if r["kind"] == "swe_no_change")
        store.put_lesson_vectors(embedder.name, embedder.dim, {planted["id"]: to_bytes(embedder.embed([query])[0])})
        hit = ExperiencePool(store, embedder).search(query, k=1)[0]
    assert hit.lesson.id == planted["id"] and hit.score == pytest.approx(1.0, abs=1e-4)


# ---------------------------------------------------------------- llm distillation

GOOD = '```json\n{"lessons": [{"text": "Finish with the final number after Answer: and nothing else.", "kind": "format_error"}]}\n```'


def test_llm_distiller_retries_a_malformed_reply_then_skips_with_a_reason(math_work):
    workdir, groups = math_work
    replies = ["Sure! Here are some lessons for you.", GOOD,  # batch 1: malformed, then good
               '{"lessons": [{"text": "short"}]}', '{"lessons": "x"}', "still nothing"]  # batch 2: skipped
    with ChatServer(replies) as server, Store.open(workdir) as store:
        distiller = get_distiller("llm", base_url=server.url, model="teacher", max_retries=2, groups_per_call=2)
        [summary] = distill_store(store, distiller)
        bodies = server.completions()
        lessons = store.lessons(source="llm")
    assert len(bodies) == 5 and {b["model"] for b in bodies} == {"teacher"}
    first = bodies[0]["messages"][0]["content"]
    # contrasted groups (g1, g2) go first; the held-out group is never shown
    assert groups["g1"][0].rollout.task_id in first and groups["g2"][0].rollout.task_id in first
    assert groups["held"][0].rollout.task_id not in first
    assert "I think it is" in first and "verified success" in first and "verified failure" in first
    retry = bodies[1]["messages"]
    assert [m["role"] for m in retry] == ["user", "assistant", "user"] and "not JSON" in retry[2]["content"]
    assert "4 characters" not in bodies[3]["messages"][-1]["content"]  # each retry names its own problem
    assert "5 characters" in bodies[3]["messages"][-1]["content"]
    assert [d.text for d in summary.drafts] == ["Finish with the final number after Answer: and nothing else."]
    assert len(lessons) == 1 and lessons[0]["kind"] == "format_error" and lessons[0]["meta"]["model"] == "teacher"
    assert set(lessons[0]["evidence"]) == {r.rollout.id for g in ("g1", "g2") for r in groups[g]
                                           if not r.rollout.outcome.success}
    assert distiller.last_errors[-1].startswith("batch 2 skipped after 3 attempts")


@pytest.mark.parametrize("reply, problem", [
    ("", "empty"), ("[1, 2]", '"lessons" list'),
    ('{"lessons": [{"text": "Answer in one line please.", "kind": "Not A Kind!"}]}', "kind"),
    ('{"lessons": [' + ",".join(['{"text": "Keep the answer short."}'] * 4) + "]}", "at most 3"),
])
def test_parse_lessons_names_what_is_wrong(reply, problem):
    with pytest.raises(ReplyError, match=problem):
        parse_lessons(reply, max_lessons=3)


# ---------------------------------------------------------------- harness key and injection


def test_harness_yaml_experience_key_is_validated():
    assert parse_spec("grpo: {}").experience == {"share": 0.0, "k": 2, "min_score": -1.0, "clip_high": None}
    assert parse_spec("experience: {share: 0.5, k: 3}").experience["share"] == 0.5
    assert parse_spec("experience: {share: 0.5, clip_high: 0.6}").experience["clip_high"] == 0.6
    for bad in ("experience: {share: 1.5}", "experience: {k: 0}", "experience: {boost: 1}", "experience: [1]",
                "experience: {clip_high: 0}", "grpo: {loss_type: cispo}\nexperience: {clip_high: 0.6}"):
        with pytest.raises(HarnessError, match="experience"):
            parse_spec(bad)


def test_guided_rows_get_their_own_upper_clip():
    from evotrainer.train.grpo import clip_column

    column = clip_column([("l1", "l2"), (), ("l3",), ()], 0.6, 0.28, "cpu")
    assert column.tolist() == pytest.approx([0.6, 0.28, 0.6, 0.28])


def test_injection_puts_lessons_into_the_chosen_share_only(lesson_store, embedder):
    pool = ExperiencePool(lesson_store, embedder)
    prompts = ["What is 9 * 12?\nGive the final answer after \"Answer:\".", "What is 3 + 4?\nGive the final answer."]
    inputs = [{"prompt": [{"role": "user", "content": p}], "task_id": f"t{i}"} for i, p in enumerate(prompts)
              for _ in range(4)]
    before = [dict(x) for x in inputs]
    injector = ExperienceInjector(pool, "math", share=0.5, k=2, seed=7)
    rows = injector.inject(inputs)
    again = ExperienceInjector(pool, "math", share=0.5, k=2, seed=7).inject(inputs)
    assert inputs == before  # the batch TRL holds is not mutated
    guided = [i for i, r in enumerate(rows) if r["experience"]]
    assert len(guided) == 4 and guided == [i for i, r in enumerate(again) if r["experience"]]
    for i, row in enumerate(rows):
        clean = inputs[i]["prompt"]
        if i not in guided:
            assert row["prompt"] == clean and injector.last_lessons[i] == ()
            continue
        ids = row["experience"]["lessons"]
        assert len(ids) == 2 and row["experience"]["prompt"] == clean
        lessons = [next(lesson for lesson in pool.lessons("math") if lesson.id == x) for x in ids]
        assert {lesson.domain for lesson in lessons} == {"math"}
        assert row["prompt"][0]["content"] == render_block(lessons) + clean[0]["content"]


# ---------------------------------------------------------------- CLI


def test_cli_distill_list_show_search(math_work):
    from evotrainer.cli.experience import app

    workdir, _ = math_work
    run = lambda *a: CliRunner().invoke(app, [*a, "--workdir", str(workdir)], env=ENV)  # noqa: E731
    res = run("distill", "--run", "r1")
    assert res.exit_code == 0, res.output
    assert "math: 12 rollouts in 3 groups -> 3 lesson(s): 3 new, 0 updated" in res.output
    res = run("list")
    assert res.exit_code == 0 and "math_format" in res.output and "math_marker" in res.output
    with Store.open(workdir) as store:
        lesson = store.lessons()[0]
    res = run("show", lesson["id"][:6])
    assert res.exit_code == 0 and lesson["text"][:30] in res.output and "g1-2" in res.output
    res = run("search", "a reply with no final number in it", "-k", "1")
    assert res.exit_code == 0 and "math_format" in res.output
    assert run("show", "zzzz").exit_code == 2
    assert run("distill", "--run", "nope").exit_code == 2
    assert run("search", "  ").exit_code == 2
    res = run("distill", "--agent", "llm", "--model", "m")  # no endpoint, no key: bad input, not a crash
    assert res.exit_code == 2 and "no API key" in res.output
    with ChatServer([GOOD]) as server:  # the three failing groups fit one request
        res = run("distill", "--agent", "llm", "--model", "m", "--base-url", server.url)
    assert res.exit_code == 0, res.output
    assert "1 lesson(s): 1 new" in res.output and "Finish with the final number" in res.output
    assert "llm" in run("list", "--source", "llm").output


# ---------------------------------------------------------------- the loss never sees experience


@pytest.mark.slow
@pytest.mark.parametrize("shared_prefix", [True, False])
def test_experience_never_reaches_the_loss(tmp_path, embedded_model_dir, shared_prefix):
    """One real GRPO step (train_round) with every rollout guided: the policy generates from
    prompts that hold the lessons, but every forward pass that computes the loss (grad enabled)
    gets the clean prompt, with a contiguous attention mask, and the reference log-probs (beta > 0)
    are taken on that same clean sequence. The backbone's passes are the ones watched: with
    train.shared_prefix the loss runs the prompt alone (no cache yet), then the completion on its
    cache; without, TRL's pass runs each whole row."""
    import torch

    from evotrainer.config import load_config
    from evotrainer.harness.loader import load_harness
    from evotrainer.paths import CONFIGS_DIR
    from evotrainer.policy import load_policy
    from evotrainer.train.loop import build_peft, open_session, train_round
    from evotrainer.train.progress import make_progress

    harness_dir = tmp_path / "harness"
    shutil.copytree(Path(__file__).resolve().parents[1] / "harnesses" / "math", harness_dir)
    spec = harness_dir / "harness.yaml"
    # every rollout guided; beta > 0 so TRL takes reference log-probs too; short completions (cost)
    text = (spec.read_text().replace("beta: 0.0", "beta: 0.04").replace("share: 0.0", "share: 1.0")
            .replace("max_completion_length: 32", "max_completion_length: 12")
            .replace("num_generations: 8", "num_generations: 4")
            .replace("  k: 2", "  k: 2\n  clip_high: 0.6"))
    spec.write_text(text)
    harness = load_harness(harness_dir)
    assert harness.spec.experience["share"] == 1.0 and harness.spec.grpo["beta"] == 0.04
    assert harness.spec.experience["clip_high"] == 0.6
    assert harness.spec.grpo["max_completion_length"] == 12 and harness.spec.grpo["num_generations"] == 4

    cfg = load_config(CONFIGS_DIR / "math-tiny.yaml",
                      ["domain.heldout_size=2", f"train.shared_prefix={str(shared_prefix).lower()}"])
    session = open_session(cfg, tmp_path / "work", harness=harness)
    all_rule_lessons(session.store)
    texts = [row["text"] for row in session.store.lessons(domain="math")]
    header = render_block([]).strip()  # "Lessons from earlier attempts at similar tasks:"

    model, tokenizer = load_policy(cfg.policy.model, None, trainable=True)
    forwards: list[tuple[bool, bool, torch.Tensor, torch.Tensor]] = []  # (grad, on a cache, ids, mask)

    def record(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else mask
        cached = kwargs.get("cache", kwargs.get("past_key_values")) is not None
        forwards.append((torch.is_grad_enabled(), cached, ids.detach().clone(), mask.detach().clone()))

    handle = model.model.register_forward_pre_hook(record, with_kwargs=True)  # the backbone
    model = build_peft(model, session.grpo)
    from trl import GRPOTrainer

    clips = []  # the epsilon_high TRL's loss sees: every row here is guided, so all 0.6
    trl_loss = GRPOTrainer._compute_loss

    def loss_with_clip(self, model, inputs):
        clips.append(self.epsilon_high)
        return trl_loss(self, model, inputs)

    GRPOTrainer._compute_loss = loss_with_clip
    try:
        with make_progress(session.console) as progress:
            train_round(session, model, tokenizer, 0, 1, progress)
    finally:
        handle.remove()
        GRPOTrainer._compute_loss = trl_loss
    assert clips and all(isinstance(c, torch.Tensor) and c.shape == (4, 1) for c in clips)
    assert all(c.eq(torch.tensor(0.6)).all() for c in clips)

    # the loss's passes that start a sequence: whole rows, or (shared prefix) the prompts alone
    loss = [n for n, (grad, cached, _, _) in enumerate(forwards) if grad and not cached]
    assert loss, "no forward pass with gradients: the loss was never computed"
    assert any(grad and cached for grad, cached, _, _ in forwards) == shared_prefix
    before = forwards[: loss[0]]
    # the policy generated from prompts holding the lessons (the first pass of generate sees them)
    first = [tokenizer.decode(i[m.bool()]) for i, m in zip(before[0][2], before[0][3])]
    assert all(header in row and any(t[:40] in row for t in texts) for row in first)

    rollouts = list(session.store.iter_rollouts(run_id=session.run_id))
    [clean_text] = {sr.rollout.prompt for sr in rollouts}  # one prompt per step in the tiny config
    clean = tokenizer.apply_chat_template(conversation=[[{"role": "user", "content": clean_text}]],
                                          add_generation_prompt=True, tokenize=True, return_dict=True)
    clean = list(clean["input_ids"][0])
    for n in loss:
        _, _, ids, mask = forwards[n]
        for row, m in zip(ids, mask):
            # left padding, then exactly the clean prompt (attended), then the completion: the
            # lessons are nowhere in the prompt part of the sequence, as tokens or as context
            start = int(m.argmax())
            assert set(row[:start].tolist()) <= {tokenizer.pad_token_id}
            assert row[start:start + len(clean)].tolist() == clean and bool(m[start:start + len(clean)].all())
            runs = torch.diff(torch.cat([m.new_zeros(1), m, m.new_zeros(1)])).abs().sum().item()
            assert runs == 2  # one contiguous run of attended tokens: no hole where lessons were
    # the last no-grad pass before the loss that starts a sequence is the reference model's, on the
    # same clean sequences (TRL shuffles the batch's rows between scoring and the loss: compared as sets)
    def row_set(ids, mask):
        return sorted((tuple(i.tolist()), tuple(m.tolist())) for i, m in zip(ids, mask))

    reference = [f for f in before if not f[0] and not f[1]][-1]
    assert row_set(*reference[2:]) == row_set(*forwards[loss[0]][2:])

    assert len(rollouts) == session.grpo["num_generations"]
    lesson_ids = {row["id"] for row in session.store.lessons()}
    for sr in rollouts:
        r = sr.rollout
        assert header not in r.prompt and len(r.meta["experience"]) == 2 and set(r.meta["experience"]) <= lesson_ids
