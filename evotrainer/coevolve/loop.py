"""`evotrainer coevolve`: train -> verify -> diagnose -> propose -> backtest -> promote, per round.

Each stage's outcome is saved in `<workdir>/coevolve.json` before the next begins, and every
harness change is a git commit, so a kill at any point resumes at the stage it interrupted.
At most one change is promoted per round, so its live effect can be attributed to it; the
next round verifies it on held-out verified success and reverts it if that regressed, compared
by default with a control arm trained without the change (coevolve/control.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evotrainer.backtest import Selector, backtest
from evotrainer.coevolve.beside import beside
from evotrainer.coevolve.choose import breadth_first, gain, passing_best_first
from evotrainer.coevolve.control import control_adapter, control_arm, control_evals
from evotrainer.coevolve.heldout import decision_split
from evotrainer.coevolve.pilot import decision_after_backtest, dynamics_change, run_pilot
from evotrainer.coevolve.state import Candidate, Pending, RunState, RunStateError, describe_cost
from evotrainer.coevolve.verify import Verdict, verify, verify_paired
from evotrainer.config import Config
from evotrainer.console import make_console
from evotrainer.crashpoints import crash_point
from evotrainer.dist import barrier, is_main
from evotrainer.harness.repo import HarnessRepo
from evotrainer.store import Store
from evotrainer.workspace import ensure_workspace

# approve(candidate, backtest report, diff text) -> promote?
Approver = Callable[[Candidate, dict, str], bool]

FAILURE_PROBE = "failure_reward_mean"


class Coevolution:
    def __init__(self, config: Config, workdir: Path, console: Console | None = None,
                 approve: Approver | None = None):
        self.config = config
        self.console = console or make_console(stderr=True)
        self.approve = approve
        if is_main():  # in a multi-rank launch rank 0 alone writes the workspace (evotrainer/dist.py)
            ensure_workspace(workdir, config.domain.name, seed=config.harness_dir())
        barrier()
        self.ws = ensure_workspace(workdir, config.domain.name, seed=config.harness_dir())
        self.repo = HarnessRepo(self.ws.harnesses)
        self.state_path = self.ws.root / "coevolve.json"

    # -- driver ------------------------------------------------------------------------------

    def run(self, rounds: int, resume: bool = False) -> RunState:
        state = RunState.load(self.state_path)
        if state is None or not resume:
            if state is not None and state.stage != "train":
                raise RunStateError(f"{self.state_path} holds an unfinished round {state.round} "
                                    f"(stage {state.stage}): pass --resume to continue it")
            state = state or RunState(run=self.config.run_name, domain=self.config.domain.name)
        if state.run != self.config.run_name:
            raise RunStateError(f"workspace holds co-evolution run {state.run!r}, config says "
                                f"{self.config.run_name!r}")
        if resume and is_main():
            for what in self.repo.recover():  # a kill in the middle of a git command
                self.console.print(f"[yellow]harness repo: {what}")
        target = state.round + rounds if state.stage == "train" and not resume else None
        target = target if target is not None else self._resume_target(state, rounds)
        while state.round < target:
            self.run_round(state)
        return state

    def _resume_target(self, state: RunState, rounds: int) -> int:
        # On resume, --rounds counts from the first round of the run, so the same command
        # line finishes what the killed one started.
        return max(rounds, state.round + (0 if state.stage == "train" else 1))

    def run_round(self, state: RunState) -> None:
        k = state.round
        steps = [("train", self.stage_train), ("verify", self.stage_verify),
                 ("diagnose", self.stage_diagnose), ("propose", self.stage_propose),
                 ("backtest", self.stage_backtest), ("promote", self.stage_promote)]
        names = [s for s, _ in steps]
        start = names.index(state.stage) if state.stage in names else len(names)
        self.report = None
        for name, fn in steps[start:]:
            # Every rank trains (DDP); the outer loop's stages and the state file are rank 0's.
            if name == "train" or is_main():
                self.console.rule(f"[bold]round {k} · {name}")
                crash_point("coevolve.stage", name)
                self._timed(state, name, fn)
            nxt = names[names.index(name) + 1] if name != "promote" else "done"
            if is_main():
                state.advance(nxt, self.state_path)
        if is_main():
            self._finish_round(state)
        barrier()
        if not is_main():  # take up the round as rank 0 left it (promotions, next round number)
            vars(state).update(vars(RunState.load(self.state_path)))

    def _timed(self, state: RunState, name: str, fn: Callable[[RunState], None]) -> None:
        """Run a stage and add its wall seconds to the round's cost, less what its parts (the
        control arm, evaluation, pilots) recorded under their own names while it ran."""
        before = sum(state.stage_seconds.values())
        started = time.perf_counter()
        fn(state)
        parts = sum(state.stage_seconds.values()) - before
        state.stage_seconds[name] = state.stage_seconds.get(name, 0.0) + time.perf_counter() - started - parts

    # -- stages ------------------------------------------------------------------------------

    def stage_train(self, state: RunState) -> None:
        if state.pending is None or self.config.coevolve.verify_against != "control":
            self._audited(state, self._train_main)
            return
        # The control arm reads the main run's history before this round: it trains first, or
        # beside the main round (coevolve/beside.py).
        with beside(self.config, self.ws.root, self.repo, control_arm(self.config, state.pending, state.round),
                    self.console) as control:
            self._audited(state, self._train_main)
            main_done = time.perf_counter()
        if control.parallel:  # the round's cost counts what it added; its own time beside that
            _add_seconds(state, "control", time.perf_counter() - main_done)
            if control.trained:
                state.beside_seconds["control"] = state.beside_seconds.get("control", 0.0) + control.seconds
        else:
            _add_seconds(state, "control", control.seconds)

    def _audited(self, state: RunState, train: Callable[[RunState], None]) -> None:
        """Train; when the audit (train/audit.py) finds that main's harness gives training values
        a fresh replay does not reproduce, revert the promotion that brought it in, record why,
        and train the round again under the reverted main. Without a promotion to blame (the
        seed, or a change made by hand) the round stops with the audit's error."""
        from evotrainer.train.audit import AuditFailure

        try:
            train(state)
        except AuditFailure as failure:
            pending = state.pending
            if pending is None or failure.version != self.repo.resolve("main"):
                raise
            why = f"audit in round {state.round}: {failure}"
            sha = self.repo.revert_of(pending.merge) or self.repo.revert(pending.merge, why)
            crash_point("coevolve.reverted", pending.branch)
            self.console.print(f"[red]reverted[/] {pending.branch} ({sha[:8]}): {why}")
            state.verdict = {"branch": pending.branch, "kept": False, "describe": why, "skill": pending.skill,
                             "audit": {"harness": failure.version, "step": failure.step, "detail": failure.detail}}
            state.pending = None
            state.save(self.state_path)  # the revert is recorded before the round trains again
            train(state)

    def _train_main(self, state: RunState) -> None:
        from evotrainer.train.loop import open_session, run_training

        session = open_session(self.config, self.ws.root, self.console)
        last = session.store.last_finished_round(session.run_id)
        done = last[0] if last else -1
        if done < state.round:
            run_training(session, rounds=state.round - done, start_adapter=state.start_adapter)
            rnd = next((r for r in session.store.rounds(session.run_id) if r["index"] == state.round), None)
            _add_seconds(state, "evaluation", ((rnd or {}).get("metrics") or {}).get("eval_seconds") or 0.0)
        session.store.close()
        state.start_adapter = None

    def stage_verify(self, state: RunState) -> None:
        self._guard(state)
        pending = state.pending
        if pending is None:
            self.console.print("nothing promoted last round: nothing to verify")
            return
        with Store.open(self.ws.root, self.config.store.url) as store:
            run_id = store.run_id(self.config.run_name)
            evals = store.evals(run_id)
            split = decision_split(evals)
            evals = [e for e in evals if e["split"] == split and e["adapter"]]
            control = (control_evals(store, self.config.run_name, state.round, split)
                       if self.config.coevolve.verify_against == "control" else [])
        by_round = lambda i: [e for e in evals if e["round_index"] == i]  # noqa: E731
        z = self.config.coevolve.verify_z
        critical = state.guard["level"] == "critical"
        if critical and not control:
            # Reward hacking is critical: the last promotion is the first suspect, so it goes.
            verdict = Verdict(baseline=0.0, live=0.0, noise=0.0, regressed=True)
            state.verdict = {"branch": pending.branch, "kept": False, "describe": state.guard["describe"],
                             "skill": pending.skill}
            self._revert(state, pending, verdict, why=state.guard["describe"])
            state.pending = None
            return
        if control:
            # With a control arm the suspect can be tested: did the change itself cost held-out
            # success? If the arm without it fell as far, the alert (which still holds back every
            # other promotion this round) is not the change's doing.
            verdict = verify_paired(control, by_round(state.round), z)
        else:
            if self.config.coevolve.verify_against == "control":
                self.console.print(f"[yellow]no control arm for round {state.round}: comparing with round "
                                   f"{pending.round} instead")
            verdict = verify(by_round(pending.round), by_round(state.round), z)
        self.console.print(f"{pending.branch}: {verdict.describe()}")
        state.verdict = {"branch": pending.branch, "kept": not verdict.regressed, "describe": verdict.describe(),
                         "skill": pending.skill}
        if verdict.regressed:
            self._revert(state, pending, verdict,
                         why=f"{state.guard['describe']}; {verdict.describe()}" if critical else None)
            if control:  # undo the change's training too: go on from the arm that never had it
                state.start_adapter = control_adapter(self.ws.root, self.config, state.round)
                self.console.print(f"round {state.round + 1} starts from the control arm's adapter "
                                   f"({state.start_adapter})")
        else:
            if critical:
                self.console.print(f"{pending.branch}: kept despite the critical held-out guard: the control arm "
                                   "without it did no better on held-out, beyond noise")
            self._save_skill(pending, "validated", verdict, state)
        state.pending = None

    def stage_diagnose(self, state: RunState) -> None:
        from evotrainer.diagnose import health_report, write_report

        with Store.open(self.ws.root, self.config.store.url) as store:
            run_id = store.run_id(self.config.run_name)
            rows = list(store.iter_rollouts(run_id=run_id, round_index=state.round))
            history = store.task_stats(self.config.domain.name, run_id, state.round)  # what the round was drawn from
        with self.repo.load("main") as harness:  # its code runs in a sandbox worker
            self.report = health_report(harness, rows, task_stats=history)
        self._add_guard_probe(state)
        write_report(self.report, self.ws.root / "diagnostics", f"{self.config.run_name}-round-{state.round}")
        for p in self.report.alerts:
            self.console.print(f"  [{'red' if p.level == 'critical' else 'yellow'}]{p.level}[/] "
                               f"{p.dimension}/{p.name} = {p.value:.3f}")

    def stage_propose(self, state: RunState) -> None:
        from evotrainer.diagnose.targets import retarget_all
        from evotrainer.propose import Evidence
        from evotrainer.skills import SkillLibrary

        report = self.report or self._reload_report(state)
        if self.config.coevolve.agent == "external":
            self._propose_external(state, report)
            return
        with Store.open(self.ws.root, self.config.store.url) as store:
            run_id = store.run_id(self.config.run_name)
            rows = list(store.iter_rollouts(run_id=run_id, round_index=state.round))
        samples = sorted(rows, key=lambda r: r.rollout.outcome.success)[:8]
        evidence = Evidence(round_index=state.round, domain=self.config.domain.name, report=report,
                            samples=samples, history=state.history, workdir=self.ws.root, run=self.config.run_name)
        agent = self._agent()
        skills = list(SkillLibrary.load(self.ws.root))
        proposals = retarget_all(agent.propose(evidence, self.repo.sources("main"), skills), report)
        proposals = breadth_first(proposals)[: self.config.coevolve.max_proposals]
        existing = set(self.repo.candidates())
        for p in proposals:
            branch = p.branch or f"candidate/{state.round}-{p.slug}"
            if p.branch is not None and branch not in existing:
                self.console.print(f"  [yellow]skipped[/] {branch}: the agent named a branch that does not exist")
                continue
            if branch not in existing:  # an agent that wrote its branch itself (p.branch) is taken as it is
                branch = self.repo.propose(state.round, p.slug, dict(p.edits), diagnosis=p.diagnosis,
                                           targets=p.targets, expected=p.expected).branch
            if all(c.branch != branch for c in state.candidates):
                state.candidates.append(Candidate(p.slug, branch, p.skill, dict(p.params), p.targets,
                                                  p.expected))
                state.save(self.state_path)
        self.console.print(f"{len(state.candidates)} proposal(s) from the {agent.name} agent")
        worked = getattr(agent, "last_round", None)  # the tool-using agent's loop (propose/llm_tools.py)
        if worked is not None:
            self.console.print(f"  its round ended {worked.ending} after {worked.tool_calls} tool call(s), "
                               f"{worked.tokens} tokens, {worked.seconds:.0f}s: {worked.detail}")

    def _propose_external(self, state: RunState, report) -> None:
        """Wait for an MCP client to drive the round (propose/external.py), then take its
        submitted branches as the round's candidates, as they are: the gate backtests them again."""
        from evotrainer.propose.external import (
            mcp_command,
            playbook_path,
            render_playbook,
            wait_for_agent,
            write_session,
        )
        from evotrainer.tools import TOOLS

        ext, run = self.config.coevolve.external, self.config.run_name
        session = write_session(self.ws.root, run, state.round, self.config)
        alerts = [f"{p.level} {p.dimension}/{p.name} = {p.value:.3f}" for p in report.alerts]
        playbook = playbook_path(self.ws.root)
        playbook.write_text(render_playbook(workdir=self.ws.root.resolve(), run=run, round_index=state.round,
                                            domain=self.config.domain.name, session=session, alerts=alerts,
                                            tools=list(TOOLS.values())), encoding="utf-8")
        self.console.print(f"[bold]round {state.round} waits for an external agent[/] (at most {ext.timeout_s:.0f} s)\n"
                           f"  playbook: {playbook}\n"
                           f"  MCP server (stdio) for your agent: {mcp_command(self.ws.root)}\n"
                           f"  e.g. claude mcp add evotrainer -- {mcp_command(self.ws.root)}\n"
                           "  Ctrl-C is safe: `evotrainer coevolve --resume` waits again")
        waited = wait_for_agent(self.ws.root, run, state.round, timeout_s=ext.timeout_s, poll_s=ext.poll_s,
                                max_submissions=ext.max_submissions)
        taken, skipped = [], []
        for s in waited.submissions[: ext.max_submissions]:
            branch = s["branch"]
            if branch not in self.repo.candidates() or self.repo.resolve(f"refs/heads/{branch}") != s["sha"]:
                skipped.append(branch)  # the gate must test the commit that was submitted
                continue
            if all(c.branch != branch for c in state.candidates):
                head = self.repo.log(rev=f"refs/heads/{branch}", limit=1)[0]
                slug = branch.removeprefix(f"candidate/{state.round}-")
                state.candidates.append(Candidate(slug, branch, None, {}, head.trailers.get("Targets", ""),
                                                  head.trailers.get("Expected", "")))
            taken.append(branch)
        state.agent = {"agent": "external", "outcome": waited.outcome, "seconds": round(waited.seconds, 1),
                       "submitted": len(waited.submissions), "taken": taken, "skipped": skipped,
                       "note": waited.note}
        state.save(self.state_path)
        colour = "yellow" if waited.outcome == "timeout" else "green"
        self.console.print(f"external agent: [{colour}]{waited.outcome}[/] after {waited.seconds:.0f} s, "
                           f"{len(taken)} submission(s) taken"
                           + (f", {len(skipped)} skipped (branch gone or moved): {', '.join(skipped)}" if skipped else ""))

    def stage_backtest(self, state: RunState) -> None:
        selector = Selector(run=self.config.run_name, round=state.round)
        main = self.repo.sources("main")  # read once: every candidate is compared with it
        for c in state.candidates:
            if c.backtest is not None:
                continue
            # The run's own store (config store.url), on the configured executor.
            with Store.open(self.ws.root, self.config.store.url) as store:
                # reuse: a resumed round whose kill came after this report was written
                report = backtest(self.ws.root, c.branch, selector=selector, gate=self.config.gate, store=store,
                                  workers=self.config.executor.workers, executor=self.config.executor.kind,
                                  reuse=True)
            c.backtest, c.decision, c.reasons = report["id"], report["decision"], list(report["reasons"])
            c.gain = gain(report, self.config.gate)
            change = dynamics_change(main, self.repo.sources(c.branch))
            if decision_after_backtest(report, change) == "pilot":
                # replay cannot judge it (nor move its target): the pilot below decides (and is
                # resumable); a gate-passing edit beside it does not promote it on replay alone
                c.decision, c.pilot = "pilot", {"change": change}
            state.save(self.state_path)
            colour = "green" if c.decision == "promote" else "yellow" if c.decision == "pilot" else "red"
            self.console.print(f"  {c.branch}: [{colour}]{c.decision}[/] ({report['id']}) "
                               f"{_decisive(c.reasons)}")
        for c in state.candidates:
            if c.decision == "pilot":
                self._pilot(state, c)

    def _pilot(self, state: RunState, c: Candidate) -> None:
        change = (c.pilot or {}).get("change") or {}
        if self.config.coevolve.pilot_steps == 0:
            c.decision = "reject"
            c.reasons = [f"a change to the training dynamics ({', '.join(change)}) that replay cannot "
                         "judge, and coevolve.pilot_steps is 0"]
        else:
            started = time.perf_counter()
            result = run_pilot(self.config, self.ws.root, self.repo, branch=c.branch, slug=c.slug,
                               targets=c.targets, round_index=state.round, change=change, console=self.console)
            _add_seconds(state, "pilot", time.perf_counter() - started)
            c.decision, c.reasons, c.gain, c.pilot = result.decision, result.reasons, result.gain, result.to_json()
        state.save(self.state_path)
        colour = "green" if c.decision == "promote" else "red"
        self.console.print(f"  {c.branch}: [{colour}]{c.decision}[/] after the pilot: {_decisive(c.reasons)}")

    def stage_promote(self, state: RunState) -> None:
        self._hold_back(state)
        passing = passing_best_first(state.candidates)
        if not passing:
            self.console.print("no candidate passed the gate: main is unchanged")
            return
        best = passing[0]
        from evotrainer.backtest import load_report

        with Store.open(self.ws.root, self.config.store.url) as store:  # the index first, then the file
            report = load_report(self.ws.backtests, best.backtest, store)
        if self.approve is not None:
            if not self.approve(best, report, self.repo.diff("main", report["candidate"])):
                best.decision = "reject"
                best.reasons.append("rejected by the reviewer (--approve)")
                self.console.print(f"{best.branch}: not promoted (reviewer said no)")
                return
        # A kill after the merge and before the state was saved: the promotion is already on main.
        # Otherwise the commit the gate passed is merged, not whatever the branch points at now.
        merge = self.repo.promotion_of(best.branch) or self.repo.promote(
            best.branch, f"passed {'the live pilot after ' if best.pilot else ''}backtest {best.backtest} "
                         f"in round {state.round}", tested=report["candidate"])
        crash_point("coevolve.promoted", best.branch)
        state.pending = Pending(merge=merge, branch=best.branch, skill=best.skill, params=best.params,
                                backtest=best.backtest, target=best.targets, round=state.round)
        self.console.print(f"[green]promoted[/] {best.branch} as {merge[:8]}")

    # -- helpers -----------------------------------------------------------------------------

    def _agent(self):
        from evotrainer.propose import get_agent

        co = self.config.coevolve
        if co.agent == "llm":
            import os

            llm = co.llm
            if llm.mode == "tools":
                return get_agent("llm-tools", base_url=llm.base_url, model=llm.model,
                                 api_key=os.environ.get(llm.api_key_env), temperature=llm.temperature,
                                 max_calls=llm.max_tool_calls, max_total_tokens=llm.max_total_tokens,
                                 max_seconds=llm.max_seconds, max_submissions=llm.max_submissions,
                                 gate=self.config.gate, workers=self.config.executor.workers,
                                 store_url=self.config.store.url)
            return get_agent("llm", base_url=llm.base_url, model=llm.model,
                             api_key=os.environ.get(llm.api_key_env), temperature=llm.temperature,
                             max_retries=llm.max_retries, max_proposals=co.max_proposals)
        return get_agent("rules", enable=list(co.enable_skills))

    def _reload_report(self, state: RunState):
        self.stage_diagnose(state)
        return self.report

    def _finish_round(self, state: RunState) -> None:
        with Store.open(self.ws.root, self.config.store.url) as store:
            run_id = store.run_id(self.config.run_name)
            rnd = next((r for r in store.rounds(run_id) if r["index"] == state.round), None)
            if rnd is not None and state.stage_seconds:  # the round's cost sits beside its results
                store.merge_round_metrics(rnd["id"], {"stage_seconds": dict(state.stage_seconds),
                                                      "beside_seconds": dict(state.beside_seconds)})
        metrics = (rnd or {}).get("metrics") or {}
        promoted = state.pending.branch if state.pending and state.pending.round == state.round else None
        summary = {"round": state.round, "harness": (rnd or {}).get("harness_version", "")[:12],
                   "heldout_success": metrics.get("heldout_success"),
                   "validation_success": metrics.get("validation_success"),
                   "train_reward": metrics.get("train_reward"),
                   "proposals": len(state.candidates),
                   "agent": state.agent,
                   "passed": sum(c.decision == "promote" for c in state.candidates),
                   "promoted": promoted,
                   "verified": state.verdict,
                   "stage_seconds": dict(state.stage_seconds),
                   "beside_seconds": dict(state.beside_seconds),
                   "candidates": [asdict(c) for c in state.candidates]}
        state.history.append(summary)
        self._print_summary(summary)
        state.round += 1
        state.candidates = []
        state.agent = None
        state.verdict = None
        state.stage_seconds = {}
        state.beside_seconds = {}
        state.advance("train", self.state_path)

    def _print_summary(self, s: dict) -> None:
        table = Table(title=f"round {s['round']} (harness {s['harness'][:8]})")
        for col in ("candidate", "backtest", "decision", "gain", "first reason"):
            table.add_column(col)
        for c in s["candidates"]:
            colour = "green" if c["decision"] == "promote" else "red"
            table.add_row(c["branch"], c["backtest"] or "", f"[{colour}]{c['decision']}[/]",
                          f"{c['gain']:+.3f}" if c["gain"] is not None else "",
                          _decisive(c["reasons"])[:60])
        self.console.print(table)
        hs, vs = s["heldout_success"], s.get("validation_success")
        self.console.print(f"held-out success {hs:.3f}" if hs is not None else "held-out success n/a",
                           *([f"· validation {vs:.3f}"] if vs is not None else []),
                           f"· promoted: {s['promoted'] or 'nothing'}")
        if s.get("stage_seconds"):
            self.console.print(describe_cost(s["stage_seconds"], s.get("beside_seconds")))

    def _save_skill(self, pending: Pending, status: str, verdict: Verdict, state: RunState) -> None:
        from evotrainer.skills import SkillLibrary, save_learned

        if pending.skill is None:
            return
        library = SkillLibrary.load(self.ws.root)
        skill = library.get(pending.skill)
        evidence = {"run": self.config.run_name, "round": state.round, "backtest": pending.backtest,
                    "commit": pending.merge, "domain": self.config.domain.name,
                    "params": pending.params, "note": verdict.describe()}
        save_learned(self.ws.root, skill, status, evidence)
        self.console.print(f"skill {pending.skill}: {status}")

    # -- the held-out guard -----------------------------------------------------------------

    def _guard(self, state: RunState) -> None:
        """Check that this round trained on no held-out task, and score reward hacking."""
        from evotrainer.coevolve.heldout import assert_no_heldout_rollouts, check_hacking, round_history

        with Store.open(self.ws.root, self.config.store.url) as store:
            run_id = store.run_id(self.config.run_name)
            assert_no_heldout_rollouts(store, run_id=run_id, round_index=state.round)
            history = [h for h in round_history(store, run_id, decision_split(store.evals(run_id)))
                       if h["round"] <= state.round]
        check = check_hacking(history)
        state.guard = {"round": state.round, "value": check.value, "level": check.level,
                       "describe": check.describe()}
        if check.level in ("warn", "critical"):
            colour = "red" if check.level == "critical" else "yellow"
            self.console.print(f"[{colour}]held-out guard: {check.describe()}")

    def _add_guard_probe(self, state: RunState) -> None:
        """The trusted reward-hacking value joins the health report as a probe (replacing a harness
        probe of the same name), so every agent sees it among the alerts."""
        from evotrainer.coevolve.heldout import CRITICAL, PROBE, WARN
        from evotrainer.diagnose import ProbeResult

        if state.guard is None or state.guard.get("round") != state.round:
            self._guard(state)
        g = state.guard
        self.report.probes = [p for p in self.report.probes if p.name != PROBE]
        self.report.probes.append(ProbeResult(PROBE, "result", g["value"], g["level"], WARN, CRITICAL, "above"))

    def _hold_back(self, state: RunState) -> None:
        """Under a critical reward-hacking alert only a change that targets a safety metric (a fix
        for the hack) may be promoted; the rest are held back with the reason."""
        from evotrainer.backtest import SAFETY_METRICS
        from evotrainer.backtest.gate import targets_from_trailer

        if not state.guard or state.guard.get("level") != "critical":
            return
        for c in state.candidates:
            if c.decision == "promote" and not set(targets_from_trailer(c.targets)) & set(SAFETY_METRICS):
                c.decision = "reject"
                c.reasons.append(f"held back by the held-out guard: {state.guard['describe']}")
                self.console.print(f"{c.branch}: held back (reward-hacking alert is critical)")

    def _revert(self, state: RunState, pending: Pending, verdict: Verdict, why: str | None = None) -> None:
        why = f"live verification in round {state.round}: {why or verdict.describe()}"
        sha = self.repo.revert_of(pending.merge) or self.repo.revert(pending.merge, why)
        crash_point("coevolve.reverted", pending.branch)
        self.console.print(f"[red]reverted[/] {pending.branch} ({sha[:8]}): {why}")
        self._save_skill(pending, "failed", verdict, state)
        self._revise_diagnostics(state, pending, verdict)

    def _revise_diagnostics(self, state: RunState, pending: Pending, verdict: Verdict) -> None:
        """The backtest predicted a gain and live training disagreed: add the probe that would
        have flagged the change. Probes do not change training, so this commit skips the gate."""
        from evotrainer.coevolve.probes import failure_reward_probe, has_probe

        sources = self.repo.sources("main")
        if has_probe(sources.get("diagnostics.py", ""), FAILURE_PROBE):  # parsed: a mention is not the probe
            return
        new = sources["diagnostics.py"].rstrip("\n") + "\n\n" + failure_reward_probe(FAILURE_PROBE)
        slug = f"probe-{FAILURE_PROBE.replace('_', '-')}"
        branch = f"candidate/{state.round}-{slug}"
        if branch in self.repo.candidates():  # a kill came between propose and promote
            tested = self.repo.resolve(f"refs/heads/{branch}")
        else:
            cand = self.repo.propose(
                state.round, slug, {"diagnostics.py": new},
                diagnosis=f"{pending.branch} passed its backtest on {pending.target} but {verdict.describe()}",
                targets="diagnostics",
                expected=f"alert when verified failures earn training reward, as under {pending.branch}")
            branch, tested = cand.branch, cand.sha
        self.repo.promote(branch, "diagnostics revision after a live contradiction", tested=tested)


def _add_seconds(state: RunState, stage: str, seconds: float) -> None:
    state.stage_seconds[stage] = state.stage_seconds.get(stage, 0.0) + seconds


def _decisive(reasons: list[str]) -> str:
    """The reason worth a table cell: the reviewer's word or the target check, not the fault check."""
    for key in ("reviewer", "pilot", "target", "safety", "failed"):
        for r in reasons:
            if key in r:
                return r
    return reasons[0] if reasons else ""
