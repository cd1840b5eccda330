"""Run the app under uvicorn with a bounded, graceful shutdown.

On SIGTERM/SIGINT the server stops accepting connections, refuses queued requests (503) and gives the
answer in flight half of `shutdown_grace_s` to finish; then that answer stops with an error event and
uvicorn, at `shutdown_grace_s`, cancels whatever is left. So a stop never waits on a long generation.
"""

from __future__ import annotations

import logging
from types import FrameType

import uvicorn
from fastapi import FastAPI

from mens.serve.guards import is_loopback
from mens.serve.scheduler import Scheduler

log = logging.getLogger("mens.serve")


class GracefulServer(uvicorn.Server):
    """A uvicorn server that tells the scheduler when shutdown begins."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler, shutdown_grace_s: float):
        super().__init__(config)
        self.scheduler, self.shutdown_grace_s = scheduler, shutdown_grace_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.scheduler.begin_shutdown(self.shutdown_grace_s / 2)
        super().handle_exit(sig, frame)


def build_server(app: FastAPI, *, host: str, port: int, shutdown_grace_s: float = 10.0,
                 log_level: str = "info") -> GracefulServer:
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=max(1, round(shutdown_grace_s)))
    return GracefulServer(config, app.state.scheduler, shutdown_grace_s)


def bind_warning(host: str, has_api_key: bool) -> str | None:
    """A warning when `host` exposes the server beyond this machine without an API key."""
    if has_api_key or is_loopback(host):
        return None
    return (f"--host {host} makes this server reachable from other machines and no API key is set: anyone who "
            "can reach the port can use the model. Set MENS_API_KEY or --api-key-file, or bind 127.0.0.1.")
