"""The server's side of generation: HTTP stop strings, cut from an engine's stream.

The engine itself (`GenerationRequest`, `Usage`, the `Engine` protocol and the real `HFEngine`) lives in
`mens.model`, below both the server and evaluation, which use the same interface.
"""

from __future__ import annotations


class StopScanner:
    """Cut a streamed text at the first stop string, holding back only what could start one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.buf = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        self.buf += piece
        cuts = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
        if cuts:
            out, self.buf, self.stopped = self.buf[: min(cuts)], "", True
            return out
        if self.hold <= 0:
            out, self.buf = self.buf, ""
            return out
        out, self.buf = self.buf[: -self.hold], self.buf[-self.hold :]
        return out

    def flush(self) -> str:
        out, self.buf = ("" if self.stopped else self.buf), ""
        return out
