"""An arm trained beside other work: the control arm next to the main round, a pilot's base arm
next to its candidate.

On a CPU the policy's small matrix products and per-operator work gain little from a second
thread (the default math step on a 2-core Xeon: 6.9 s alone on 2 threads, 8.3 s on 1 beside the
control arm), so two arms trained at once, in two processes with half the cores each, finish well
before the same two one after the other (`bench/parallel_arms.py` prints the ratio).
`coevolve.parallel_arms` decides: `auto` is on for a single process with no CUDA device and at
least two cores, where the arms share nothing but the CPU; false trains the side arm first, in
this process.

The side arm runs in a spawned process under the same config, seed and task history as it would
in this one; matrix products split over fewer threads add in another order, so its numbers
match the one-after-the-other run only to float rounding. Its console, stdout and stderr go to
`<workdir>/logs/<run>-round-<k>.log`. The side arm is joined before the stage ends; a failure
there fails the stage with the log's tail, and an interrupt here stops it too (its round is left
unfinished and trains again on `--resume`, as a killed arm always has).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from evotrainer.config import Config
from evotrainer.dist import distributed, usable_cpus
from evotrainer.errors import EvotrainerError
from evotrainer.harness.repo import HarnessRepo

# How long a side arm gets to stop after SIGTERM before it is killed.
_STOP_WAIT_S = 10.0


class SideArmError(EvotrainerError, RuntimeError):
    """The side arm's process failed; the message carries its log's tail."""


@dataclass(frozen=True)
class SideArm:
    """Round `index` of run `run_name` under harness revision `rev`; see control.train_arm."""

    run_name: str
    rev: str
    start_round: int | None
    index: int
    what: str
    steps: int | None = None
    heldout: bool | None = True  # see control.train_arm


@dataclass
class Beside:
    """What the side arm did: trained (False when its round was already done), its own wall
    seconds, and whether it ran in parallel (else it ran first, in this process)."""

    parallel: bool
    trained: bool = False
    seconds: float = 0.0


def parallel_arms(config: Config) -> bool:
    """Whether arms train side by side here (`coevolve.parallel_arms`; see the module doc)."""
    mode = config.coevolve.parallel_arms
    if mode != "auto":
        return bool(mode)
    import torch

    return not distributed() and not torch.cuda.is_available() and usable_cpus() >= 2


def log_path(root: Path, arm: SideArm) -> Path:
    return root / "logs" / f"{arm.run_name}-round-{arm.index}.log"


@contextmanager
def beside(config: Config, root: Path, repo: HarnessRepo, arm: SideArm, console: Console) -> Iterator[Beside]:
    """Train `arm` while the block runs (in parallel) or before it (not); see the module doc."""
    if not parallel_arms(config):
        out = Beside(parallel=False)
        started = time.perf_counter()
        out.trained = _train(config, root, repo, arm, console)
        out.seconds = time.perf_counter() - started
        yield out
        return
    threads = max(1, usable_cpus() // 2)
    with _threads(threads):  # both arms' share, even when the side arm finished before a resume
        yield from _parallel(config, root, repo, arm, console, threads)


def _parallel(config: Config, root: Path, repo: HarnessRepo, arm: SideArm, console: Console,
              threads: int) -> Iterator[Beside]:
    """The body of beside() when the arms run in parallel: start the side arm, run the block, join."""
    from evotrainer.coevolve.control import arm_done, copy_memory_file

    out = Beside(parallel=True)
    if arm_done(root, config, arm.run_name, arm.index):  # a resumed stage: nothing to start
        yield out
        return
    if arm.start_round is not None:  # before the main round's curriculum refills the memory
        copy_memory_file(root, config.run_name, arm.run_name)
    log = log_path(root, arm)
    log.parent.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    results, result_end = ctx.Pipe(duplex=False)
    lifeline_end, lifeline = ctx.Pipe(duplex=False)  # its EOF tells the side arm this process died
    proc = ctx.Process(target=_child, args=(config, root, repo.path, arm, log, threads, result_end, lifeline_end),
                       name=f"evotrainer {arm.what}")
    started = time.perf_counter()
    proc.start()
    result_end.close()
    lifeline_end.close()
    console.print(f"{arm.what}: round {arm.index} trains beside, {threads} thread(s) each (log: {log})")
    try:
        yield out
        result = _receive(results)
        proc.join()
    except BaseException:
        _stop(proc)
        raise
    finally:
        lifeline.close()
    out.seconds = time.perf_counter() - started
    if result is None or "error" in result or proc.exitcode != 0:
        raise SideArmError(f"{arm.what} failed (exit code {proc.exitcode}): "
                           f"{(result or {}).get('error') or 'it ended without a result'}; "
                           f"the end of its log {log}:\n{_tail(log)}")
    out.trained = result["trained"]
    console.print(f"{arm.what}: {_scores(config, root, arm)} ({out.seconds:.0f} s beside)")


@contextmanager
def _threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _train(config: Config, root: Path, repo: HarnessRepo, arm: SideArm, console: Console,
           copy_memory: bool = True) -> bool:
    from evotrainer.coevolve.control import train_arm

    with repo.load(arm.rev) as harness:
        return train_arm(config, root, arm.run_name, harness, arm.start_round, arm.index, console,
                         what=arm.what, steps=arm.steps, heldout=arm.heldout, copy_memory=copy_memory)


def _child(config: Config, root: Path, repo_path: Path, arm: SideArm, log: Path, threads: int, writer,
           lifeline) -> None:
    """The side arm's process: everything it prints goes to `log`; one result dict to `writer`.
    The parent copied the main run's replay memory already; when it dies (the lifeline's EOF),
    this process ends too, so a resume never finds an orphan still training the same round."""
    threading.Thread(target=_exit_with_parent, args=(lifeline,), daemon=True).start()

    with open(log, "a", encoding="utf-8", buffering=1) as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        sys.stdout, sys.stderr = f, f
        import torch

        from evotrainer.cli.main import quiet_libraries

        quiet_libraries()
        torch.set_num_threads(threads)
        console = Console(file=f, width=120, force_terminal=False)
        try:
            trained = _train(config, root, HarnessRepo(repo_path), arm, console, copy_memory=False)
            writer.send({"trained": trained})
        except BaseException as e:
            traceback.print_exc(file=f)
            writer.send({"error": f"{type(e).__name__}: {e}"})
            raise SystemExit(1) from None


def _scores(config: Config, root: Path, arm: SideArm) -> str:
    """What the arm's round measured, read back from the store."""
    from evotrainer.coevolve.control import describe_scores
    from evotrainer.store import Store

    with Store.open(root, config.store.url) as store:
        run_id = store.run_id(arm.run_name)
        rnd = next((r for r in store.rounds(run_id) if r["index"] == arm.index), None) if run_id else None
    metrics = (rnd or {}).get("metrics") or {}
    return describe_scores(metrics.get("heldout_success"), metrics.get("validation_success"))


def _exit_with_parent(lifeline) -> None:
    try:
        lifeline.recv()
    except (EOFError, OSError):
        pass
    os._exit(1)


def _receive(reader) -> dict | None:
    """The side arm's result, waiting for it; None when it died without sending one."""
    try:
        return reader.recv()
    except EOFError:
        return None


def _stop(proc) -> None:
    if proc.is_alive():
        proc.terminate()
        proc.join(_STOP_WAIT_S)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


__all__ = ["Beside", "SideArm", "SideArmError", "beside", "log_path", "parallel_arms"]
