"""The live pilot: a change to the training dynamics, which replay cannot judge, is judged by a few
real training steps under base and candidate (coevolve/pilot.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evotrainer.coevolve.pilot import dynamics_change, judge, needs_pilot, pilot_run
from evotrainer.config import load_config
from evotrainer.diagnose import ProbeResult
from evotrainer.harness.loader import read_sources
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.skills import SkillLibrary

TINY = CONFIGS_DIR / "math-tiny.yaml"


def _yaml(temperature: float = 1.0, lr: str = "2.0e-4", mask: str = "false") -> str:
    text = (HARNESSES_DIR / "math" / "harness.yaml").read_text()
    text = text.replace("temperature: 1.0", f"temperature: {temperature}").replace("learning_rate: 2.0e-4",
                                                                                 f"learning_rate: {lr}")
    return text.replace("grpo:\n", f"grpo:\n  mask_truncated_completions: {mask}\n")


def test_a_dynamics_change_is_any_grpo_knob_replay_cannot_see():
    base = read_sources(HARNESSES_DIR / "math")
    assert dynamics_change(base, base) == {}
    assert dynamics_change({**base, "harness.yaml": _yaml()}, {**base, "harness.yaml": _yaml(0.3, "5.0e-5")}) == \
        {"learning_rate": [2e-4, 5e-5], "temperature": [1.0, 0.3]}
    # masking truncated completions pairs with a filters.py edit the backtest replays
    assert dynamics_change({**base, "harness.yaml": _yaml()}, {**base, "harness.yaml": _yaml(mask="true")}) == {}
    # a reward edit is replayed, not piloted
    assert dynamics_change(base, {**base, "reward.py": base["reward.py"] + "\n# x\n"}) == {}


def test_only_a_backtest_that_failed_nothing_but_its_target_goes_to_the_pilot():
    change = {"temperature": [0.3, 1.0]}
    target_only = {"checks": [{"name": "ran", "passed": True}, {"name": "target:mean_tokens", "passed": False},
                              {"name": "false_drop_rate", "passed": True}]}
    unsafe = {"checks": [*target_only["checks"], {"name": "ordering_violations", "passed": False}]}
    assert needs_pilot(target_only, change)
    assert not needs_pilot(unsafe, change) and not needs_pilot(target_only, {}) and not needs_pilot({}, change)


def _probe(value: float | None) -> dict:
    return {"duplicate_rate": ProbeResult("duplicate_rate", "behaviour", value, "ok", 0.5, 0.8, "above")}


def _evals(solved: list[str], n: int = 32) -> list[dict]:
    return [{"seed": 0, "split": "validation", "n": n, "successes": len(solved),
             "success_rate": len(solved) / n, "details": {"solved": solved}}]


@pytest.mark.parametrize("base, cand, base_solved, cand_solved, decision, why", [
    (0.8, 0.2, 10, 10, "promote", "duplicate_rate 0.8 -> 0.2"),
    (0.8, 0.79, 10, 10, "reject", "not fixed"),  # within the gate's margin
    (0.8, 0.2, 20, 2, "reject", "regressed"),  # fixed the duplicates, cost validation success
])
def test_the_pilot_promotes_a_fix_of_its_target_that_costs_no_validation_success(
        base, cand, base_solved, cand_solved, decision, why):
    cfg = load_config(TINY, [])
    tasks = [f"v{i}" for i in range(32)]
    result = judge(_probe(base), _probe(cand), _evals(tasks[:base_solved]), _evals(tasks[:cand_solved]),
                   "duplicate_rate", cfg, {"temperature": [0.3, 1.0]})
    assert result.decision == decision and any(why in r for r in result.reasons), result.reasons
    assert result.target == "duplicate_rate" and result.base == base and result.candidate == cand


def test_a_pilot_whose_targets_name_no_probe_rejects():
    cfg = load_config(TINY, [])
    result = judge(_probe(0.8), _probe(0.1), _evals(["a"]), _evals(["a"]), "mean_tokens", cfg, {"top_k": [0, 5]})
    assert result.decision == "reject" and "name no probe" in result.reasons[0]


@pytest.mark.slow
def test_coevolve_pilots_a_temperature_change_on_the_real_model(tmp_path: Path):
    """A main run at temperature 0.3 trains round 0; raise-temperature is proposed, backtested in
    the sandbox (replay sees no difference), piloted for 2 real steps per arm from round 0's
    adapter, and decided on the arms' duplicate rates and validation evals."""
    from evotrainer.coevolve import Coevolution, RunState
    from evotrainer.coevolve.state import Candidate
    from evotrainer.store import Store
    from evotrainer.train.loop import open_session, run_training

    seed = tmp_path / "cold-seed"
    shutil.copytree(HARNESSES_DIR / "math", seed)
    (seed / "harness.yaml").write_text(_yaml(temperature=0.3))
    cfg = load_config(TINY, [f"harness={seed}", "coevolve.pilot_steps=2", "train.steps_per_round=2"])
    loop = Coevolution(cfg, tmp_path / "work")
    session = open_session(cfg, loop.ws.root)
    run_training(session, rounds=1)
    session.store.close()

    skill = SkillLibrary.load(loop.ws.root).get("raise-temperature")
    edits = skill.render(loop.repo.sources("main"), {"temperature": 1.0})
    cand = loop.repo.propose(0, "raise-temperature", edits, diagnosis="copies", targets=skill.targets,
                             expected="fewer duplicates")
    state = RunState(run="tiny", domain="math", round=0, stage="backtest",
                     candidates=[Candidate("raise-temperature", cand.branch, skill.name, {"temperature": 1.0},
                                           skill.targets, "fewer duplicates")])
    state.save(loop.state_path)
    loop.stage_backtest(state)
    c = state.candidates[0]
    assert c.decision in ("promote", "reject") and c.backtest is not None
    assert c.pilot["change"] == {"temperature": [0.3, 1.0]} and c.pilot["target"] == "duplicate_rate"
    assert c.pilot["base"] is not None and c.pilot["candidate"] is not None
    assert any(r.startswith("pilot") for r in c.reasons)
    with Store.open(loop.ws.root) as store:
        assert c.pilot["runs"] == {arm: pilot_run("tiny", arm) for arm in ("base", "raise-temperature")}
        for arm in ("base", "raise-temperature"):
            run_id = store.run_id(pilot_run("tiny", arm))
            rows = list(store.iter_rollouts(run_id=run_id, round_index=1))
            assert len(rows) == 2 * cfg.train.prompts_per_step * 8  # 2 steps of one prompt x 8 generations
            splits = {e["split"] for e in store.evals(run_id)}
            assert splits == {"validation"}  # the held-out split decides nothing, and is not even asked
        assert [r["index"] for r in store.rounds(store.run_id("tiny"))] == [0]  # main trained nothing more
    # a resumed backtest stage reuses the finished pilot: nothing is trained twice
    before = c.pilot
    c.decision = "pilot"
    loop.stage_backtest(state)
    assert state.candidates[0].pilot == before


