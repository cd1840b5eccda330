"""`mens serve` against hostile and careless clients: dropped streams, huge chunked bodies, load, slow answers,
shutdown. Each test runs a real uvicorn server on 127.0.0.1 (in a thread) with a fake engine that sleeps per
token, and bounds every wait."""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from tests.serve.conftest import SleepyEngine, queued, rss_kib, wait_until

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def _open_then_drop(base: str, path: str, body: dict, lines: int = 2) -> None:
    """Start a streamed answer, read `lines` lines of it, then close the connection mid-answer."""
    with httpx.Client(timeout=5) as client, client.stream("POST", f"{base}{path}", json=body) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += bool(line)
            if seen >= lines:
                break


def test_dropped_streams_never_delay_the_next_request(server):
    engine = SleepyEngine(tokens=20, delay_s=0.02)  # one answer: 0.4 s
    base, _, _ = server(engine)
    answer_s = engine.answer_s()
    drops = [("/v1/chat/completions", CHAT | {"stream": True}), ("/api/chat", CHAT | {"stream": True}),
             ("/v1/completions", {"prompt": "hi", "stream": True}), ("/api/generate", {"prompt": "hi"}),
             ("/v1/chat/completions", CHAT | {"stream": True})]
    for path, body in drops:
        _open_then_drop(base, path, body)
        t0 = time.monotonic()
        r = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=5)
        waited = time.monotonic() - t0
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
        assert waited < 2 * answer_s, f"after a dropped {path} stream the next answer took {waited:.2f} s"
    assert httpx.get(f"{base}/health").json()["busy"] is False
    assert engine.active == 0 and engine.closed == engine.started == 10
    # Every dropped stream stopped early: the 5 full answers are 100 tokens, each drop only a few more.
    assert engine.produced < 5 * 20 + 5 * 8


def test_abandoned_requests_stop_computing(server):
    engine = SleepyEngine(tokens=50, delay_s=0.02)  # one answer: 1 s
    base, _, _ = server(engine)

    def give_up(path: str, body: dict) -> None:
        try:
            httpx.post(f"{base}{path}", json=body, timeout=0.2)
        except httpx.TimeoutException:
            return
        raise AssertionError("the request should have outlived the client's 0.2 s timeout")

    give_up("/v1/chat/completions", CHAT)  # generating when its client leaves
    wait_until(lambda: engine.active == 0, timeout_s=1.0, what="the abandoned answer stopping")
    assert engine.closed == 1 and engine.produced < 25, f"an abandoned answer ran on for {engine.produced} tokens"
    with ThreadPoolExecutor(3) as pool:  # one client waits for its whole answer; two queued behind it give up
        keeper = pool.submit(httpx.post, f"{base}/api/chat", json=CHAT | {"stream": False}, timeout=5)
        wait_until(lambda: engine.active == 1, what="the first answer starting")
        list(pool.map(give_up, ["/generate", "/v1/completions"], [{"prompt": "hi"}, {"prompt": "hi"}]))
        wait_until(lambda: queued(base) == 0, timeout_s=0.5, what="the abandoned requests leaving the queue")
        assert engine.active == 1 and not keeper.done(), "the queue emptied only because the first answer ended"
        assert keeper.result().json()["done"] is True
    assert engine.started == 2 and engine.active == 0, "a queued request whose client left still reached the engine"


def test_chunked_10mb_body_gets_413_within_a_second(server):
    base, _, _ = server(SleepyEngine())

    def chunks():
        piece = b'{"prompt": "' + b"x" * 65_536
        for _ in range(160):  # 10 MiB, sent without a Content-Length
            yield piece

    for path, shape in [("/v1/completions", dict), ("/api/generate", str)]:
        t0 = time.monotonic()
        r = httpx.post(f"{base}{path}", content=chunks(), headers={"content-type": "application/json"}, timeout=5)
        assert time.monotonic() - t0 < 1.0
        assert r.status_code == 413
        assert isinstance(r.json()["error"], shape) and "limit" in json.dumps(r.json())
    declared = httpx.post(f"{base}/v1/completions", content=b"x" * 2_000_000, timeout=5)
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "too_large"
    assert httpx.post(f"{base}/v1/completions", json={"prompt": "hi"}, timeout=5).status_code == 200


def test_trickled_body_gets_408(server):
    base, _, _ = server(SleepyEngine(), body_timeout_s=0.3)

    def trickle():
        yield b'{"prompt": "'
        for _ in range(20):  # 2 s in all, far past the 0.3 s allowed for the body
            time.sleep(0.1)
            yield b"x"

    t0 = time.monotonic()
    r = httpx.post(f"{base}/api/generate", content=trickle(), timeout=5)
    assert r.status_code == 408 and "0.3 s" in r.json()["error"] and time.monotonic() - t0 < 1.0


