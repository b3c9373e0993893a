"""A rich progress bar for GRPO steps that shows reward, verified success and step time."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import TrainerCallback

from evotrainer.crashpoints import crash_point


def make_progress(console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False,
    )


class ProgressCallback(TrainerCallback):
    """Advances one progress task per optimizer step and keeps the last logged metrics."""

    def __init__(self, progress: Progress, task_id):
        self.progress = progress
        self.task_id = task_id
        self.history: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.progress.update(self.task_id, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:
            return
        self.history.append(dict(logs))
        info = (f"reward {logs['reward']:.3f}  success {logs.get('verified/success', 0):.2f}  "
                f"kept {logs.get('harness/kept_ratio', 1):.2f}  step {logs.get('step_time', 0):.1f}s")
        self.progress.update(self.task_id, info=info)
        if not self.progress.console.is_terminal:  # a log or a pipe sees no live bar: one line a step
            task = next(t for t in self.progress.tasks if t.id == self.task_id)
            self.progress.console.print(f"{task.description} step {state.global_step}/{task.total:g}: {info}")


class CrashPointCallback(TrainerCallback):
    """Crash points inside a training round (evotrainer/crashpoints.py): `train.mid_step` after a
    step's rollouts are stored and its loss is backpropagated but before the optimizer steps,
    `train.step_end` between two steps. Qualified by the run name."""

    def __init__(self, run: str):
        self.run = run

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        crash_point("train.mid_step", self.run)

    def on_step_end(self, args, state, control, **kwargs):
        crash_point("train.step_end", self.run)
