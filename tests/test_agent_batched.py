"""The agent scaffold's batched episodes (train/batcher.py through train/rollout.py:run_episodes),
with the embedded model and real sandboxed repos: greedy batched episodes reply as the sequential
path does, an episode that ends early leaves the batch without stalling the others, and a failure
in one episode reaches the caller instead of hanging the rest."""

from __future__ import annotations

import json
import threading

import pytest

from evotrainer.config import AgentScaffoldConfig
from evotrainer.domains.swe import SweDomain, split_of
from evotrainer.train.rollout import run_episodes
from tests.clamp_task import clamp_repo, clamp_row

pytestmark = pytest.mark.usefixtures("isolated_swe_cache")

# Problem statements of different lengths, so the batch's prompts are left-padded.
STATEMENTS = ["clamp(10.5, 0, 10) returns 10.5",
              "clamp(x, lo, hi) should never return more than hi, but clamp(10.5, 0, 10) gives 10.5 back. "
              "Please find the comparison that lets values just above hi through and fix it.",
              "clamp is wrong above hi; fix it. (short)"]


def _train_ids(n: int) -> list[str]:
    ids, k = [], 0
    while len(ids) < n:
        if split_of(f"batch-{k}", 0.2) == "train":
            ids.append(f"batch-{k}")
        k += 1
    return ids


@pytest.fixture(scope="module")
def domain(tmp_path_factory) -> SweDomain:
    root = clamp_repo(tmp_path_factory.mktemp("agent-batched") / "repo")
    rows = [{**clamp_row(root, iid), "problem_statement": text} for iid, text in zip(_train_ids(3), STATEMENTS)]
    path = root.parent / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return SweDomain(levels=(0,), source=str(path), scaffold="agent")


@pytest.fixture(scope="module")
def policy(embedded_model_dir):
    from evotrainer.policy import load_policy

    model, tokenizer = load_policy(str(embedded_model_dir))
    return model.eval(), tokenizer


def _tasks(domain: SweDomain) -> list:
    by_id = {t.task_id: t for t in domain.tasks("train", 3, 0)}
    return [by_id[i] for i in _train_ids(3)]  # in STATEMENTS order


def _limits(batched: bool) -> AgentScaffoldConfig:
    return AgentScaffoldConfig(max_turns=2, max_new_tokens=6, batched=batched, max_format_errors=3)


def _run(policy, domain, tasks, batched: bool, stop=None) -> list:
    model, tokenizer = policy
    return run_episodes(model, tokenizer, domain, tasks, _limits(batched), eos_ids=[tokenizer.eos_token_id],
                        stop=stop)


def _within(seconds: float, fn):
    """fn()'s result or exception; fails the test instead of hanging when fn does not return."""
    box: dict = {}

    def call() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s: the batch hangs"
    return box


def _replies(episode) -> list[str]:
    return [t.content for t in episode.rollout.turns if t.role == "assistant"]


def test_greedy_batched_episodes_reply_as_the_sequential_ones(policy, domain):
    tasks = _tasks(domain)
    sequential = _run(policy, domain, tasks, batched=False)
    batched = _within(300, lambda: _run(policy, domain, tasks, batched=True))["result"]
    lengths = {len(e.prompt_ids) for e in batched}
    assert len(lengths) == 3, "the prompts should differ in length, so the batch is padded"
    for s, b in zip(sequential, batched):
        # Left padding moves the logits by float rounding only. On this model, at 6 greedy tokens a
        # turn, no argmax flips (checked on every run so far), so the traces match token for token.
        # Should a model or transformers update flip a near-tie, the exit status and the first
        # reply of the longest prompt (no padding) are what stays robust.
        assert b.prompt_ids == s.prompt_ids
        assert b.completion_ids == s.completion_ids and b.env_mask == s.env_mask
        assert _replies(b) == _replies(s)
        assert b.rollout.meta["exit_status"] == s.rollout.meta["exit_status"]
        assert b.rollout.outcome.kind == s.rollout.outcome.kind
        assert b.meta["batch_sizes"] == [3] * b.rollout.meta["steps"]  # every reply came from one batch of 3
        assert "batch_sizes" not in s.meta


def test_an_episode_that_stops_early_leaves_the_batch(policy, domain):
    tasks = _tasks(domain)

    def stop(turns):  # a harness stop rule: cut the (short) task after its first observation
        return "short task" if "(short)" in turns[1].content else None

    episodes = _within(300, lambda: _run(policy, domain, tasks, batched=True, stop=stop))["result"]
    ended = [e.rollout.meta["exit_status"] for e in episodes]
    assert ended[2] == "stopped" and episodes[2].rollout.meta["steps"] == 1
    assert ended[:2] == ["step_limit", "step_limit"]  # 2 turns without a submit (6 tokens cannot act)
    assert [e.meta["batch_sizes"] for e in episodes] == [[3, 2], [3, 2], [3]]
    _, tokenizer = policy
    for e in episodes:
        assert len(e.completion_ids) == len(e.env_mask)
        # the runs of mask 1 are exactly the model's replies, in order; the rest is the environment's
        runs, run = [], []
        for token, m in zip(e.completion_ids, e.env_mask):
            if m:
                run.append(token)
            elif run:
                runs, run = [*runs, run], []
        runs += [run] if run else []
        assert [tokenizer.decode(r, skip_special_tokens=True) for r in runs] == _replies(e)
        env = tokenizer.decode([t for t, m in zip(e.completion_ids, e.env_mask) if not m])
        steps = e.rollout.meta["steps"]
        assert ("<|im_start|>user" in env) == (steps == 2)  # the observation sits in the masked part