def test_200_requests_at_concurrency_32_all_answered_and_memory_flat(server):
    engine = SleepyEngine(tokens=4, delay_s=0.001)
    base, _, _ = server(engine)  # a queue of 32: the 32 clients fit, so 503s should be rare
    bodies = [("/v1/chat/completions", CHAT), ("/v1/chat/completions", CHAT | {"stream": True}),
              ("/api/chat", CHAT | {"stream": False}), ("/api/generate", {"prompt": "hi"})]

    def call(i: int) -> tuple[int, float, bool]:
        path, body = bodies[i % len(bodies)]
        t0 = time.monotonic()
        r = client.post(f"{base}{path}", json=body)
        ok = r.status_code == 200 and (b"t3" in r.content) and b'"error"' not in r.content
        return r.status_code, time.monotonic() - t0, ok or (r.status_code == 503 and "error" in r.json())

    with httpx.Client(timeout=30, limits=httpx.Limits(max_connections=32)) as client:
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(call, range(64)))  # warm-up: imports, thread pools, allocator arenas
            before = rss_kib()
            results = list(pool.map(call, range(200)))
    after = rss_kib()
    statuses = [s for s, _, _ in results]
    assert set(statuses) <= {200, 503} and statuses.count(200) >= 150, statuses
    assert all(ok for _, _, ok in results), "an answer was empty, cut or not JSON"
    assert all(t < 1.0 for s, t, _ in results if s == 503), "a 503 was not fast"
    assert httpx.get(f"{base}/health").json() | {"model": None} == {
        "status": "ok", "model": None, "constrained": None, "busy": False, "queued": 0, "shutting_down": False}
    assert engine.max_active == 1 and engine.active == 0
    assert after <= before * 1.10, f"RSS grew from {before} KiB to {after} KiB over 200 requests"


def test_request_timeout_cuts_answers(server):
    engine = SleepyEngine(tokens=40, delay_s=0.025)  # one answer: 1 s; the limit is 0.3 s
    base, _, _ = server(engine, request_timeout_s=0.3)
    t0 = time.monotonic()
    r = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=5)
    assert time.monotonic() - t0 < 0.8
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["finish_reason"] == "length" and choice["message"]["content"]
    assert 0 < r.json()["usage"]["completion_tokens"] < 40
    with httpx.stream("POST", f"{base}/api/chat", json=CHAT, timeout=5) as s:
        lines = [json.loads(x) for x in s.iter_lines() if x]
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "length" and len(lines) < 40



def test_request_timeout_refuses_what_waited_too_long_in_the_queue(server):
    engine = SleepyEngine(tokens=3, delay_s=1.0)  # one token outlasts the 0.3 s limit: the queue cannot move
    base, _, _ = server(engine, request_timeout_s=0.3)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(httpx.post, f"{base}/v1/completions", json={"prompt": "a"}, timeout=5)
        wait_until(lambda: engine.active == 1, what="the first answer starting")
        t0 = time.monotonic()
        queued = httpx.post(f"{base}/v1/completions", json={"prompt": "b", "stream": True}, timeout=5)
        assert time.monotonic() - t0 < 0.6
        assert queued.status_code == 503 and queued.json()["error"]["code"] == "queue_timeout"
        assert first.result().json()["choices"][0]["finish_reason"] == "length"
    assert engine.started == 1 and engine.produced == 1 and engine.active == 0


def test_full_queue_is_503_json_before_any_stream_starts(server):
    engine = SleepyEngine(tokens=30, delay_s=0.02)
    base, _, _ = server(engine, max_queue=1)
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(httpx.post, f"{base}/v1/chat/completions", json=CHAT, timeout=5)
        wait_until(lambda: engine.active == 1, what="the first answer starting")
        waiting = pool.submit(httpx.post, f"{base}/v1/chat/completions", json=CHAT, timeout=5)
        wait_until(lambda: queued(base) == 1, what="the second request queueing")
        for path, body in [("/api/chat", CHAT), ("/api/generate", {"prompt": "x"}),
                           ("/v1/chat/completions", CHAT | {"stream": True})]:
            r = httpx.post(f"{base}{path}", json=body, timeout=5)
            assert r.status_code == 503 and r.headers["content-type"] == "application/json", (path, r.text)
            error = r.json()["error"]
            assert "busy" in (error if path.startswith("/api/") else error["message"])
        assert running.result().status_code == 200 and waiting.result().status_code == 200


def test_engine_failure_mid_answer_is_an_error_not_a_silent_end(server):
    base, _, _ = server(SleepyEngine(tokens=10, delay_s=0.001, fail_after=3))
    r = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=5)
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
    with httpx.stream("POST", f"{base}/v1/completions", json={"prompt": "x", "stream": True}, timeout=5) as s:
        events = [x.removeprefix("data: ") for x in s.iter_lines() if x]
    assert events[-1] == "[DONE]" and "engine exploded" in json.loads(events[-2])["error"]["message"]
    with httpx.stream("POST", f"{base}/api/generate", json={"prompt": "x"}, timeout=5) as s:
        lines = [json.loads(x) for x in s.iter_lines() if x]
    assert "engine exploded" in lines[-1]["error"] and not any(x.get("done") for x in lines)
    assert httpx.get(f"{base}/health").json()["busy"] is False


def test_shutdown_stops_answers_in_flight_within_the_grace(server):
    engine = SleepyEngine(tokens=200, delay_s=0.02)  # one answer: 4 s
    base, srv, thread = server(engine, shutdown_grace_s=1.0)
    events: list[str] = []

    def stream() -> None:
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=CHAT | {"stream": True}, timeout=5) as s:
            events.extend(x.removeprefix("data: ") for x in s.iter_lines() if x)

    reader = threading.Thread(target=stream)
    reader.start()
    with ThreadPoolExecutor(1) as pool:
        wait_until(lambda: engine.produced >= 2, what="the stream starting")
        waiting = pool.submit(httpx.post, f"{base}/v1/chat/completions", json=CHAT, timeout=5)
        wait_until(lambda: queued(base) == 1, what="the second request queueing")
        t0 = time.monotonic()
        srv.handle_exit(signal.SIGTERM, None)
        refused = waiting.result()
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    reader.join(timeout=3)
    thread.join(timeout=3)
    assert not thread.is_alive() and time.monotonic() - t0 < 2.0, "shutdown outlived its 1 s grace"
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "shutting_down"
    assert engine.active == 0 and engine.produced < 100
