"""The ``berth`` command line.

Thin by design: each command parses flags into berth's validated types, calls the library and
renders the result with rich.  Every ``BerthError`` (bad input, no capacity) is printed as one
clear line on stderr with exit status 2 — never a traceback.

That rule is enforced once, by the app's command group (:class:`OneLineErrors`), so it holds
for every command registered on the app and under typer's ``CliRunner`` as well as from a
shell: usage errors (an unknown option, ``--nodes abc``, a missing ``--config``) are one line
too, naming the flag, instead of click's usage block.  Each command names the flags the user
typed in its errors (``--layer``, ``--node``), not the model fields they set
(:func:`~berth.validation.fields_as`), and counts have ceilings
(:data:`~berth.cli.embedded.MAX_CLUSTER_NODES`, :data:`~berth.cli.embedded.MAX_WORKLOADS`).

This module is the app, its one-line errors and the one place every command is registered —
each once, in the order ``berth --help`` lists them; the commands live in a module per command
group (:mod:`berth.cli.embedded`, :mod:`~berth.cli.sim`, :mod:`~berth.cli.agent`,
:mod:`~berth.cli.scheduler`, :mod:`~berth.cli.up`, :mod:`~berth.cli.placement`,
:mod:`~berth.cli.workloads`, :mod:`~berth.cli.nodes`, :mod:`~berth.cli.deploy`,
:mod:`~berth.cli.api`, :mod:`~berth.cli.microvm`, :mod:`~berth.cli.images`).

Every command starts here, so what is loaded at start-up is kept small: the command modules
import only typer, rich and their flags' defaults (a command imports what it runs — the
models, the API's client, asyncio, NATS — in its body), ``import berth`` loads nothing more
(its public names are imported on first use), and the commands are registered
:class:`Deferred`: typer builds the one that runs, not all of them, and ``sim`` and ``demo``
are not imported at all before they run.  ``tests/unit/test_layout.py`` holds the import set
so; ``benchmarks/cli_startup.py`` times it.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from berth.cli.agent import agent
from berth.cli.api import api_app
from berth.cli.deploy import register as register_deploy
from berth.cli.embedded import cluster, schedule
from berth.cli.images import images_app
from berth.cli.microvm import register as register_microvm
from berth.cli.nodes import cordon, drain, nodes, uncordon
from berth.cli.placement import place, routes, whereis
from berth.cli.scheduler import scheduler
from berth.cli.up import up
from berth.cli.workloads import explain, logs, ps, run, stop
from berth.errors import BerthError

__all__ = ["Deferred", "OneLineErrors", "app", "main"]

errors = Console(stderr=True)


def _usage_errors() -> tuple[type[Exception], ...]:
    """What typer raises for a usage error: its own ``TyperException`` since typer 0.26
    (which vendors click), click's ``ClickException`` before — asked when an error is caught:
    click, if it is not loaded, has raised nothing (and is not imported for nothing)."""
    kinds: list[type[Exception]] = []
    vendored = getattr(typer, "TyperException", None)
    if isinstance(vendored, type) and issubclass(vendored, Exception):
        kinds.append(vendored)
    click = sys.modules.get("click")
    if click is not None:
        kinds.append(click.ClickException)
    return tuple(kinds)


def fail(message: str) -> None:
    """Print ``message`` as berth's one error line on stderr."""
    from berth.validation import one_line

    errors.print(
        f"[bold red]error:[/] {escape(one_line(message))}", highlight=False, soft_wrap=True
    )


class Deferred(TyperCommand):
    """A command that ``berth --help`` lists by its name and help alone: the real command is
    built from its function — typer reading the signature, every flag and its default — only
    when it runs or shows its own help, and its module imported then if it is not yet.

    Every command registered here is one, so a command builds itself, not the ~25 others
    (typer would build them all, a sixth of ``berth ps --help``'s time).  ``sim`` and ``demo``
    are not even imported before: their flags take their defaults and choices from the
    simulator's models (the scheduler, numpy).  :class:`OneLineErrors` swaps the real command
    in the first time it is asked for one outside its own help.
    """

    target: tuple[str, str] = ("", "")
    """The module and the function that are the command."""

    def load(self) -> Any:
        """The real command: its function registered on an app of its own, as berth's app
        would register it (typer's ``get_command`` of a one-command app is that command)."""
        module, function = self.target
        alone = typer.Typer(
            pretty_exceptions_enable=False,
            add_completion=False,
            rich_markup_mode=self.rich_markup_mode,  # berth's app's, which built this one
        )
        alone.command(self.name)(getattr(importlib.import_module(module), function))
        return typer.main.get_command(alone)


