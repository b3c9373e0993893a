"""The verifiers domain against real environment modules written with the classic verifiers API."""

from __future__ import annotations

import asyncio
import signal
import textwrap
import time

import pytest

pytest.importorskip("verifiers")

from evotrainer.domains import DomainError, get_domain
from evotrainer.domains.verifiers_env import VerifiersDomain, render_prompt

# Written the way a published environment is: a module exposing load_environment().
TINY_ENV = '''
import asyncio

import verifiers as vf
from datasets import Dataset


def load_environment(n_train: int = 6, n_eval: int = 3, **kwargs):
    train = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "info": {"i": i}, "task": "add"}
             for i in range(n_train)]
    train.append(dict(train[0], info={"i": 0, "repeat": True}))  # a repeated question
    train.append({"question": "What is 100 + 1?", "answer": "101", "info": {"i": 100}, "task": "add"})
    evals = [{"question": f"What is {i} * 3?", "answer": str(3 * i), "info": {"i": i}, "task": "mul"}
             for i in range(n_eval)]
    evals.append({"question": "What is 100 + 1?", "answer": "101", "info": {"i": 100}, "task": "add"})
    parser = vf.XMLParser(["reasoning", "answer"], answer_field="answer")

    async def correct_answer(completion, answer, parser, **kw):
        await asyncio.sleep(0)
        got = parser.parse_answer(completion) or ""
        if got.strip() == "BOOM":
            raise RuntimeError("the rubric broke")
        return 1.0 if got.strip() == answer else 0.0

    def polite(completion, info, state):
        info["seen"] = True  # a rubric that writes into what it is given
        return 0.0 if "stupid" in completion[-1]["content"] else 1.0

    def too_long(completion, **kw):
        return 1.0 if len(completion[-1]["content"]) > 400 else 0.0

    rubric = vf.Rubric(funcs=[correct_answer, parser.get_format_reward_func(), polite, too_long],
                       weights=[1.0, 0.2, 0.1, -0.5], parser=parser)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(train), eval_dataset=Dataset.from_list(evals),
                            system_prompt="Reply as <reasoning>...</reasoning><answer>...</answer>.",
                            parser=parser, rubric=rubric, **kwargs)
'''

# Eval rows only (as benchmark environments are), with ids, a chat prompt and a RubricGroup.
EVAL_ONLY_ENV = '''
import time

import verifiers as vf
from datasets import Dataset


def load_environment(sleepy: bool = False):
    rows = [{"id": f"q{i}", "prompt": [{"role": "user", "content": f"Spell {w} backwards."}],
             "answer": w[::-1]} for i, w in enumerate(["cat", "dog", "emu", "owl", "yak", "ram",
                                                        "eel", "bat", "ant", "cow"])]

    def exact(completion, answer):
        if sleepy:
            time.sleep(5)
        return float(completion[-1]["content"].strip() == answer)

    def short(completion):
        return float(len(completion[-1]["content"]) < 20)

    rubric = vf.RubricGroup([vf.Rubric(funcs=[exact]), vf.Rubric(funcs=[short], weights=[0.5])])
    return vf.SingleTurnEnv(eval_dataset=Dataset.from_list(rows), rubric=rubric)
'''


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("vf_envs")
    (d / "vf_tiny_add.py").write_text(TINY_ENV)
    (d / "vf_eval_only.py").write_text(EVAL_ONLY_ENV)
    return d


@pytest.fixture(scope="module")
def tiny(env_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(env_dir))
        yield get_domain("verifiers", env="vf-tiny-add")  # an id, as vf.load_environment takes it


def gold(task):
    return f"<reasoning>easy</reasoning>\n<answer>{task.answer}</answer>"


def test_gold_answers_succeed_with_the_full_weighted_reward(tiny):
    tasks = tiny.all_tasks()
    assert len(tasks) == 10  # 6 train, 4 eval; the repeated and the eval-duplicated rows are out
    for task in tasks:
        outcome = tiny.check(task, gold(task), False)
        assert (outcome.success, outcome.kind) == (True, "ok"), task
        assert outcome.score == pytest.approx(1.0 + 0.2 + 0.1)


def test_wrong_empty_and_penalized_completions_fail(tiny):
    task = tiny.tasks("train", 1, 0)[0]
    wrong = tiny.check(task, "<reasoning>hm</reasoning>\n<answer>-1</answer>", False)
    assert (wrong.success, wrong.kind, wrong.score) == (False, "wrong", pytest.approx(0.3))
    rude = tiny.check(task, gold(task).replace("easy", "stupid"), False)  # right, but one func says 0
    assert (rude.success, rude.kind, rude.score) == (False, "wrong", pytest.approx(1.2))
    padded = tiny.check(task, gold(task) + " " * 500, False)  # a negatively weighted func fires
    assert (padded.success, padded.score) == (False, pytest.approx(0.8))
    for text in ("", "   \n"):
        assert tiny.check(task, text, False).kind == "empty"
    assert tiny.check(task, "<answer>-1", True).kind == "truncated"
    assert tiny.check(task, gold(task), True).kind == "ok"  # cut off after a full answer still counts


