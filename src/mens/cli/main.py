"""The `mens` command: the command table and the error-to-exit-code mapping, nothing else.

Each command group lives in its own module under `mens.cli` and imports heavy libraries (torch,
transformers) inside the command function, so `mens --help` and the corpus tools start instantly.
"""

from __future__ import annotations

import sys

import typer

from mens.errors import MensError

app = typer.Typer(
    name="mens",
    help="Turn a language's own sources and docs into a fine-tuned code assistant that writes code that parses.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_state = {"debug": False}


def _print_version(value: bool) -> None:
    if value:
        from mens import __version__

        typer.echo(f"mens {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", is_eager=True, callback=_print_version
    ),
) -> None:
    _state["debug"] = debug


def _register() -> None:
    # Command groups: each module exposes `register(app)`. Only commands that work are registered.
    from mens.cli import after, chat, corpus, dogfood, export, lab, models, publish, train, vox

    vox.register(app)
    corpus.register(app)
    train.register(app)
    models.register(app)
    lab.register(app)
    after.register(app)
    publish.register(app)
    chat.register(app)
    export.register(app)
    dogfood.register(app)


_register()


def _allocator(args: list[str]) -> None:
    """Training commands run on mimalloc (mens.train.allocator says why): re-execute once with it preloaded."""
    import os

    from mens.train import allocator

    command = next((a for a in args if not a.startswith("-")), None)
    if command in allocator.COMMANDS and not {"--help", "-h"} & set(args):
        problem = allocator.choice_problem(os.environ)
        if problem:
            typer.secho(f"error: {problem}", err=True, fg=typer.colors.RED)
            sys.exit(2)
        allocator.reexec(args)  # returns when there is nothing to do (already preloaded, system, not installed)
    allocator.settle()  # in the re-executed process: children get the parent's LD_PRELOAD back


def _quiet_optional_kernels() -> None:
    """bitsandbytes, imported on a CPU with AVX512-BF16, warns that it could not fetch an optional kernel from the
    Hub (`pip install kernels`) and falls back to its own; mens never fetches code from the Hub, so the warning
    would only tell every user on such a CPU to install something mens does not want. Errors still show."""
    import logging

    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, map MensError to its exit code with one clear line."""
    try:  # typer >= 0.20 vendors click; older typer uses the click package
        from typer._click.exceptions import ClickException
    except ImportError:  # pragma: no cover
        from click.exceptions import ClickException

    args = sys.argv[1:] if argv is None else argv
    _state["debug"] = "--debug" in args
    _quiet_optional_kernels()
    if argv is None:  # a real process start (tests call main with arguments and stay in their process)
        _allocator(args)
    try:
        rv = app(args=args, prog_name="mens", standalone_mode=False)
    except MensError as e:
        if _state["debug"]:
            raise
        typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
        sys.exit(e.exit_code)
    except ClickException as e:  # usage errors: bad flag, missing argument
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `mens`: help is already printed
            sys.exit(0)
        e.show()
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except BrokenPipeError:  # `mens vox check --json … | head`
        sys.exit(0)
    except OSError as e:  # a full disk, a permission, a vanished file: what and where, in one line
        if _state["debug"]:
            raise
        where = f": {e.filename}" if e.filename else ""
        typer.secho(f"error: {e.strerror or e}{where} (errno {e.errno}); free space or fix the path's permissions, "
                    "then run the command again (finished outputs and checkpoints are kept)", err=True,
                    fg=typer.colors.RED)
        sys.exit(2)
    except Exception as e:  # a bug in mens: one line and how to see more, never a bare traceback
        if _state["debug"]:
            raise
        typer.secho(f"internal error (a bug in mens): {type(e).__name__}: {e}; run the command again with --debug "
                    "for the traceback and report it", err=True, fg=typer.colors.RED)
        sys.exit(3)
    sys.exit(rv if isinstance(rv, int) else 0)
