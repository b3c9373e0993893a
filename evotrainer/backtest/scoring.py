"""The trusted parent checks a worker's raw values and joins them with the verified facts it kept.

A worker may be wholly under harness code's control (it can rewrite our job, our JSON encoder,
anything in its own process), so nothing it sends is believed: ids must be exactly the ones
sent, in order; every value must have its type, be finite and within bounds. Any departure fails
that harness. Training rewards, advantages, keep decisions and every metric are computed here,
with the verified outcomes read from the store (rows.Fact), never with anything a worker made.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evotrainer.backtest.metrics import Tally, group_advantages
from evotrainer.backtest.rows import Fact
from evotrainer.harness.loader import (
    REWARD_BOUND,
    SPEC_FILE,
    HarnessError,
    parse_spec,
    validate_training_reward,
    validate_weights,
    weighted_reward,
)
from evotrainer.harness.sandbox import CandidateFailure

_KEYS = ("ids", "rewards", "keep", "cut", "keep_group", "counterfactual")


@dataclass(frozen=True)
class Side:
    """One harness version as the parent scores it: its label and the parts of harness.yaml that
    turn raw values into training rewards and advantages (parsed here, never in a worker)."""

    label: str
    reward_weights: Mapping[str, float]
    scale_rewards: str

    @classmethod
    def parse(cls, label: str, sources: Mapping[str, str]) -> Side:
        try:
            spec = parse_spec(sources[SPEC_FILE])
        except HarnessError as exc:
            raise CandidateFailure(str(exc), label) from None
        return cls(label, dict(spec.reward_weights), spec.grpo.get("scale_rewards", "group"))


def _malformed(label: str, what: str) -> CandidateFailure:
    return CandidateFailure(f"the sandbox worker sent malformed results ({what})", label)


def _check_ids(label: str, got: Any, sent: list[str]) -> None:
    if got == sent:
        return
    if not isinstance(got, list) or not all(isinstance(i, str) for i in got):
        raise _malformed(label, "ids is not a list of strings")
    counts, expected = Counter(got), set(sent)
    extra = [i for i in counts if i not in expected]
    missing = [i for i in sent if i not in counts]
    twice = [i for i, n in counts.items() if n > 1]
    for what, ids in (("ids it was not sent", extra), ("no values for sent ids", missing),
                      ("ids more than once", twice)):
        if ids:
            raise _malformed(label, f"{what}: {len(ids)}, e.g. {ids[0][:80]!r}")
    raise _malformed(label, "ids out of the order sent")


def check_values(label: str, reply: Any, groups: Sequence[Sequence[Fact]]) -> dict[str, list]:
    """The worker's reply for these groups, checked: exactly the sent ids, in order, and values of
    the right types (reward components finite and within REWARD_BOUND)."""
    if not isinstance(reply, dict) or sorted(reply) != sorted(_KEYS):
        raise _malformed(label, f"expected an object with {', '.join(_KEYS)}")
    sent = [f.id for members in groups for f in members]
    _check_ids(label, reply["ids"], sent)
    for key, size in (("rewards", len(sent)), ("keep", len(sent)), ("cut", len(sent)),
                      ("keep_group", len(groups)), ("counterfactual", len(sent))):
        if not isinstance(reply[key], list) or len(reply[key]) != size:
            raise _malformed(label, f"{key} is not a list of {size}")
    for key in ("keep", "cut", "keep_group"):
        if not all(type(v) is bool for v in reply[key]):
            raise _malformed(label, f"{key} holds a value that is not a bool")
    for rid, comps in zip(sent, reply["rewards"]):  # plain loops: this runs for every rollout
        if not _components(comps):
            raise _malformed(label, f"the reward of rollout {rid[:80]!r} is not a dict of finite floats "
                                    f"within +-{REWARD_BOUND:g}")
    # a rescored success for exactly the verified failures (the facts the parent kept decide which)
    for fact, comps in zip((f for members in groups for f in members), reply["counterfactual"]):
        if fact.success and comps is not None:
            raise _malformed(label, f"a counterfactual reward for rollout {fact.id[:80]!r}, a verified success")
        if not fact.success and not _components(comps):
            raise _malformed(label, f"the counterfactual reward of rollout {fact.id[:80]!r} is not a dict of "
                                    f"finite floats within +-{REWARD_BOUND:g}")
    return reply


def _components(comps: Any) -> bool:
    """A reward: a dict of str -> finite float or int within REWARD_BOUND."""
    if type(comps) is not dict:
        return False
    bound = REWARD_BOUND
    for key, value in comps.items():
        # NaN and inf fail the comparison; bool, str and anything else fail the type test
        if type(key) is not str or type(value) not in (float, int) or not -bound <= value <= bound:
            return False
    return True


def check_weights(label: str, reply: Any, task_ids: Sequence[str]) -> dict[str, float]:
    """A worker's curriculum weights, checked as the harness loader checks them."""
    if not isinstance(reply, dict) or list(reply) != ["weights"]:
        raise _malformed(label, "expected an object with weights")
    try:
        return validate_weights(reply["weights"], task_ids)
    except HarnessError as exc:
        raise _malformed(label, str(exc)) from None