def test_a_rubric_exception_is_an_error_not_a_zero(tiny):
    task = tiny.tasks("train", 1, 0)[0]
    outcome = tiny.check(task, "<answer>BOOM</answer>", False)
    assert (outcome.success, outcome.kind, outcome.flags) == (False, "error", ("rubric_error",))
    with pytest.raises(RuntimeError, match="the rubric broke"):
        tiny.rewards(task, "<answer>BOOM</answer>")


def test_eval_dataset_is_the_heldout_split_and_tasks_keep_the_row(tiny):
    train, held = tiny.tasks("train", 100, 0), tiny.tasks("heldout", 100, 0)
    assert len(train) == 6 and len(held) == 4
    assert {t.meta["source"] for t in held} == {"eval_dataset"}
    assert not {t.prompt for t in train} & {t.prompt for t in held}
    assert tiny.skipped == {"duplicate row": 1, "train row repeats an eval row": 1}
    task = next(t for t in held if "2 * 3" in t.prompt)
    assert task.answer == "6" and task.meta["info"] == {"i": 2} and task.meta["task"] == "mul"
    assert task.prompt == ("Reply as <reasoning>...</reasoning><answer>...</answer>.\n\nWhat is 2 * 3?")
    assert task.meta["messages"][0]["role"] == "system"
    assert tiny.tasks("train", 3, 5) == tiny.tasks("train", 3, 5)
    assert [t.task_id for t in tiny.tasks("train", 7, 1)] != [t.task_id for t in tiny.tasks("train", 7, 2)]


def test_the_rubric_cannot_change_the_task_between_checks(tiny):
    task = tiny.tasks("train", 1, 0)[0]
    tiny.check(task, gold(task), False)  # `polite` writes into the info it is given
    assert tiny.check(task, gold(task), False).success
    assert "seen" not in tiny._rows[task.task_id]["info"] and "seen" not in task.meta["info"]


def test_ids_are_stable_across_loads_and_splits_follow_heldout_fraction(env_dir):
    a = VerifiersDomain(env=str(env_dir / "vf_tiny_add.py"), heldout_fraction=0.5)
    b = VerifiersDomain(env=str(env_dir / "vf_tiny_add.py"), heldout_fraction=0.5)
    assert [t.task_id for t in a.all_tasks()] == [t.task_id for t in b.all_tasks()]
    assert {t.meta["source"] for t in a.all_tasks()} == {"dataset"}  # the eval rows are not used
    assert len(a.all_tasks()) == 7 and 0 < len(a.tasks("heldout", 100, 0)) < 7
    small = VerifiersDomain(env=str(env_dir / "vf_tiny_add.py"), env_args={"n_train": 2})
    assert len(small.tasks("train", 100, 0)) == 2  # 0 + 0, 1 + 1; 100 + 1 is an eval row


def test_eval_only_env_ids_rubric_group_and_module_path(env_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(env_dir))
    d = get_domain("verifiers", env="vf_eval_only", heldout_fraction=0.3)
    tasks = d.all_tasks()
    assert sorted(t.task_id for t in tasks) == sorted(f"vf-vf-eval-only-q{i}" for i in range(10))
    assert 0 < len(d.tasks("heldout", 10, 0)) < 10
    task = next(t for t in tasks if t.task_id.endswith("q0"))
    assert task.prompt == "Spell cat backwards." and task.answer == "tac"
    assert (o := d.check(task, "tac", False)).success and o.score == pytest.approx(1.5)
    assert (o := d.check(task, "cat", False)).kind == "wrong" and o.score == pytest.approx(0.5)


def test_a_reward_past_its_time_is_a_timeout_and_the_next_check_runs(env_dir):
    d = VerifiersDomain(env=str(env_dir / "vf_eval_only.py"), env_args={"sleepy": True},
                        heldout_fraction=0.3, timeout_s=0.3)
    task = d.all_tasks()[0]
    start = time.monotonic()
    assert d.check(task, "x", False).kind == "timeout"
    assert d.check(task, "x", False).kind == "timeout"  # a fresh loop, not a queue behind the stuck one
    assert time.monotonic() - start < 3


