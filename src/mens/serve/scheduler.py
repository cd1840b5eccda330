"""Generations over a shared engine in arrival order, with a bounded queue and a bounded time per request.

A request holds the engine alone, or shares it with up to `engine.max_batch` others when the engine batches them
(`engine.batchable` for every generation of the request; `mens.model.batch_stream`); an engine without those
attributes is held by one request at a time. Admission is first come, first served: a request that needs the
engine alone waits for the sharing ones before it, and the requests after it wait for it.

A request is admitted only while fewer than `max_queue` others wait (else 503 at once), then waits for
the engine. While it waits and while it generates, it is dropped as soon as its client disconnects, its
deadline (`request_timeout_s` from arrival) passes, or shutdown begins. A `Job` holds its place on the engine from
`Scheduler.start` until `Job.close`, which stops the engine's token loop (closing its generator) and
frees its place; `close` is synchronous, so it runs even in a cancelled task.

A request that asks for several answers (OpenAI's `n`, a completion with several prompts) is one Job over a list
of generations run one after another: it queues once, holds the engine until its last answer, and shares
one deadline (answers the deadline leaves no time for end at once with finish_reason "length").

What a deadline does: a request still queued at its deadline gets 503 (code `queue_timeout`); an answer
being generated stops there and finishes with finish_reason "length" (the answer was cut short, as by
max_tokens). Shutdown: queued requests get 503, answers in flight stop at the shutdown deadline with a
503 error (JSON, or the stream's error event).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

import anyio

from mens.model.engine import Engine, GenerationRequest, Usage
from mens.serve.engine import StopScanner
from mens.serve.errors import ApiError, ClientGone

log = logging.getLogger("mens.serve")

POLL_S = 0.05
"""How often a queued request checks its client, deadline and shutdown."""

WATCH_S = 0.25
"""While the engine computes a piece, how often the client, the deadline and shutdown are checked."""

_END = object()


class Gate:
    """First-come admission to the engine: one holder alone, or up to `capacity` holders that share it.

    A waiter is granted in arrival order only; one that cannot enter yet (it needs the engine alone, or the sharing
    places are full) holds back everyone behind it, so a request alone is never starved by a stream of sharing ones.
    """

    def __init__(self, capacity: int = 1):
        self.capacity = max(1, capacity)
        self.shared = 0
        self.alone = False
        self._waiters: deque[tuple[asyncio.Future, bool]] = deque()

    @property
    def held(self) -> bool:
        return self.alone or self.shared > 0

    def acquire(self, shared: bool) -> asyncio.Future:
        """A future that is done once the caller holds a place (`shared`) or the engine alone."""
        grant = asyncio.get_running_loop().create_future()
        self._waiters.append((grant, shared))
        self._admit()
        return grant

    def release(self, shared: bool) -> None:
        if shared:
            self.shared -= 1
        else:
            self.alone = False
        self._admit()

    def give_up(self, grant: asyncio.Future, shared: bool) -> None:
        """The waiter of `grant` leaves: its place goes back if it was granted meanwhile."""
        if grant.done() and not grant.cancelled():
            self.release(shared)
        else:
            grant.cancel()
            self._admit()  # a waiter at the head that left no longer holds back the ones behind it

    def _admit(self) -> None:
        while self._waiters:
            grant, shared = self._waiters[0]
            if grant.done():  # given up
                self._waiters.popleft()
                continue
            fits = not self.alone and (self.shared < self.capacity if shared else self.shared == 0)
            if not fits:
                return
            self._waiters.popleft()
            if shared:
                self.shared += 1
            else:
                self.alone = True
            grant.set_result(None)


class Scheduler:
    def __init__(self, engine: Engine, *, max_queue: int = 32, request_timeout_s: float | None = 300.0):
        self.engine, self.max_queue, self.request_timeout_s = engine, max_queue, request_timeout_s
        self.waiting = 0
        self.stop_at: float | None = None
        """Monotonic time at which answers in flight stop; set when shutdown begins."""
        self._gate = Gate(getattr(engine, "max_batch", 1))

    @property
    def busy(self) -> bool:
        """Whether any request holds the engine."""
        return self._gate.held

    def shares(self, reqs: list[GenerationRequest]) -> bool:
        """Whether these generations may run beside other requests' (the engine batches every one of them)."""
        batchable = getattr(self.engine, "batchable", None)
        return self._gate.capacity > 1 and batchable is not None and all(batchable(r) for r in reqs)

    def begin_shutdown(self, grace_s: float) -> None:
        """Refuse new and queued requests; stop answers in flight after `grace_s` seconds."""
        if self.stop_at is None:
            self.stop_at = time.monotonic() + max(grace_s, 0.0)

    def _refuse_if_stopping(self) -> None:
        if self.stop_at is not None:
            raise ApiError(503, "server is shutting down; retry on another instance", type_="server_error",
                           code="shutting_down")

    async def start(self, req: GenerationRequest | list[GenerationRequest],
                    is_gone: Callable[[], Awaitable[bool]]) -> Job:
        """Admit `req` (or several, answered in turn), wait for the engine, and return the Job that holds it
        (the caller must `close` it)."""
        self._refuse_if_stopping()
        if self.waiting >= self.max_queue:
            raise ApiError(503, f"server busy: {self.max_queue} requests already queued; retry later",
                           type_="server_error", code="overloaded")
        timeout_s = self.request_timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        reqs = list(req) if isinstance(req, list) else [req]
        shared = self.shares(reqs)
        self.waiting += 1
        try:
            await self._acquire(shared, deadline, is_gone)
        finally:
            self.waiting -= 1
        return Job(self, reqs, deadline, is_gone, shared=shared)

    async def _acquire(self, shared: bool, deadline: float | None, is_gone: Callable[[], Awaitable[bool]]) -> None:
        # The grant keeps the request's place in the FIFO queue while the checks run beside it.
        grant = self._gate.acquire(shared)
        try:
            while not (await asyncio.wait({grant}, timeout=POLL_S))[0]:
                self._refuse_if_stopping()
                if deadline is not None and time.monotonic() > deadline:
                    raise ApiError(503, f"request waited {self.request_timeout_s} s in the queue without reaching "
                                   "the model; retry later or raise --request-timeout-s", type_="server_error",
                                   code="queue_timeout")
                if await is_gone():
                    raise ClientGone()
        except BaseException:
            self._gate.give_up(grant, shared)
            raise

    def _release(self, shared: bool) -> None:
        self._gate.release(shared)