def test_the_harness_worker_outlives_the_episode_threads(policy, domain):
    """The isolated harness starts its sandbox worker on its first stop() call, with a parent-death
    signal: started from an episode's thread, it would die with that thread, and the step's reward
    call after the episodes would find it dead."""
    from evotrainer.api import Turn
    from evotrainer.harness.isolated import isolated_from_folder
    from evotrainer.paths import HARNESSES_DIR

    harness = isolated_from_folder(HARNESSES_DIR / "swe")

    def step():  # in one thread, as the trainer's: episodes, then the reward call's stand-in
        _run(policy, domain, _tasks(domain), batched=True, stop=harness.stop)
        return harness.stop((Turn("system", "s"), Turn("user", "u")))  # the same worker still answers

    try:
        box = _within(300, step)  # (the worker dies with _within's thread, so ask before it ends)
        assert box == {"result": None}, box
    finally:
        harness.close()


class HarnessFault(RuntimeError):
    pass


def test_a_failing_episode_raises_instead_of_hanging_the_batch(policy, domain):
    tasks = _tasks(domain)

    def stop(turns):  # a harness stop rule that breaks on one task
        if "(short)" in turns[1].content:
            raise HarnessFault("stop() failed")
        return None

    box = _within(300, lambda: _run(policy, domain, tasks, batched=True, stop=stop))
    assert isinstance(box.get("error"), HarnessFault), box
    assert not any(t.name.startswith("episode-") for t in threading.enumerate())


def test_the_batched_switch_is_in_the_agent_config():
    from evotrainer.config import load_config
    from evotrainer.paths import CONFIGS_DIR

    assert load_config(CONFIGS_DIR / "swe.yaml").domain.agent.batched is True
    cfg = load_config(CONFIGS_DIR / "swe.yaml", ["domain.scaffold=agent", "domain.agent.batched=false"])
    assert cfg.domain.agent.batched is False


def test_each_episode_keeps_its_kv_cache_across_turns(policy):
    """Three episodes of different lengths, three turns each, through one Batcher: with the caches
    handed back, a later turn's batch prefills only the columns some row has not cached, and the
    greedy replies are the ones a batch that prefills every trace again gives."""
    from evotrainer.train.batcher import Batcher

    model, tokenizer = policy
    prompts = ["Count: one", "Name three colours of the rainbow, then three fruits, then stop.", "Say hi"]
    follow = [" Go on.", " Now the same again but in reverse order, please, and briefly.", " More."]
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731

    def run(keep: bool):
        widths: list[int] = []  # the input width of each forward pass (the first of a turn is its prefill)
        hook = model.register_forward_pre_hook(lambda _m, _a, kw: widths.append(kw["input_ids"].shape[1]),
                                               with_kwargs=True)
        batcher = Batcher(model, pad_token_id=tokenizer.eos_token_id)

        def job(i: int):
            def episode():
                ids, cache, log = encode(prompts[i]), None, []
                for _ in range(3):
                    reply, new = batcher.generate(ids, 5, cache=cache if keep else None)
                    # the cache covers the trace and every reply token but the last (never fed back)
                    assert new is not None and new[0][0].shape[2] == len(ids) + min(len(reply), 4)
                    log.append((len(ids), reply))
                    ids, cache = ids + reply + encode(follow[i]), new
                return log
            return episode

        try:
            logs = _within(300, lambda: batcher.run([job(i) for i in range(3)]))["result"]
        finally:
            hook.remove()
        return logs, widths, batcher.sizes

    cached, widths, sizes = run(keep=True)
    fresh, full_widths, _ = run(keep=False)
    assert sizes == [3, 3, 3]
    assert [[r for _, r in log] for log in cached] == [[r for _, r in log] for log in fresh]
    prefills = [w for w in widths if w > 1]  # decoding feeds one column a step
    full = [w for w in full_widths if w > 1]
    assert len(prefills) == len(full) == 3
    assert prefills[0] == full[0] == max(len(encode(p)) for p in prompts)  # nothing cached yet
    longest_follow = max(len(encode(f)) for f in follow)
    for turn in (1, 2):  # at most each row's last reply token and its follow-up, not the whole trace
        assert prefills[turn] <= 1 + longest_follow < full[turn], (prefills, full)
        assert full[turn] == max(n for log in cached for n, _ in log[turn:turn + 1])


def test_a_groups_prompt_is_prefilled_once(policy):
    """Three episodes of one task start from the same prompt: its KV is computed once, in one
    single-row pass of all but its last token, and every greedy reply is the one each episode gets
    alone in a batch of its own."""
    from evotrainer.train.batcher import Batcher

    model, tokenizer = policy
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = encode("Name three colours of the rainbow, then three fruits, then stop.")
    follow = [" Go on.", " Now the same again but in reverse order, please.", " More."]

    def run(indices: list[int]):
        shapes: list[tuple[int, int]] = []  # (rows, width) of every forward pass
        hook = model.register_forward_pre_hook(lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                               with_kwargs=True)
        batcher = Batcher(model, pad_token_id=tokenizer.eos_token_id)

        def job(i: int):
            def episode():
                ids, cache, log = list(prompt), None, []
                for _ in range(2):
                    reply, cache = batcher.generate(ids, 5, cache=cache)
                    log.append(reply)
                    ids = ids + reply + encode(follow[i])
                return log
            return episode

        try:
            logs = _within(300, lambda: batcher.run([job(i) for i in indices]))["result"]
        finally:
            hook.remove()
        return logs, shapes

    together, shapes = run([0, 1, 2])
    alone = [run([i])[0][0] for i in range(3)]
    assert together == alone
    assert shapes[0] == (1, len(prompt) - 1)  # the prompt once
    assert shapes[1] == (3, 1)  # then generate feeds each row its last prompt token, nothing more
    _, single = run([0])
    assert single[0] == (1, len(prompt))  # a lone episode prefills in generate as before
