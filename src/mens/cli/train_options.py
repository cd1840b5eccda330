"""`mens train`'s options, generated: one per training-config field (help = the field's docstring, default = the
field's), the original's flags, and the command's own options. Adding a setting is adding a config field.

Typer reads a command's options from its function signature, so the command is a function whose `__signature__`
is built here from the config (typer documents no other way to declare options from data).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Literal, get_args, get_origin

import typer

from mens.train.config import SPECS, Spec
from mens.train.original_flags import FLAGS

ARGS_HELP = ("A config file (YAML of the training config's shape, e.g. a run's config.yaml), then key.sub=value "
             "overrides (schedule.max_steps=100). Precedence: defaults < preset < file < overrides < flags.")


def _own() -> list[inspect.Parameter]:
    """The command's options that are not training settings."""
    own = [
        ("print_config", bool, typer.Option(False, "--print-config", help="Print the resolved config as YAML and "
                                                                           "exit (nothing is trained).")),
        ("background", bool, typer.Option(False, "--background", help="Detach: write OUT/config.yaml, relaunch "
                                                                       "`mens train OUT/config.yaml` in a new "
                                                                       "session, log to --log-dir.")),
        ("log_dir", Path, typer.Option(None, "--log-dir", help="Log directory; implies --background (default "
                                                               "OUT/logs).")),
        ("gate", Path, typer.Option(None, "--gate", help="After training: eval-local + these gates (verdict in "
                                                         "manifest).")),
        ("gate_bench", str, typer.Option(None, "--gate-bench", help="Bench for --gate (default: vox_default, "
                                                                    "held-out).")),
        ("gate_limit", int, typer.Option(None, "--gate-limit", help="Evaluate only the first N held-out tasks for "
                                                                    "--gate.")),
    ]
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=kind)
            for name, kind, opt in own]


OWN = ("print_config", "background", "log_dir", "gate", "gate_bench", "gate_limit")


def option_type(spec: Spec) -> type:
    """The command-line type of a setting: choices and text are str, a dict is repeated KEY=VALUE strings."""
    kind = spec.field.annotation
    if get_origin(kind) is Literal:
        return str
    args = [a for a in get_args(kind) if a is not type(None)]
    if any(get_origin(a) is Literal for a in args):  # a number or a word ("epoch"): parsed by the config
        return str
    if args:  # X | None
        kind = args[0]
    return list[str] if kind is dict else kind


def config_option(spec: Spec) -> typer.models.OptionInfo:
    """The option of one config field: its flags (a bool gets --x/--no-x), the docstring as help, its default."""
    kind = option_type(spec)
    names = spec.flags
    if kind is bool:
        names = (f"{names[0]}/--no-{names[0][2:]}", *names[1:])
    default = spec.field.get_default(call_default_factory=True)
    shown = "unset" if default is None else (str(default) if default not in ("", {}) else False)
    return typer.Option(None, *names, help=spec.doc, show_default=shown,
                        rich_help_panel=f"{spec.section or 'run'} settings")


def _config() -> list[inspect.Parameter]:
    return [inspect.Parameter(spec.flat, inspect.Parameter.KEYWORD_ONLY, default=config_option(spec),
                              annotation=option_type(spec)) for spec in SPECS.values()]


def _original() -> list[inspect.Parameter]:
    return [inspect.Parameter(f.key, inspect.Parameter.KEYWORD_ONLY, annotation=f.kind,
                              default=typer.Option(None, f.name, help=f.help, rich_help_panel="the original's flags"))
            for f in FLAGS]


def train_command(body: Callable[[dict], int], doc: str) -> Callable[..., int]:
    """A typer command function: `[CONFIG.yaml] [KEY=VALUE]...` and every option above; calls body(values)."""
    params = [inspect.Parameter("args", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=list[str] | None,
                                default=typer.Argument(None, metavar="[CONFIG.yaml] [KEY=VALUE]...", help=ARGS_HELP,
                                                       show_default=False)),
              *_config(), *_original(), *_own()]

    def train(**values) -> int:
        return body(values)

    train.__signature__ = inspect.Signature(params, return_annotation=int)
    train.__annotations__ = {p.name: p.annotation for p in params} | {"return": int}
    train.__doc__ = doc
    return train