class OneLineErrors(TyperGroup):
    """berth's command group: every error a command or its flags raise is one line.

    ``BerthError`` → ``error: <field>: <message>``, exit status 2; a usage error (unknown
    option, a value typer cannot convert, a missing option) → ``error: <what click says>``
    with its exit status (2); an ``OSError`` (a disk that filled up) → one line, status 1.

    It also loads :class:`Deferred` commands: its own help lists them as they are (a name and
    a line of help), anything else that asks for one (running it, its ``--help``, completion)
    gets the real command.
    """

    _listing = False
    """Whether the group's own help is being written (the commands are only listed)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if isinstance(command, Deferred) and not self._listing:
            command = self.commands[cmd_name] = command.load()
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            result = super().main(
                args, prog_name, complete_var, False, windows_expand_args, **extra
            )
        except _usage_errors() as error:
            if not standalone_mode:
                raise
            usage: Any = error
            if type(error).__name__ == "NoArgsIsHelpError":  # ``berth`` alone: the help
                usage.show()
            else:  # typer words a conversion error as pydantic does; say it plainly
                message = str(usage.format_message()).replace("Value error, ", "")
                fail(message.replace("Input should be", "must be"))
            sys.exit(usage.exit_code)
        except BerthError as error:
            if not standalone_mode:
                raise
            fail(str(error))
            sys.exit(2)
        except typer.Abort:
            if not standalone_mode:
                raise
            fail("aborted")
            sys.exit(1)
        except OSError as error:
            if not standalone_mode:
                raise
            from berth.validation import shown

            where = f"{shown(error.filename)}: " if error.filename else ""
            fail(f"{where}{error.strerror or error}")
            sys.exit(1)
        if not standalone_mode:
            return result
        sys.exit(result if isinstance(result, int) and not isinstance(result, bool) else 0)


app = typer.Typer(
    name="berth",
    help="berth decides which node runs each workload, and makes the decision stick.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion: bash, zsh, fish, PowerShell
    cls=OneLineErrors,
    rich_markup_mode="rich",  # typer's default, said: help texts are markup (a `[` is `\[`)
)


def _version(asked: bool) -> None:
    if asked:  # the installed package's version, which is berth.__version__ (pyproject)
        from importlib.metadata import version

        typer.echo(f"berth {version('berth')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print berth's version and exit."
        ),
    ] = False,
) -> None:
    """berth decides which node runs each workload, and makes the decision stick."""


# Every command, registered once, here: commands in the order ``berth --help`` lists them,
# then the command groups (typer lists those after the commands).  A command's name is its
# function's.
def _commands(*commands: Callable[..., Any]) -> None:
    for command in commands:
        _deferred(command.__name__, command.__module__, inspect.getdoc(command) or "")


def _deferred(name: str, module: str, help: str) -> None:
    """Register ``module``'s function ``name`` as the command ``name``, deferred
    (:class:`Deferred`): ``help`` is its docstring, which ``berth --help`` lists (for the
    commands of a module not imported yet, written here: ``tests/unit/test_sim_cli.py``
    checks that the two agree)."""

    class Command(Deferred):
        target = (module, name)

    def listed() -> None:
        """Stands in for the command in ``berth --help``; the real one runs."""

    app.command(name, cls=Command, help=help)(listed)


_commands(schedule, cluster)
# sim, demo (berth.cli.sim): their flags are defined from the simulator's models
_deferred(
    "sim",
    "berth.cli.sim",
    "Compare placement policies on a simulated cluster fed by Docker Hub image layers.",
)
_deferred(
    "demo",
    "berth.cli.sim",
    "A short fixed scenario: explained placements, then the policy comparison.",
)
_commands(agent, scheduler, up, place, whereis, routes)
app.add_typer(api_app, name="api")
register_microvm(app)  # the microvm group: microvm setup
_commands(run, ps, logs, stop, nodes, explain, cordon, uncordon, drain)
app.add_typer(images_app, name="images")
register_deploy(app)  # deploy


def main() -> None:
    """Console-script entry point: run the app, turning berth errors into one clear line."""
    try:
        app()
    except BerthError as error:
        errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