def test_check_works_inside_a_running_event_loop(tiny):
    task = tiny.tasks("heldout", 1, 0)[0]

    async def caller():
        return tiny.check(task, gold(task), False)

    assert asyncio.run(caller()).success


def test_loading_keeps_the_trainers_signal_handlers(env_dir):
    def mine(sig, frame):
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        VerifiersDomain(env=str(env_dir / "vf_eval_only.py"), heldout_fraction=0.3)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


def test_refused_environments_and_options(env_dir, tmp_path):
    (tmp_path / "multi.py").write_text(textwrap.dedent('''
        import verifiers as vf
        from datasets import Dataset

        class Chat(vf.MultiTurnEnv):
            async def env_response(self, messages, state, **kw):
                return [{"role": "user", "content": "and?"}]

        def load_environment():
            return Chat(dataset=Dataset.from_list([{"question": "hi", "answer": "x"}]), max_turns=3,
                        rubric=vf.Rubric(funcs=[lambda completion: 1.0]))
    '''))
    (tmp_path / "group.py").write_text(textwrap.dedent('''
        import verifiers as vf
        from datasets import Dataset

        def rank(completions, **kw):
            return [1.0 for _ in completions]

        def load_environment():
            return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "hi", "answer": "x"}]),
                                    rubric=vf.Rubric(funcs=[rank]))
    '''))
    (tmp_path / "lazy.py").write_text(textwrap.dedent('''
        import verifiers as vf

        def build():
            raise FileNotFoundError("no such data file")

        def load_environment():
            return vf.SingleTurnEnv(dataset=build, rubric=vf.Rubric(funcs=[lambda completion: 1.0]))
    '''))
    with pytest.raises(DomainError, match="building its dataset raised FileNotFoundError"):
        get_domain("verifiers", env=str(tmp_path / "lazy.py"))
    with pytest.raises(DomainError, match="single-turn"):
        get_domain("verifiers", env=str(tmp_path / "multi.py"))
    with pytest.raises(DomainError, match="group reward function"):
        get_domain("verifiers", env=str(tmp_path / "group.py"))
    with pytest.raises(DomainError, match="Could not import 'no-such-env'"):
        get_domain("verifiers", env="no-such-env")
    with pytest.raises(DomainError, match="has no option 'split'"):
        get_domain("verifiers", env="x", split="train")
    with pytest.raises(DomainError, match="needs domain.options.env"):
        get_domain("verifiers")


def test_render_prompt_of_chats():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}]
    assert render_prompt(chat, keep_system=True) == "Be brief.\n\nUser: Hi\n\nAssistant: Hello\n\nUser: 2+2?"
    assert render_prompt(chat[1:2], keep_system=False) == "Hi"
    assert render_prompt([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], True) is None


def test_math_rubric_environment(tmp_path):
    """vf.MathRubric (math-verify in a process pool), the rubric of many published math environments."""
    (tmp_path / "mathy.py").write_text(textwrap.dedent(r'''
        import verifiers as vf
        from datasets import Dataset

        def load_environment():
            rows = [{"question": "What is 1/2 + 1/4?", "answer": "3/4"}, {"question": "Solve x+1=3.", "answer": "2"}]
            return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.MathRubric(),
                                    system_prompt="Put the final answer in \\boxed{}.")
    '''))
    d = VerifiersDomain(env=str(tmp_path / "mathy.py"), heldout_fraction=0.5)
    task = next(t for t in d.all_tasks() if t.answer == "3/4")
    assert task.prompt == "Put the final answer in \\boxed{}.\n\nWhat is 1/2 + 1/4?"
    assert d.check(task, r"So it is \boxed{0.75}", False).success  # math-verify: 0.75 == 3/4
    assert d.check(task, r"\boxed{7}", False).kind == "wrong"
    assert d.check(task, "3/4", False).kind == "wrong"  # MathRubric wants the boxed answer


def test_the_shipped_example_config_builds_its_domain():
    from evotrainer.config import load_config
    from evotrainer.domains import build_domain
    from evotrainer.paths import CONFIGS_DIR

    cfg = load_config(CONFIGS_DIR / "verifiers-tiny.yaml")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(CONFIGS_DIR.parent)  # the config names the env by a path from the repo root
        d = build_domain(cfg.domain)
    train, held = d.tasks("train", 16, 0), d.tasks("heldout", 8, 0)
    assert len(train) == 16 and len(held) == 8 and {t.meta["source"] for t in held} == {"eval_dataset"}
    assert all(d.check(t, f"<answer>{t.answer}</answer>", False).success for t in train + held)
    assert not d.check(train[0], f"<answer>{int(train[0].answer) + 1}</answer>", False).success
