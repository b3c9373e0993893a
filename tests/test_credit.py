"""Step-level credit (self-attributing): the advantages against a worked example done by hand,
step spans from TRL's tool mask, the (B, T) tensor the trainer hands TRL, and the harness option."""

import pytest
import torch
from factories import make_rollout

from evotrainer.train.credit import StepCredit, StepCreditSpec, broadcast, label_values, step_advantages, step_spans


def test_step_advantages_match_a_worked_example_by_hand():
    # One group of three rollouts, alpha = 0.5, outcome advantages A = (1.0, -0.5, -0.5).
    #   rollout a: GOOD BAD GOOD   -> +1 -1 +1
    #   rollout b: BAD BAD         -> -1 -1
    #   rollout c: no labels       -> keeps A on every token, and is not part of the z-score
    # Labels of the group: +1 -1 +1 -1 -1 -> mean = -1/5 = -0.2
    #   deviations: +1.2 -0.8 +1.2 -0.8 -0.8; squares 1.44 0.64 1.44 0.64 0.64, sum 4.8
    #   population var = 4.8 / 5 = 0.96, std = sqrt(0.96) = 0.9798 -> z(GOOD) = 1.2/0.9798 = 1.2247,
    #   z(BAD) = -0.8/0.9798 = -0.8165
    # Step rewards r = alpha * z, plus A at the last step:
    #   a: 0.6124, -0.4082, 0.6124 + 1.0 = 1.6124
    #   b: -0.4082, -0.4082 - 0.5 = -0.9082
    # Suffix sums (advantage of step t = sum of r_s for s >= t):
    #   a: 0.6124 - 0.4082 + 1.6124 = 1.8165,  -0.4082 + 1.6124 = 1.2041,  1.6124
    #   b: -0.4082 - 0.9082 = -1.3165,  -0.9082
    #   c: -0.5
    labels = [label_values(["GOOD", "BAD", "GOOD"]), label_values(["BAD", "BAD"]), None]
    got = step_advantages(labels, [1.0, -0.5, -0.5], alpha=0.5)
    assert got[0] == pytest.approx([1.8165, 1.2041, 1.6124], abs=1e-4)
    assert got[1] == pytest.approx([-1.3165, -0.9082], abs=1e-4)
    assert got[2] == [-0.5]


def test_all_equal_labels_add_nothing_and_alpha_zero_is_plain_grpo():
    same = step_advantages([[1.0, 1.0], [1.0]], [0.7, -0.7], alpha=0.1)
    assert same == [[0.7, 0.7], [-0.7]]  # z = 0: the outcome alone, broadcast back over the steps
    plain = step_advantages([[1.0, -1.0], [-1.0]], [0.7, -0.7], alpha=0.0)
    assert plain == [[0.7, 0.7], [-0.7]]


def test_labels_revive_a_dead_group():
    # All four fail: TRL's outcome advantage is 0 for each, so plain GRPO learns nothing here.
    got = step_advantages([[1.0, 1.0], [1.0, -1.0], [-1.0, -1.0], None], [0.0] * 4, alpha=0.1)
    firsts = [steps[0] for steps in got]
    assert firsts[0] > firsts[1] > firsts[2] and firsts[3] == 0.0


def test_label_parsing_is_strict():
    assert label_values(["good", " BAD "]) == [1.0, -1.0]
    assert label_values([1, -1, 0.5, 3]) == [1.0, -1.0, 0.5, 1.0]
    assert label_values(["GOOD", "maybe"]) is None and label_values([True]) is None
    assert label_values([]) is None and label_values("GOOD") is None


def test_step_spans_follow_the_tool_mask_and_broadcast_to_tokens():
    #            model model tool tool model pad pad
    cmask = [1, 1, 1, 1, 1, 0, 0]
    tmask = [1, 1, 0, 0, 1, 1, 1]  # TRL pads tool_mask with 1
    assert step_spans(cmask, tmask) == [(0, 2), (4, 5)]
    assert step_spans(cmask) == [(0, 5)]
    assert step_spans([0, 0, 0]) == []
    assert broadcast([2.0, -1.0], [(0, 2), (4, 5)], 7) == [2.0, 2.0, 0.0, 0.0, -1.0, 0.0, 0.0]
    assert broadcast([0.3], [(0, 2), (4, 5)], 4) == [0.3] * 4


def _rollout(rid, labels):
    return make_rollout(rid, task_id="t", domain="swe", prompt="p", completion="c", num_tokens=3,
                        meta={} if labels is None else {"step_labels": labels})


