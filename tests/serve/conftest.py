"""Serve fixtures: a fake engine that sleeps per token (fast, deterministic), and a real server on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from mens.model.engine import GenerationRequest, SequentialBatch, Usage
from mens.serve.app import create_app
from mens.serve.server import build_server


class SleepyEngine(SequentialBatch):
    """`tokens` pieces "t0 ", "t1 ", ... each after `delay_s`; counts what it started, produced and closed.

    A prompt is one token per word (plus 2 for a chat's framing); the context is `context_length` tokens.
    `fail_after` makes the engine raise after that many pieces (an engine bug mid-answer).
    """

    model_id = "mens-fake"
    constrained_language = None

    def __init__(self, tokens: int = 20, delay_s: float = 0.01, context_length: int = 64,
                 fail_after: int | None = None):
        self.tokens, self.delay_s, self.context_length, self.fail_after = tokens, delay_s, context_length, fail_after
        self.started = self.closed = self.produced = self.active = self.max_active = 0

    def count_tokens(self, request: GenerationRequest) -> int:
        if request.messages is not None:
            return 2 + sum(len(m["content"].split()) for m in request.messages)
        return len((request.prompt or "").split())

    def stream(self, request: GenerationRequest, usage: Usage) -> Iterator[str]:
        self.started += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            usage.prompt_tokens = self.count_tokens(request)
            for i in range(min(self.tokens, request.max_tokens)):
                if self.fail_after is not None and i >= self.fail_after:
                    raise RuntimeError("engine exploded")
                time.sleep(self.delay_s)
                self.produced += 1
                usage.completion_tokens += 1
                yield f"t{i} "
        finally:
            self.active -= 1
            self.closed += 1

    def answer_s(self) -> float:
        return self.tokens * self.delay_s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    """Factory: start `create_app(engine, **kwargs)` on 127.0.0.1 in a thread; returns (base_url, server)."""
    running = []

    def start(engine, shutdown_grace_s: float = 2.0, **kwargs):
        port = free_port()
        srv = build_server(create_app(engine, **kwargs), host="127.0.0.1", port=port,
                           shutdown_grace_s=shutdown_grace_s, log_level="error")
        thread = threading.Thread(target=srv.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not srv.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.started, "test server did not start within 10 s"
        running.append((srv, thread))
        return f"http://127.0.0.1:{port}", srv, thread

    yield start
    for srv, thread in running:
        srv.should_exit = True
        thread.join(timeout=5)


def rss_kib() -> int:
    """This process's resident memory (the server runs in a thread of it)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def wait_until(condition, timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll `condition()` until it holds; fail the test after `timeout_s` (orders events without fixed sleeps)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.005)


def queued(base: str) -> int:
    import httpx

    return httpx.get(f"{base}/health", timeout=5).json()["queued"]
