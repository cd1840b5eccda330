"""Requests that an engine can batch share it, up to its `max_batch`; one that needs it alone gets it alone, in
arrival order. The gate itself, then the app on a real server with a fake batching engine."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from tests.serve.conftest import SleepyEngine, wait_until

from mens.serve.scheduler import Gate

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_gate_admits_in_arrival_order_sharing_up_to_capacity():
    async def scenario():
        gate = Gate(2)
        a, b, c = gate.acquire(True), gate.acquire(True), gate.acquire(True)
        alone = gate.acquire(False)
        late = gate.acquire(True)
        assert a.done() and b.done() and not c.done()  # two places
        gate.release(True)
        assert c.done() and not alone.done()
        gate.release(True)
        gate.release(True)
        assert alone.done() and gate.alone and not late.done()  # nothing shares while one holds it alone
        gate.release(False)
        assert late.done() and gate.shared == 1
        gate.release(True)
        assert not gate.held

    asyncio.run(scenario())


def test_gate_a_waiter_that_leaves_frees_the_ones_behind_it_and_a_granted_place_goes_back():
    async def scenario():
        gate = Gate(3)
        first = gate.acquire(True)
        alone = gate.acquire(False)
        after = gate.acquire(True)
        assert first.done() and not alone.done() and not after.done()
        gate.give_up(alone, False)  # the request alone left the queue: the sharing one behind it enters
        assert after.done() and gate.shared == 2
        gate.give_up(after, True)  # granted, then its client left before it ran: the place goes back
        assert gate.shared == 1
        gate.release(True)
        assert not gate.held

    asyncio.run(scenario())


class BatchingEngine(SleepyEngine):
    """SleepyEngine that says it batches every unconstrained request (up to `max_batch` at once); records how many
    streams were active whenever a constrained one ran."""

    constrained_language = "vox"

    def __init__(self, max_batch: int, **kw):
        super().__init__(**kw)
        self.max_batch = max_batch
        self.alone_saw: list[int] = []
        self._lock = threading.Lock()

    def batchable(self, request) -> bool:
        return not request.constrained

    def stream(self, request, usage):
        with self._lock:
            if request.constrained:
                self.alone_saw.append(self.active + 1)
        yield from super().stream(request, usage)
        with self._lock:
            if request.constrained:
                self.alone_saw.append(self.active + 1)


def test_batchable_requests_share_the_engine_up_to_max_batch(server):
    engine = BatchingEngine(max_batch=3, tokens=20, delay_s=0.02)  # one answer: 0.4 s
    base, _, _ = server(engine)
    t0 = time.monotonic()
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda _: httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=10),
                                range(6)))
    took = time.monotonic() - t0
    assert all(r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop" for r in replies)
    assert engine.max_active == 3 and engine.closed == engine.started == 6
    assert took < 5 * engine.answer_s()  # two rounds of three, not six answers one after another
    assert httpx.get(f"{base}/health").json()["busy"] is False


def test_a_request_that_cannot_be_batched_runs_alone_in_its_turn(server):
    engine = BatchingEngine(max_batch=4, tokens=10, delay_s=0.03)
    base, _, _ = server(engine)
    with ThreadPoolExecutor(5) as pool:
        first = [pool.submit(httpx.post, f"{base}/v1/chat/completions", json=CHAT, timeout=10) for _ in range(2)]
        wait_until(lambda: engine.active == 2, what="two shared answers running")
        alone = pool.submit(httpx.post, f"{base}/v1/chat/completions", json=CHAT | {"constrained": True},
                            timeout=10)
        wait_until(lambda: httpx.get(f"{base}/health").json()["queued"] == 1, what="the constrained one queued")
        later = pool.submit(httpx.post, f"{base}/v1/chat/completions", json=CHAT, timeout=10)
        replies = [f.result() for f in (*first, alone, later)]
    assert all(r.status_code == 200 for r in replies)
    assert engine.alone_saw == [1, 1]  # nothing else ran beside it, from its start to its end
    assert engine.closed == engine.started == 4


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_a_dropped_client_of_a_shared_batch_frees_its_place(server, path):
    engine = BatchingEngine(max_batch=2, tokens=50, delay_s=0.02)  # one answer: 1 s
    base, _, _ = server(engine)
    with ThreadPoolExecutor(2) as pool:
        stays = pool.submit(httpx.post, f"{base}/v1/chat/completions", json=CHAT, timeout=10)
        with httpx.Client(timeout=5) as client, client.stream("POST", f"{base}{path}",
                                                               json=CHAT | {"stream": True}) as r:
            for line in r.iter_lines():
                if line:
                    break
        wait_until(lambda: engine.closed == 1, what="the dropped answer closed")
        assert stays.result().status_code == 200
    assert engine.produced < 2 * 50
