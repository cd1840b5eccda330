"""`mens export RUN|MERGED --gguf`: a GGUF file for llama.cpp and Ollama (torch is imported inside the command)."""

from __future__ import annotations

from pathlib import Path

import typer

from mens.errors import UsageError


def register(app: typer.Typer) -> None:
    app.command("export")(export)


def export(
    source: Path = typer.Argument(..., help="Run directory (its adapter is merged first) or merged model directory."),
    gguf: bool = typer.Option(False, "--gguf", help="Write a GGUF file for llama.cpp and Ollama."),
    quant: str = typer.Option("f16", "--quant", help="f16, q8_0 or q4_k_m (q4_k_m needs llama-cpp-python)."),
    output: Path | None = typer.Option(None, "--output", "-o",
                                       help="New directory for the export (default: SOURCE-gguf-QUANT beside it)."),
) -> int:
    """Export a run or merged model with llama.cpp's own converter: OUT/<name>-<quant>.gguf, an Ollama Modelfile
    FROM it whose template and system prompt match training, and ready llama.cpp/Ollama commands."""
    if not gguf:
        raise UsageError("choose what to export: --gguf (a GGUF file for llama.cpp and Ollama); for vLLM and "
                         "transformers use `mens merge RUN -o DIR`")
    from mens.merge.gguf import export_gguf
    from mens.run_records import SERVING

    result = export_gguf(source, output, quant=quant, progress=lambda msg: typer.echo(msg, err=True))
    typer.echo(f"wrote {result.gguf}")
    if result.modelfile:
        typer.echo(f"wrote {result.modelfile}; Ollama: cd {result.out_dir.resolve()} && ollama create {result.name} "
                   f"-f Modelfile && ollama run {result.name}")
    else:
        typer.echo(result.note)
    typer.echo(f"ready commands: {result.out_dir / SERVING}")
    return 0