class Job:
    """One admitted request: text pieces after stop strings, then why each answer ended.

    With several generations (`reqs`), `next_piece` returns None at the end of each answer; `next_choice` then
    starts the next one (`index` counts them). `usage` and `finish` describe the current answer, `usages` and
    `finishes` every answer so far.
    """

    def __init__(self, scheduler: Scheduler, req: GenerationRequest | list[GenerationRequest],
                 deadline: float | None, is_gone: Callable[[], Awaitable[bool]], *, shared: bool = False):
        self.reqs = list(req) if isinstance(req, list) else [req]
        if not self.reqs:
            raise ValueError("a Job needs at least one generation")
        self.scheduler, self.deadline, self._is_gone = scheduler, deadline, is_gone
        self.shared = shared
        """Whether this request shares the engine with others (see Gate) rather than holding it alone."""
        self.index = -1
        self.usages: list[Usage] = []
        self._finished: list[str] = []
        self.error: ApiError | None = None
        """Set when the answer ended by an error (engine failure, shutdown) rather than finishing."""
        self.gone = False
        self._open = True
        self._step: asyncio.Future | None = None
        """The engine step running in a worker thread, if any (close waits for it before freeing the engine)."""
        self._begin(0)

    def _begin(self, index: int) -> None:
        self.index = index
        self.req = self.reqs[index]
        self.usage = Usage()
        self.usages.append(self.usage)
        self._gen = self.scheduler.engine.stream(self.req, self.usage)
        self._scanner = StopScanner(self.req.stop)
        self.done = False
        self.finish = "stop"
        """"stop" or "length" (the token budget or the request deadline cut the answer)."""

    @property
    def finishes(self) -> list[str]:
        """Why each answer so far ended (the current one's `finish` last)."""
        return [*self._finished, self.finish]

    def next_choice(self) -> bool:
        """After an answer ended cleanly, start the next generation of this request; False when none is left or
        the request is over (an error, the client gone, closed)."""
        if not self._open or self.error is not None or self.gone or self.index + 1 >= len(self.reqs):
            return False
        self._finished.append(self.finish)
        self._close_gen()  # an answer cut by a stop string leaves its generator suspended
        self._begin(self.index + 1)
        return True

    async def next_piece(self) -> str | None:
        """The next piece of text, or None once the answer has ended (see `finish`, `error`, `gone`)."""
        while not self.done:
            if self._stop_now():
                return self._scanner.flush() or None
            if await self._is_gone():
                self.done, self.gone = True, True
                return None
            try:
                piece = await self._next_from_engine()
            except Exception as e:  # the engine failed: the client gets a 500, the log gets the traceback
                log.exception("generation failed")
                self.done = True
                self.error = ApiError(500, f"generation failed: {type(e).__name__}: {e}", type_="server_error",
                                      code="engine_error")
                return None
            if self.req.cancelled.is_set():  # the watcher stopped the engine mid-step: end the answer for its reason
                if self._stop_now():  # deadline ("length") or shutdown (an error)
                    return self._scanner.flush() or None
                self.done, self.gone = True, True
                return None
            if piece is _END:
                self.done = True
                self.finish = self.usage.finish_reason or (
                    "length" if self.usage.completion_tokens >= self.req.max_tokens else "stop")
                return self._scanner.flush() or None
            out = self._scanner.feed(piece)
            if self._scanner.stopped:
                self.done = True
            if out:
                return out
        return None

    async def _next_from_engine(self):
        """The engine's next piece, computed in a worker thread. A piece can take long (a constrained answer is
        searched before its first piece), so the client, the deadline and shutdown are watched meanwhile: the
        request's `cancelled` event then tells the engine to stop at its next model step."""
        step = self._step = asyncio.ensure_future(anyio.to_thread.run_sync(next, self._gen, _END))
        while not step.done():
            await asyncio.wait({step}, timeout=WATCH_S)
            if step.done() or self.req.cancelled.is_set():
                continue
            stop_at = min(t for t in (self.deadline, self.scheduler.stop_at, float("inf")) if t is not None)
            if time.monotonic() >= stop_at or await self._is_gone():
                self.req.cancelled.set()
        return step.result()

    def _stop_now(self) -> bool:
        """End the answer here if the request's deadline or the shutdown deadline has passed."""
        now = time.monotonic()
        stop_at = self.scheduler.stop_at
        if stop_at is not None and now >= stop_at:
            self.done = True
            self.error = ApiError(503, "server is shutting down; the answer was stopped", type_="server_error",
                                  code="shutting_down")
            return True
        if self.deadline is not None and now >= self.deadline:
            log.warning("request deadline of %s s reached; answer cut after %d tokens",
                        self.scheduler.request_timeout_s, self.usage.completion_tokens)
            self.done, self.finish = True, "length"
            return True
        return False

    async def collect(self) -> list[str]:
        """Every answer of the request, in order (`finishes`, `usages` say how each ended); raises the request's
        error, or ClientGone."""
        texts = []
        while True:
            parts = []
            while (piece := await self.next_piece()) is not None:
                parts.append(piece)
            if self.error is not None:
                raise self.error
            if self.gone:
                raise ClientGone()
            texts.append("".join(parts))
            if not self.next_choice():
                return texts

    def close(self) -> None:
        """Stop the engine's token loop and free this request's place for the next one (idempotent).

        If an engine step is still running in its thread (the awaiting task was cancelled), the place is freed
        only when that step returns, which `cancelled` makes happen at its next model step: a generation that
        needs the model alone never shares it with one still running.
        """
        if not self._open:
            return
        self._open = False
        self.done = True
        self.req.cancelled.set()  # an engine still inside a step stops at its next model step
        if self._step is not None and not self._step.done():
            self._step.add_done_callback(self._after_step)
        else:
            self._finish_close()

    def _after_step(self, step: asyncio.Future) -> None:
        if not step.cancelled():
            step.exception()  # retrieved (the request is over): no "exception never retrieved" noise
        self._finish_close()

    def _close_gen(self) -> None:
        try:
            close = getattr(self._gen, "close", None)  # a generator: GeneratorExit ends the engine's token loop
            if close is not None:
                close()
        except Exception:  # the engine's own cleanup failed; the engine is still freed
            log.exception("closing the generation failed")

    def _finish_close(self) -> None:
        try:
            self._close_gen()
        finally:
            self.scheduler._release(self.shared)
