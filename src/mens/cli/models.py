"""Commands that load a model: `mens eval-local`, `mens merge` (aliases merge-qlora, merge-adapter), `mens serve`.

torch and transformers are imported inside each command, never at CLI start.
"""

from __future__ import annotations

from pathlib import Path

import typer

from mens.errors import UsageError


def register(app: typer.Typer) -> None:
    app.command("eval-local")(eval_local)
    app.command("merge")(merge)
    app.command("merge-qlora", hidden=True)(merge)
    app.command("merge-adapter", hidden=True)(merge)
    app.command("serve")(serve)


def eval_local(
    path: Path = typer.Argument(..., help="Run directory (base + adapter) or model directory."),
    bench: str = typer.Option("vox_default", "--bench", help="Bench JSONL, manifest.json, or vox_default."),
    k: int = typer.Option(1, "--k", min=1, help="Samples per task (k > 1 samples at temperature 0.7)."),
    modes: str = typer.Option("greedy", "--modes", help="Comma list of decoding modes: greedy, retry, constrained."),
    compare_base: bool = typer.Option(False, "--compare-base", help="Also evaluate the base model (greedy)."),
    split: str = typer.Option("heldout", "--split", help="Bench split: heldout, dev or all."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Evaluate only the first N tasks."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", min=1),
    output: Path | None = typer.Option(None, "--output", "-o", help="Report path (RUN/benchmark_results.json)."),
    gates: Path | None = typer.Option(None, "--gates", help="Check these gates after evaluating (exit 1 on a miss)."),
    language: str = typer.Option("vox", "--language"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
) -> int:
    """Generate answers to a bench, parse and check them; report parse rate, pass@k, failures."""
    from rich.progress import Progress

    from mens.evaluate.local import eval_local as run

    with Progress(transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(mode: str, i: int, n: int) -> None:
            if mode not in tasks:
                tasks[mode] = bar.add_task(f"eval {mode}", total=n)
            bar.update(tasks[mode], completed=i)

        out = run(path, bench, language=language, k=k, modes=[m.strip() for m in modes.split(",") if m.strip()],
                  compare_base=compare_base, split=split, limit=limit, max_new_tokens=max_new_tokens,
                  output=output, device=device, progress=progress)
    import json

    report = json.loads(out.read_text(encoding="utf-8"))
    for mode, m in report["modes"].items():
        at_k = f"  pass@{k} {m['pass_at_k']:.3f}" if k > 1 else ""
        typer.echo(f"{mode:12s} non-empty parse rate {m['nonempty_parse_rate']:.3f}  pass@1 {m['pass_at_1']:.3f}"
                   f"{at_k}  coverage {m['coverage']:.3f}  ({m['tasks']} tasks)")
    if report.get("base"):
        b = report["base"]["metrics"]
        typer.echo(f"{'base':12s} non-empty parse rate {b['nonempty_parse_rate']:.3f}  pass@1 {b['pass_at_1']:.3f}")
    typer.echo(f"wrote {out}")
    if gates is not None:
        from mens.evaluate.gates import check_gates, summary_lines
        from mens.run_records import BENCHMARK

        if out.parent.resolve() != Path(path).resolve() or out.name != BENCHMARK:
            raise UsageError("--gates needs the report in the run directory; drop --output")
        for line in summary_lines(check_gates(path, gates)):
            typer.echo(line)
    return 0


def merge(
    run: Path = typer.Argument(..., help="Run directory: a LoRA/QLoRA adapter, or a full fine-tune to export."),
    output: Path = typer.Option(..., "--output", "-o", help="New directory for the merged model."),
    skip_sha_check: bool = typer.Option(False, "--skip-sha-check", help="Merge even if the base weights changed."),
) -> int:
    """Merge the adapter into full-precision base weights (a full fine-tune: export its weights) as a plain
    Hugging Face model directory with serving hand-off files."""
    from mens.merge.merge import merge_adapter
    from mens.run_records import HANDOFF, SERVING

    out = merge_adapter(run, output, check_sha=not skip_sha_check)
    typer.echo(f"merged model: {out}\nserving hand-off: {out / HANDOFF}\nready commands: {out / SERVING}")
    return 0


def serve(
    path: Path = typer.Argument(..., help="Run directory (base + adapter) or merged/model directory."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (loopback by default)."),
    port: int = typer.Option(8000, "--port"),
    constrained: str | None = typer.Option(None, "--constrained", help="Constrain every answer to a language: vox."),
    api_key: str | None = typer.Option(None, "--api-key", envvar="MENS_API_KEY", show_envvar=True,
                                       help="Require 'Authorization: Bearer KEY'. Prefer MENS_API_KEY or "
                                            "--api-key-file: other users can read argv."),
    api_key_file: Path | None = typer.Option(None, "--api-key-file", help="Read the API key from this file."),
    max_tokens_limit: int = typer.Option(2048, "--max-tokens-limit", min=1),
    max_queue: int = typer.Option(32, "--max-queue", min=1, help="Requests that may wait; more get 503."),
    max_batch: int = typer.Option(8, "--max-batch", min=1,
                                  help="Unconstrained requests decoded together, one model step for all of them; "
                                       "1 answers one request at a time."),
    request_timeout_s: float = typer.Option(300.0, "--request-timeout-s", min=1.0,
                                            help="Longest a request may take, queue included; an answer still "
                                                 "generating then ends with finish_reason 'length'."),
    shutdown_grace_s: float = typer.Option(10.0, "--shutdown-grace-s", min=0.0,
                                           help="On SIGTERM, how long to wait before in-flight work is stopped."),
    device: str = typer.Option("auto", "--device"),
) -> int:
    """Serve OpenAI- and Ollama-compatible endpoints; with --constrained vox every answer parses."""
    from mens.lang import get_language
    from mens.model.hf_engine import HFEngine
    from mens.model.inference import load_for_inference
    from mens.serve.app import create_app
    from mens.serve.guards import resolve_api_key
    from mens.serve.server import bind_warning, build_server

    key = resolve_api_key(api_key, api_key_file)
    warning = bind_warning(host, key is not None)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    lang = get_language(constrained) if constrained else None
    engine = HFEngine(load_for_inference(path, device=device), lang, max_batch=max_batch)
    app = create_app(engine, api_key=key, max_tokens_limit=max_tokens_limit, max_queue=max_queue,
                     request_timeout_s=request_timeout_s, constrained_default=lang is not None)
    typer.echo(f"serving {engine.model_id} on http://{host}:{port} (OpenAI: /v1, Ollama: /api)")
    build_server(app, host=host, port=port, shutdown_grace_s=shutdown_grace_s).run()
    return 0