def test_a_pilot_that_could_not_judge_its_targets_trains_nothing(tmp_path: Path):
    """Targets naming no probe (here a backtest metric) are refused before either arm trains: the
    arms would cost minutes each and the verdict would be a reject anyway."""
    from evotrainer.coevolve.pilot import run_pilot
    from evotrainer.console import make_console
    from evotrainer.harness.repo import HarnessRepo
    from evotrainer.skills import set_yaml_key
    from evotrainer.store import Store
    from evotrainer.workspace import ensure_workspace

    ws = ensure_workspace(tmp_path / "work", "math")
    repo = HarnessRepo(ws.harnesses)
    spec = read_sources(HARNESSES_DIR / "math")["harness.yaml"]
    branch = repo.propose(0, "longer", {"harness.yaml": set_yaml_key(spec, "grpo.max_completion_length", 256)},
                          diagnosis="most rollouts are cut off", targets="effective_data_ratio",
                          expected="fewer truncations").branch
    cfg = load_config(TINY, [])
    result = run_pilot(cfg, ws.root, repo, branch=branch, slug="longer", targets="effective_data_ratio",
                       round_index=0, change={"max_completion_length": [128, 256]}, console=make_console(stderr=True))
    assert result.decision == "reject" and result.runs == {}
    assert "not trained" in result.reasons[0] and "name no probe" in result.reasons[0]
    with Store.open(ws.root) as store:
        assert store.run_id(pilot_run(cfg.run_name, "base")) is None


def test_every_piloted_skill_targets_a_probe_the_pilot_measures(tmp_path: Path):
    """A skill whose edit is a dynamics change (so it goes to the pilot) must name in its Targets a
    probe of the seed diagnostics, or its pilot can only refuse it (longer-completions once
    targeted effective_data_ratio, a backtest metric)."""
    from evotrainer.coevolve.pilot import target_probe
    from evotrainer.diagnose.health import FALSE_DROP
    from evotrainer.harness.repo import HarnessRepo
    from evotrainer.workspace import ensure_workspace

    piloted = set()
    for domain in ("math", "code", "swe"):
        seed = read_sources(HARNESSES_DIR / domain)
        with HarnessRepo(ensure_workspace(tmp_path / domain, domain).harnesses).load("main") as harness:
            measured = {p.name for p in harness.probes} | {FALSE_DROP}
        for skill in SkillLibrary.load().filter(domain=domain):
            if any(dynamics_change(seed, {**seed, **skill.render(seed, point)}) for point in skill.grid_points()):
                piloted.add(skill.name)
                assert target_probe(skill.targets, measured), f"{skill.name} ({domain}): {skill.targets!r}"
    assert {"raise-temperature", "lower-learning-rate", "longer-completions"} <= piloted
