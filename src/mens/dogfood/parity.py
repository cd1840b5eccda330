"""Does the gain survive the merge? The merged directory and the real HTTP server answer the held-out tasks,
and their task results are compared with the adapter's (greedy, same prompts).

The merged model is not asked to decode the answers the adapter gave: each is checked by teacher forcing, one
forward pass over prompt + answer (`HFEngine.adopt_greedy`), and only the answers it is not shown to decode
exactly are decoded. Where a model's argmax follows the answer token by token and then ends it as decoding would,
its greedy decoding gives that answer, so the check is as strict as decoding all of them.

The server is `mens serve`'s app under uvicorn on a free loopback port, asked with plain urllib (what any
OpenAI client sends), so the check covers the whole serving path: chat template, system prompt, stop tokens.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from pathlib import Path

from mens.errors import DataError
from mens.evaluate.bench import BenchTask, load_bench
from mens.lang import Language
from mens.lang.checks import check_output
from mens.run_records import BENCHMARK, DOGFOOD_STATE, DOGFOOD_SUMMARY, BenchmarkResults, DogfoodSummary, read_json


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout_s: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (loopback only)
        return json.loads(resp.read())


def served_answers(model_dir: Path, tasks: list[BenchTask], max_tokens: int, device: str = "auto",
                   timeout_s: float = 600.0, max_batch: int | None = None) -> list[str]:
    """Greedy answers of `mens serve MODEL_DIR` (OpenAI chat endpoint, temperature 0) to each task's prompt.

    The requests are sent together, as concurrent clients would send them, so the server decodes them in one batch
    (`mens serve --max-batch`, here `max_batch`, by default every task): the check covers the batched serving path,
    in about the time of the longest answer. `max_batch=1` serves them one at a time.
    """
    from concurrent.futures import ThreadPoolExecutor

    import uvicorn

    from mens.model.hf_engine import HFEngine
    from mens.model.inference import load_for_inference
    from mens.serve.app import create_app

    engine = HFEngine(load_for_inference(model_dir, device=device), max_batch=max_batch or max(1, len(tasks)))
    app = create_app(engine, max_tokens_limit=max(2048, max_tokens), max_queue=max(32, len(tasks)))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 30
        while not server.started:
            if time.time() > deadline or not thread.is_alive():
                raise RuntimeError(f"mens serve did not start on 127.0.0.1:{port}")
            time.sleep(0.05)

        def ask(task: BenchTask) -> str:
            body = {"model": "mens", "messages": [{"role": "user", "content": task.prompt}], "temperature": 0,
                    "max_tokens": max_tokens}
            reply = _post(f"http://127.0.0.1:{port}/v1/chat/completions", body, timeout_s)
            return reply["choices"][0]["message"]["content"] or ""

        with ThreadPoolExecutor(max(1, len(tasks))) as pool:
            return list(pool.map(ask, tasks))
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def finished_run(out_dir: Path) -> tuple[dict, Path, list[dict]]:
    """(dogfood config, run directory, the adapter's greedy results) of a finished `mens dogfood -o DIR`."""
    state = read_json(out_dir / DOGFOOD_STATE)
    config = state.get("config") if isinstance(state, dict) else None
    summary = DogfoodSummary.read(out_dir / DOGFOOD_SUMMARY)
    if not isinstance(config, dict) or not summary.run:
        raise DataError(f"{out_dir}: not a finished `mens dogfood -o DIR` ({DOGFOOD_STATE} without its config, or "
                        f"{DOGFOOD_SUMMARY} without the run); finish it with `mens dogfood --resume -o {out_dir}`")
    run = Path(summary.run)
    adapter = greedy_results(BenchmarkResults.read(run / BENCHMARK).to_json())
    if adapter is None:
        raise DataError(f"{run / BENCHMARK}: the tuned model was not evaluated greedily; "
                        "run `mens eval-local` with greedy among its --modes")
    return config, run, adapter


def finished_tasks(out_dir: Path, config: dict) -> list[BenchTask]:
    """The held-out tasks a finished `mens dogfood -o DIR` evaluated (its --limit applied), from `finished_run`'s
    config."""
    tasks = load_bench(out_dir / "bench" / "heldout.jsonl")
    return tasks[: config["limit"]] if config.get("limit") else tasks


def greedy_results(bench_doc: dict) -> list[dict] | None:
    """The greedy per-task results of an eval-local result document (None when greedy was not among its modes)."""
    if bench_doc.get("main_mode") == "greedy":
        return bench_doc["results"]
    return bench_doc.get("results_by_mode", {}).get("greedy")


def compare_results(adapter: list[dict], merged: list[dict]) -> dict:
    """Per-task pass/fail of two bench result lists (first sample each), and where they differ."""
    a = {r["id"]: r["samples"][0] for r in adapter}
    m = {r["id"]: r["samples"][0] for r in merged}
    common = [tid for tid in a if tid in m]
    differ = [tid for tid in common if a[tid]["pass"] != m[tid]["pass"]]
    return {"tasks": len(common), "same_result": len(common) - len(differ), "different_result": differ,
            "same_text": sum(a[t]["output"] == m[t]["output"] for t in common),
            "adapter_passed": sum(a[t]["pass"] for t in common), "merged_passed": sum(m[t]["pass"] for t in common)}


def compare_served(tasks: list[BenchTask], served: list[str], merged: list[dict], lang: Language) -> dict:
    """Task results of the served answers against the merged model's results for the same tasks."""
    m = {r["id"]: r["samples"][0] for r in merged}
    rows = []
    for task, text in zip(tasks, served, strict=True):
        ok = check_output(text, task.expect, lang).passed
        rows.append({"id": task.id, "served_pass": ok, "merged_pass": m[task.id]["pass"],
                     "same_text": text == m[task.id]["output"]})
    return {"tasks": len(rows), "same_result": sum(r["served_pass"] == r["merged_pass"] for r in rows),
            "same_text": sum(r["same_text"] for r in rows), "rows": rows}