def test_step_credit_builds_the_per_token_tensor_trl_consumes():
    output = {
        "advantages": torch.tensor([1.0, -0.5, -0.5, 0.0]),
        "completion_ids": torch.tensor([[5, 6, 7, 8, 9, 0, 0]] * 4),
        "completion_mask": torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0],
                                         [1, 1, 1, 1, 1, 1, 1]]),
        "tool_mask": torch.tensor([[1, 1, 0, 1, 1, 1, 1], [1, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1],
                                   [1, 1, 1, 1, 1, 1, 1]]),
    }
    # Two groups of two. Group 1 (alpha 0.5): labels +1 -1 | -1 -1, mean -0.5, std 0.866, z(+1) = 1.7321,
    # z(-1) = -0.5774 -> r_a = 0.8660, -0.2887 + 1.0 -> A_a = (1.5774, 0.7113); r_b = -0.2887, -0.2887 - 0.5
    # -> A_b = (-1.0774, -0.7887). Group 2: the third rollout's 2 labels do not match its 1 step and the
    # fourth has none: both keep their sequence advantage on every token.
    rollouts = [_rollout("a", ["GOOD", "BAD"]), _rollout("b", ["BAD", "BAD"]), _rollout("c", ["GOOD", "BAD"]),
                _rollout("d", None)]
    credit = StepCredit(StepCreditSpec(enabled=True, alpha=0.5))
    adv = credit.advantages(output, rollouts, group_size=2)
    assert adv.shape == (4, 7) and adv.dtype == torch.float32
    expected = torch.tensor([[1.5774, 1.5774, 0.0, 0.7113, 0.7113, 0.0, 0.0],
                             [-1.0774, 0.0, 0.0, -0.7887, -0.7887, -0.7887, 0.0],
                             [-0.5] * 7, [0.0] * 7])
    assert torch.allclose(adv, expected, atol=1e-4)
    assert credit.last_stats == {"labelled": 2, "rollouts": 4}


def test_a_labeller_is_asked_with_each_steps_decoded_text():
    seen = []

    def labeller(rollout, steps):
        seen.append(steps)
        return ["GOOD"] if rollout.id == "a" else ["BAD"]

    output = {"advantages": torch.tensor([0.0, 0.0]), "completion_ids": torch.tensor([[3, 4], [5, 6]]),
              "completion_mask": torch.tensor([[1, 1], [1, 0]])}
    credit = StepCredit(StepCreditSpec(enabled=True, alpha=0.1), labeller)
    adv = credit.advantages(output, [_rollout("a", None), _rollout("b", None)], 2,
                            decode=lambda ids: " ".join(map(str, ids)))
    assert seen == [["3 4"], ["5"]]
    # z = +1 / -1, alpha 0.1, a dead group (outcome 0) gets +-0.1
    assert torch.allclose(adv, torch.tensor([[0.1, 0.1], [-0.1, -0.1]]))


def test_harness_option_parses_and_defaults_off():
    assert StepCreditSpec.from_raw(None) == StepCreditSpec(False, 0.1)
    assert StepCreditSpec.from_raw({"enabled": True, "alpha": 0.05}) == StepCreditSpec(True, 0.05)
    for bad, why in (({"enabled": "yes"}, "enabled"), ({"alpha": -1}, "alpha"), ({"gamma": 1}, "unknown"),
                     ([1], "mapping")):
        with pytest.raises(ValueError, match=why):
            StepCreditSpec.from_raw(bad)


@pytest.mark.slow
def test_training_asks_the_step_judge_and_trains_on_its_labels(tmp_path, embedded_model_dir):
    """One real GRPO step with harness step_credit on: the configured judge (a loopback endpoint)
    labels every completion during training, the labels are cached in the store, and the
    advantages TRL trains on are the step-credit ones, not the plain outcome ones."""
    import shutil

    from evotrainer.config import load_config
    from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
    from evotrainer.store import Store
    from evotrainer.train.loop import open_session, run_training
    from tests.llm_server import ChatServer

    harness = tmp_path / "harness"
    shutil.copytree(HARNESSES_DIR / "math", harness)
    with (harness / "harness.yaml").open("a") as fh:
        fh.write("step_credit:\n  enabled: true\n  alpha: 0.5\n")
    asked = []

    def label(body):  # GOOD for the first half of the batch, BAD after: labels that differ
        asked.append(body)
        return '{"labels": ["%s"]}' % ("GOOD" if len(asked) % 2 else "BAD")

    with ChatServer(responder=label) as server:
        cfg = load_config(CONFIGS_DIR / "math-tiny.yaml", [
            f"harness={harness}", "train.steps_per_round=1", "eval.batch_size=8",
            f"judge.base_url={server.url}", "judge.model=step-judge", "judge.backend=openai"])
        session = open_session(cfg, tmp_path / "work")
        run_training(session)
    g = session.grpo["num_generations"]
    assert len(asked) == g  # one step judge call per completion of the single group
    store = Store.open(tmp_path / "work")
    rows = list(store.iter_rollouts(run_id=session.run_id))
    assert len(rows) == g
    labels = [r.rollout.meta.get("step_labels") for r in rows]
    assert all(lab in (["GOOD"], ["BAD"]) for lab in labels), labels
    store.close()
