"""`mens chat`: piped stdin through the real CLI, the trained system prompt, history, streaming and the constraint."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from tests.conftest import build_tiny_chat_lm

from mens.cli import main as cli_main

torch = pytest.importorskip("torch")

SYSTEM = "You write Vox."


ANSWER = "fn add(a: int) to int { return a + 1 }"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A merged-style model directory: a tiny Llama taught one Vox answer (so answers are code, and a constrained
    answer has something to find), its tokenizer with a ChatML template, and the trained system prompt."""
    model, tok = build_tiny_chat_lm()
    text = tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fn add"}],
                                   tokenize=False, add_generation_prompt=True) + ANSWER + "<|im_end|>"
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a module fixture runs before the per-test thread setting
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(60):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    torch.set_num_threads(threads)
    out = tmp_path_factory.mktemp("chat-model")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "system_prompt.txt").write_text(SYSTEM)
    return out


@pytest.fixture(scope="module")
def loaded(model_dir):
    from mens.model.inference import load_for_inference

    return load_for_inference(model_dir, device="cpu")


def _session(loaded, **kw):
    from mens.model.chat import ChatSession

    return ChatSession(loaded, **kw)


def test_chat_cli_answers_each_piped_line_until_exit(model_dir, loaded):
    res = subprocess.run([sys.executable, "-m", "mens", "chat", str(model_dir), "--max-new-tokens", "24", "--device",
                          "cpu"], input="fn add\n\nreturn a\n/exit\nnever asked\n", capture_output=True, text=True,
                         timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    session = _session(loaded, max_new_tokens=24)  # the same conversation in-process: greedy, so the same answers
    first = "".join(session.ask("fn add"))
    assert first == ANSWER  # the taught answer: the trained system prompt was in the prompt
    assert res.stdout == first + "\n" + "".join(session.ask("return a")) + "\n" and len(session.messages) == 4
    assert "Traceback" not in res.stderr and ">>>" not in res.stderr  # no prompt printed when stdin is a pipe


def test_the_trained_system_prompt_comes_first_and_turns_are_remembered(loaded):
    session = _session(loaded, max_new_tokens=5)
    first = "".join(session.ask("fn add"))
    text = loaded.tokenizer.decode(session.prompt_ids([*session.messages, {"role": "user", "content": "again"}]))
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>")
    assert f"<|im_start|>user\nfn add<|im_end|>\n<|im_start|>assistant\n{first}<|im_end|>" in text
    session.reset()
    assert session.messages == []


def test_answers_stream_before_decoding_ends(loaded):
    calls = []
    handle = loaded.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        pieces = _session(loaded, max_new_tokens=20).ask("hello")
        first = next(pieces)
        steps_at_first_piece = len(calls)
        rest = list(pieces)
    finally:
        handle.remove()
    assert first and rest and steps_at_first_piece < len(calls)


def test_old_turns_are_dropped_to_fit_the_model_and_an_oversized_message_is_refused(loaded):
    from mens.errors import UsageError

    prompts = []

    def record(_module, _args, kwargs):
        if kwargs["input_ids"].shape[1] > 1:  # the prompt step (later steps feed one token)
            prompts.append(kwargs["input_ids"].shape[1])

    handle = loaded.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        session = _session(loaded, max_new_tokens=64)  # the tiny model reads 256 positions
        for i in range(6):
            "".join(session.ask(f"fn add{i}(a: int) to int " * 3))
    finally:
        handle.remove()
    assert len(prompts) == 6 and max(prompts) + 64 <= 256
    assert session.messages[0]["content"] != "fn add0(a: int) to int " * 3  # the oldest turn made room
    assert session.messages[-2]["content"] == "fn add5(a: int) to int " * 3
    with pytest.raises(UsageError, match="shorten the message"):
        "".join(session.ask("return a + 1 " * 200))


def test_constrained_chat_answers_parse(model_dir, monkeypatch, capsys):
    from mens.lang import get_language

    monkeypatch.setattr(sys, "stdin", io.StringIO("fn add\n"))  # end of input quits
    with pytest.raises(SystemExit) as info:
        cli_main.main(["chat", str(model_dir), "--constrained", "vox", "--max-new-tokens", "24", "--device", "cpu"])
    assert info.value.code == 0
    answer = capsys.readouterr().out.removesuffix("\n")
    assert answer.strip() and get_language("vox").parse(answer).has_code, answer


def test_an_unknown_constraint_fails_before_loading(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        cli_main.main(["chat", str(tmp_path / "no-model"), "--constrained", "klingon"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == "error: unknown language 'klingon'; known languages: python, vox"
