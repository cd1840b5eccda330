"""The API key (constant-time check, from env or file, Ollama- and OpenAI-shaped 401) and the bind warning."""

from __future__ import annotations

import httpx
import pytest
from tests.serve.conftest import SleepyEngine

from mens.errors import UsageError
from mens.serve.guards import resolve_api_key
from mens.serve.server import bind_warning

CHAT = {"messages": [{"role": "user", "content": "hi"}], "stream": False}


def test_api_key_guards_every_path_but_health(server):
    engine = SleepyEngine(tokens=2, delay_s=0.0)
    base, _, _ = server(engine, api_key="sekrit")
    for auth in (None, "Bearer sekri", "Bearer sekrit2", "Bearer SEKRIT", "sekrit", "Basic sekrit"):
        headers = {"Authorization": auth} if auth else {}
        r = httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers, timeout=5)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", auth
        r = httpx.post(f"{base}/api/chat", json=CHAT, headers=headers, timeout=5)
        assert r.status_code == 401 and "API key" in r.json()["error"], auth
    ok = {"Authorization": "Bearer sekrit"}
    assert httpx.post(f"{base}/api/chat", json=CHAT, headers=ok, timeout=5).json()["done"] is True
    assert httpx.get(f"{base}/health", timeout=5).status_code == 200
    assert engine.started == 1


def test_unauthenticated_upload_is_refused_before_it_is_read(server):
    base, _, _ = server(SleepyEngine(), api_key="sekrit")

    def chunks():
        for _ in range(160):
            yield b"x" * 65_536

    r = httpx.post(f"{base}/v1/completions", content=chunks(), timeout=5)
    assert r.status_code == 401


def test_api_key_from_file_or_env(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n", encoding="utf-8")
    assert resolve_api_key(None, key_file) == "s3cret"
    assert resolve_api_key("k", None) == "k" and resolve_api_key(None, None) is None
    with pytest.raises(UsageError, match="both set"):
        resolve_api_key("k", key_file)
    for text in ("", "a\nb\n"):
        key_file.write_text(text, encoding="utf-8")
        with pytest.raises(UsageError, match="one line"):
            resolve_api_key(None, key_file)
    with pytest.raises(UsageError, match="cannot read"):
        resolve_api_key(None, tmp_path / "missing")


def test_cli_takes_the_key_from_mens_api_key(tmp_path, monkeypatch, capsys):
    from mens.cli.main import main

    key_file = tmp_path / "key"
    key_file.write_text("from-file\n", encoding="utf-8")
    monkeypatch.setenv("MENS_API_KEY", "from-env")
    with pytest.raises(SystemExit) as exit_:  # both given: refused before any model is loaded
        main(["serve", str(tmp_path / "no-model"), "--api-key-file", str(key_file)])
    assert exit_.value.code == 2 and "MENS_API_KEY" in capsys.readouterr().err


def test_binding_beyond_loopback_without_a_key_warns():
    assert "0.0.0.0" in bind_warning("0.0.0.0", has_api_key=False)
    assert bind_warning("192.168.1.5", has_api_key=False) is not None
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert bind_warning(host, has_api_key=False) is None
    assert bind_warning("0.0.0.0", has_api_key=True) is None
