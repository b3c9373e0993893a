"""What the command modules share: the common options, the workspace folder, and the group that
shows a UserError as one `Error:` line with exit code 2."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from typer.core import TyperGroup

from evotrainer.errors import UserError

WorkdirOpt = typer.Option(
    None, "--workdir", "-w", help="Workspace folder (store.db, adapters/, backtests/...). "
    "Default: $EVOTRAINER_WORKDIR or ./evotrainer-work.")
DomainOpt = typer.Option(None, "--domain", "-d", help="Task domain: math, code, swe, a name `evotrainer domains` "
                         "lists, or package.module:factory (default: the config's domain.name, else math).")
ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config (default: configs/DOMAIN.yaml).")
OverridesArg = typer.Argument(None, help="Config overrides as key.sub=value, e.g. train.seed=1.")


def resolve_workdir(workdir: Path | None) -> Path:
    return Path(workdir or os.environ.get("EVOTRAINER_WORKDIR", "evotrainer-work"))


class UserErrorGroup(TyperGroup):
    """A command group whose commands raise UserError for bad input. Here, and only here, it
    becomes `Error: <message>` on stderr and exit code 2; every other exception is a bug and
    keeps its traceback. Each sub-app uses it too, so a sub-app run on its own (as the tests
    do) answers the same way as through `evotrainer`."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            typer.echo(f"{typer.style('Error:', fg='red', bold=True)} {exc}", err=True)
            raise typer.Exit(2) from None
