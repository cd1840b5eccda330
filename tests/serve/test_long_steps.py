"""An engine step that yields no text for a long while (a constrained answer is searched before its first piece)
still stops when its client leaves or its deadline passes, and never shares the model with the next request."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from tests.serve.conftest import wait_until

from mens.model.engine import SequentialBatch

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


class SearchingEngine(SequentialBatch):
    """Searches `steps` model steps of `delay_s` each, checking `request.cancelled` between them, then yields the
    whole answer at once (as constrained decoding can, while it holds back text it cannot close yet)."""

    model_id = "mens-fake"
    constrained_language = None

    def __init__(self, steps: int = 200, delay_s: float = 0.01):
        self.steps, self.delay_s = steps, delay_s
        self.searched: list[int] = []  # steps each search ran
        self.active = self.max_active = 0
        self._lock = threading.Lock()

    def stream(self, request, usage):
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        n = 0
        try:
            while n < self.steps and not request.cancelled.is_set():
                time.sleep(self.delay_s)
                n += 1
            usage.completion_tokens = n
            if n == self.steps:
                yield "fn answer() to int { return 1 }"
        finally:
            self.searched.append(n)
            with self._lock:
                self.active -= 1


def test_a_client_that_leaves_during_a_long_search_stops_it(server):
    engine = SearchingEngine(steps=200, delay_s=0.01)  # one search: 2 s, no text before it ends
    base, _, _ = server(engine)
    try:
        httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=0.3)
        raise AssertionError("the request should have outlived the client's 0.3 s timeout")
    except httpx.TimeoutException:
        pass
    wait_until(lambda: len(engine.searched) == 1, timeout_s=1.5, what="the abandoned search stopping")
    assert engine.searched[0] < 120, f"the search ran {engine.searched[0]} of 200 steps after its client left"
    started = time.monotonic()
    answer = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=10).json()
    assert answer["choices"][0]["message"]["content"].startswith("fn answer()")
    assert time.monotonic() - started < 2 * 2.0 + 1.0


def test_the_request_deadline_cuts_a_long_search(server):
    engine = SearchingEngine(steps=400, delay_s=0.01)  # 4 s of search against a 1 s deadline
    base, _, _ = server(engine, request_timeout_s=1.0)
    started = time.monotonic()
    answer = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=10).json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert time.monotonic() - started < 2.0 and engine.searched[0] < 250


def test_a_cancelled_search_never_shares_the_model_with_the_next_request(server):
    engine = SearchingEngine(steps=100, delay_s=0.01)
    base, _, _ = server(engine)
    with ThreadPoolExecutor(4) as pool:
        leavers = [pool.submit(httpx.post, f"{base}/v1/chat/completions", json=CHAT, timeout=0.2) for _ in range(3)]
        keeper = pool.submit(httpx.post, f"{base}/v1/chat/completions", json=CHAT, timeout=10)
        for f in leavers:
            assert isinstance(f.exception(), httpx.TimeoutException)
        assert keeper.result().status_code == 200
    assert engine.max_active == 1, "two searches ran on the model at once"
