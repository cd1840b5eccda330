"""`mens vox check`: parse Vox files or folders and report verdicts, declarations and diagnostics."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mens.errors import UsageError

vox_app = typer.Typer(help="The Vox language frontend.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(vox_app, name="vox")


def _collect(paths: list[Path], extensions: tuple[str, ...]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(extensions)))
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(f"{p}: no such file or folder; pass .vox files or folders that contain them")
    return files


@vox_app.command("check")
def check(
    paths: list[Path] = typer.Argument(..., help="A .vox file or a folder (searched recursively)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per file on stdout."),
    mode: str = typer.Option("module", "--mode", help="module (upstream CI definition) or script."),
) -> int:
    """Parse Vox sources. Exit 0 when all parse, 1 when any fails, 2 on usage or I/O errors."""
    if mode not in ("module", "script"):
        raise UsageError(f"--mode must be 'module' or 'script', got {mode!r}")
    from mens.lang.vox import VOX, parse_file_text

    files = _collect(paths, VOX.file_extensions)
    if not files:
        raise UsageError(f"no Vox files ({', '.join(VOX.file_extensions)}) under {', '.join(map(str, paths))}")
    n_failed = 0
    for f in files:
        try:
            text = f.read_bytes().decode("utf-8")
        except OSError as e:
            raise UsageError(f"{f}: cannot read: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise UsageError(f"{f}: not UTF-8 (byte {e.start}); Vox sources must be UTF-8 text") from None
        res = parse_file_text(text, str(f), mode)  # `.vox.ui` files parse as reactive modules
        n_failed += not res.ok
        if as_json:
            typer.echo(json.dumps({"path": str(f), "ok": res.ok, "decls": [list(d) for d in res.decls],
                                   "diagnostics": [d.to_json() for d in res.diagnostics]}))
            continue
        for d in res.diagnostics:
            color = typer.colors.RED if d.severity == "error" else typer.colors.YELLOW
            typer.secho(f"{f}:{d.line}:{d.col}: {d.severity}[{d.cls}]: {d.message}", fg=color)
    if not as_json:
        typer.echo(f"{len(files) - n_failed}/{len(files)} files parse ({mode} mode)")
    return 1 if n_failed else 0