def task_shares(weights: Mapping[str, float]) -> dict[str, float]:
    """Each task's probability under a curriculum's weights."""
    total = sum(weights.values())
    return {t: w / total for t, w in weights.items()} if total > 0 else {}


def add_values(tally: Tally, side: Side, groups: Sequence[Sequence[Fact]], values: Mapping[str, list],
               weight_of: Any = None) -> None:
    """Join checked values with the verified facts, group by group, into the tally.
    `weight_of(task_id)`: the group's curriculum weight (None without a task history)."""
    at = 0
    for g, members in enumerate(groups):
        n = len(members)
        rewards = []
        for fact, comps in zip(members, values["rewards"][at:at + n]):
            rewards.append(_training_reward(side, comps, fact))
        counterfactual = [None if comps is None else _training_reward(side, comps, fact)
                          for fact, comps in zip(members, values["counterfactual"][at:at + n])]
        keep_group = values["keep_group"][g]
        kept = [keep_group and k and not cut
                for k, cut in zip(values["keep"][at:at + n], values["cut"][at:at + n])]
        weight = weight_of(members[0].task_id) if weight_of is not None else None
        tally.add_group(rewards, group_advantages(rewards, side.scale_rewards), [f.success for f in members],
                        [f.flagged for f in members], [f.tokens for f in members], kept, weight, counterfactual)
        at += n


def _training_reward(side: Side, comps: Mapping[str, float], fact: Fact) -> float:
    """Bounded as training bounds it (loader.REWARD_BOUND): a reward the trainer would refuse
    fails the candidate here, not the first training step after its promotion."""
    value = weighted_reward(side.reward_weights, comps)
    try:
        return validate_training_reward(value, comps)
    except HarnessError as exc:
        raise CandidateFailure(f"{exc} (on rollout {fact.id})", side.label) from None


class Fingerprint:
    """An order-free digest of a harness's raw values over a selection: the sum (mod 2**128) of a
    hash of each group's values (its ids, reward components, keep flags, cuts and keep_group).
    Chunks hold whole groups, so it is the same for any chunking, order or number of workers: a
    rerun in other workers must give the same one."""

    def __init__(self) -> None:
        self.total, self.count = 0, 0

    def add(self, item: Any) -> None:
        # repr of str, bool, float (shortest round-trip form) and dict (in order) is exact
        data = repr(item).encode()
        self.total = (self.total + int.from_bytes(hashlib.blake2b(data, digest_size=16).digest(), "big")) % 2**128
        self.count += 1

    def add_values(self, groups: Sequence[Sequence[Fact]], values: Mapping[str, list]) -> None:
        at = 0
        for g, members in enumerate(groups):
            end = at + len(members)
            self.add((values["ids"][at:end], values["rewards"][at:end], values["keep"][at:end],
                      values["cut"][at:end], values["keep_group"][g], values["counterfactual"][at:end]))
            at = end

    def hexdigest(self) -> str:
        return f"{self.count}:{self.total:032x}"


__all__ = ["Fingerprint", "REWARD_BOUND", "Side", "add_values", "check_values", "check_weights", "task_shares"]
