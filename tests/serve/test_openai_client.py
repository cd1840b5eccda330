"""The official `openai` client against a live loopback `mens serve`: chat, completions, streaming, n answers,
usage chunks and the errors it maps (unknown model -> NotFoundError, unsupported parameter -> BadRequestError)."""

from __future__ import annotations

import pytest
from tests.serve.echo_engine import EchoEngine

openai = pytest.importorskip("openai")

USER = [{"role": "user", "content": "write add"}]


@pytest.fixture
def client(server):
    engine = EchoEngine()
    base, _, _ = server(engine)
    with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=10) as c:
        yield c, engine


def test_models_list_and_retrieve(client):
    c, _ = client
    assert [m.id for m in c.models.list().data] == ["mens-echo"]
    assert c.models.retrieve("mens-echo").id == "mens-echo"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("gpt-4o")
    assert e.value.code == "model_not_found" and "mens-echo" in e.value.message


def test_chat_answer_budget_and_finish_reason(client):
    c, engine = client
    res = c.chat.completions.create(model="mens-echo", messages=USER)
    assert res.choices[0].message.content == EchoEngine.answer()
    assert res.choices[0].finish_reason == "stop" and res.usage.completion_tokens == 5
    for budget in ({"max_completion_tokens": 2}, {"max_tokens": 2}):
        res = c.chat.completions.create(model="mens-echo", messages=USER, **budget)
        assert res.choices[0].message.content == "seed=None w1 " and res.choices[0].finish_reason == "length"
        assert res.usage.completion_tokens == 2 and engine.requests[-1].max_tokens == 2


def test_chat_developer_role_and_text_parts(client):
    c, engine = client
    messages = [{"role": "developer", "content": "You write Vox."},
                {"role": "user", "content": [{"type": "text", "text": "write"}, {"type": "text", "text": "add"}]}]
    res = c.chat.completions.create(model="mens-echo", messages=messages)
    assert res.choices[0].finish_reason == "stop"
    assert engine.requests[-1].messages == [{"role": "system", "content": "You write Vox."},
                                            {"role": "user", "content": "write\nadd"}]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="mens-echo", messages=[{"role": "user", "content": [image]}])
    assert e.value.param == "messages.0.content" and "image_url" in e.value.message


def test_chat_stream_with_usage_chunk(client):
    c, _ = client
    chunks = list(c.chat.completions.create(model="mens-echo", messages=USER, stream=True,
                                            stream_options={"include_usage": True}, max_completion_tokens=3))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "seed=None w1 w2 "
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 3 and last.usage.prompt_tokens == 4
    assert all(ch.usage is None for ch in chunks[:-1])
    plain = list(c.chat.completions.create(model="mens-echo", messages=USER, stream=True))
    assert all(ch.choices for ch in plain), "a usage chunk was sent without stream_options.include_usage"


def test_n_answers_each_with_its_own_seed(client):
    c, engine = client
    res = c.chat.completions.create(model="mens-echo", messages=USER, n=3, temperature=0.7, seed=41)
    assert [ch.index for ch in res.choices] == [0, 1, 2]
    assert [ch.message.content for ch in res.choices] == [EchoEngine.answer(s) for s in (41, 42, 43)]
    assert res.usage.prompt_tokens == 4 and res.usage.completion_tokens == 15  # the prompt counted once
    stream = c.chat.completions.create(model="mens-echo", messages=USER, n=2, temperature=0.7, seed=7, stream=True)
    texts: dict[int, str] = {}
    for ch in stream:
        for choice in ch.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert texts == {0: EchoEngine.answer(7), 1: EchoEngine.answer(8)}
    before = len(engine.requests)
    with pytest.raises(openai.BadRequestError) as e:  # greedy: n identical answers
        c.chat.completions.create(model="mens-echo", messages=USER, n=2)
    assert e.value.param == "n" and "temperature" in e.value.message and len(engine.requests) == before


def test_completions_plain_streamed_and_several_prompts(client):
    c, _ = client
    res = c.completions.create(model="mens-echo", prompt="fn add", max_tokens=2)
    assert res.choices[0].text == "seed=None w1 " and res.choices[0].finish_reason == "length"
    chunks = list(c.completions.create(model="mens-echo", prompt="fn add", stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == EchoEngine.answer()
    assert chunks[-1].usage.total_tokens == 2 + 5
    res = c.completions.create(model="mens-echo", prompt=["fn a", "fn b c"], n=2, temperature=1, seed=3)
    assert [ch.index for ch in res.choices] == [0, 1, 2, 3]
    assert [ch.text for ch in res.choices] == [EchoEngine.answer(s) for s in (3, 4, 3, 4)]
    assert res.usage.prompt_tokens == 2 + 3


@pytest.mark.parametrize("kwargs, param", [
    ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"extra_body": {"top_k": 5}}, "top_k"),
    ({"max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens"),
    ({"temperature": 3}, "temperature"),
])
def test_unsupported_or_bad_parameters_are_bad_requests(client, kwargs, param):
    c, engine = client
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="mens-echo", messages=USER, **kwargs)
    assert e.value.param == param, e.value.message
    assert param in e.value.message and engine.requests == []


def test_defaults_clients_send_are_accepted(client):
    c, _ = client
    res = c.chat.completions.create(model="mens-echo", messages=USER, logprobs=False, response_format={"type": "text"},
                                    presence_penalty=0, frequency_penalty=0, user="u1", store=False, n=1,
                                    tool_choice="none", parallel_tool_calls=False, metadata={"k": "v"},
                                    seed=5, top_p=0.9, stop=["\n\n"])
    assert res.choices[0].message.content == EchoEngine.answer(5)


def test_unknown_model_is_not_found_on_every_endpoint(client):
    c, engine = client
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=USER)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=USER, stream=True)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="gpt-4o", prompt="x")
    assert engine.requests == []
    for name in ("mens", "mens-echo:latest"):  # the server's alias and Ollama's tagged form
        assert c.completions.create(model=name, prompt="x").choices[0].text == EchoEngine.answer()


def test_error_mid_stream_raises_in_the_client(server):
    base, _, _ = server(EchoEngine(fail_after=2))
    with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=10) as c:
        stream = c.chat.completions.create(model="mens-echo", messages=USER, stream=True)
        with pytest.raises(openai.APIError, match="generation failed"):
            list(stream)


def test_sampling_without_a_seed_draws_a_new_one_each_call(client):
    """Unseeded sampled answers differ from call to call (as in both APIs); greedy ones keep no seed."""
    c, engine = client
    for _ in range(3):
        c.chat.completions.create(model="mens-echo", messages=USER, temperature=0.8, max_tokens=1)
    seeds = [r.seed for r in engine.requests[-3:]]
    assert None not in seeds and len(set(seeds)) == 3
    c.chat.completions.create(model="mens-echo", messages=USER, max_tokens=1)
    assert engine.requests[-1].seed is None
