"""One test per server type: the request body regen sends, and the response shapes each server
returns (written by the project from the servers' documented protocols), parsed the same way.

Shapes: vLLM puts reasoning in `reasoning` (older releases `reasoning_content`) and, with
`return_token_ids`, the prompt's ids on the response (`prompt_token_ids`) and the answer's on
the choice (`token_ids`); streamed, the prompt's ids come in the first chunk and each chunk's
`choices[].token_ids` holds its delta. SGLang says `reasoning_content`, counts
`reasoning_tokens` at the top of `usage`, and with `return_prompt_token_ids` puts the prompt's
ids on the choice. OpenRouter adds `provider` and `usage.cost`; plain OpenAI has neither.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from regen.config import EndpointConfig, GenerationConfig, load_job
from regen.conversation import Message, Request
from regen.engine.client.body import chat_body
from regen.engine.client.response import result_from_body
from regen.engine.client.sse import StreamAssembler
from regen.errors import ConfigError
from regen.state.answers import unpack_ids
from tests.conftest import chat_rows, query, write_rows
from tests.scripted_server import Reply, scripted_server

GEN = GenerationConfig(model="m", max_tokens=64, temperature=0.6)
HISTORY = Request(
    item_id="i",
    dataset="d",
    conversation_id="c",
    turn_index=3,
    messages=(
        Message("user", "q1"),
        Message("assistant", "a1", reasoning="r1"),
        Message("user", "q2"),
    ),
)


def parse(body: Any) -> Any:
    return result_from_body("i", body, status=200, latency_s=0.1)


def body_for(dialect: str, **kw: Any) -> dict[str, Any]:
    return chat_body(HISTORY, GEN, EndpointConfig(dialect=dialect, **kw))  # type: ignore[arg-type]


def test_request_bodies_per_dialect() -> None:
    routing = {"ignore": ["fireworks/fp4"]}
    orouter = body_for("openrouter", provider=routing)
    assert orouter["provider"] == routing and orouter["max_tokens"] == 64
    assert orouter["messages"][1] == {"role": "assistant", "content": "a1", "reasoning": "r1"}
    vllm = body_for("vllm", token_ids=True, provider=routing)
    assert "provider" not in vllm  # routing is OpenRouter's alone
    assert vllm["return_token_ids"] is True and "return_prompt_token_ids" not in vllm
    assert vllm["messages"][1]["reasoning"] == "r1"
    sglang = body_for("sglang", token_ids=True)
    assert sglang["return_token_ids"] is True and sglang["return_prompt_token_ids"] is True
    assert sglang["messages"][1] == {
        "role": "assistant",
        "content": "a1",
        "reasoning_content": "r1",
    }
    plain = body_for("openai", extra_body={"chat_template_kwargs": {"thinking": True}})
    assert plain["chat_template_kwargs"] == {"thinking": True}
    assert "return_token_ids" not in plain and "provider" not in plain


def test_openrouters_reasoning_object_goes_to_vllm_as_its_effort_only() -> None:
    gen = GenerationConfig(model="m", reasoning={"effort": "high"})
    vllm = chat_body(HISTORY, gen, EndpointConfig(dialect="vllm"))
    assert vllm["reasoning_effort"] == "high" and "reasoning" not in vllm
    off = GenerationConfig(model="m", reasoning={"enabled": False})
    assert "reasoning_effort" not in chat_body(HISTORY, off, EndpointConfig(dialect="vllm"))
    # SGLang maps the object itself; OpenRouter defines it.
    for dialect in ("sglang", "openrouter"):
        body = chat_body(HISTORY, off, EndpointConfig(dialect=dialect))  # type: ignore[arg-type]
        assert body["reasoning"] == {"enabled": False}


def test_a_stream_asks_for_its_usage_where_servers_send_it_only_when_asked() -> None:
    for dialect in ("vllm", "sglang", "openai"):
        body = chat_body(HISTORY, GEN, EndpointConfig(dialect=dialect), stream=True)  # type: ignore[arg-type]
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    orouter = chat_body(HISTORY, GEN, EndpointConfig(), stream=True)
    assert "stream_options" not in orouter  # OpenRouter always sends usage
    assert "stream_options" not in chat_body(HISTORY, GEN, EndpointConfig(dialect="vllm"))


def test_token_ids_only_where_servers_give_them() -> None:
    with pytest.raises(ValueError, match="only vllm and sglang servers return token ids"):
        EndpointConfig(dialect="openrouter", token_ids=True)


VLLM_BODY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "Qwen/Qwen3-8B",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "42",
                "reasoning": "think",
                "tool_calls": [],
            },
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": [151667, 1, 2, 151668, 19, 151645],
        }
    ],
    "prompt_token_ids": [151644, 872, 198, 30, 151645],
    "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11},
}
SGLANG_BODY = {
    "id": "abc",
    "object": "chat.completion",
    "model": "default",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "42", "reasoning_content": "think"},
            "finish_reason": "stop",
            "matched_stop": 151645,
            "prompt_token_ids": [151644, 872, 198],
            "token_ids": [7, 8, 9],
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6, "reasoning_tokens": 1},
}


def test_vllm_and_sglang_answers_with_their_token_ids() -> None:
    r = parse(VLLM_BODY)
    assert (r.message.content, r.message.reasoning) == ("42", "think")
    assert r.prompt_token_ids == (151644, 872, 198, 30, 151645)
    assert r.completion_token_ids == (151667, 1, 2, 151668, 19, 151645)
    assert r.usage.cost_usd is None and r.provider is None
    old = json.loads(json.dumps(VLLM_BODY))
    msg = old["choices"][0]["message"]
    msg["reasoning_content"] = msg.pop("reasoning")
    assert parse(old).message.reasoning == "think"
    s = parse(SGLANG_BODY)
    assert (s.message.reasoning, s.usage.reasoning_tokens) == ("think", 1)
    assert s.prompt_token_ids == (151644, 872, 198) and s.completion_token_ids == (7, 8, 9)
    # Ids that are not a list of ids are left out; the answer stays usable.
    bad = json.loads(json.dumps(VLLM_BODY))
    bad["choices"][0]["token_ids"] = ["a"]
    assert parse(bad).completion_token_ids is None


def test_vllm_stream_joins_token_ids_and_takes_the_prompt_ids_from_the_first_chunk() -> None:
    chunks = [
        {
            "id": "c",
            "model": "m",
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}
            ],
        },
        {
            "id": "c",
            "model": "m",
            "choices": [{"index": 0, "delta": {"reasoning": "th"}, "token_ids": [10, 11]}],
        },
        {
            "id": "c",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "ok"}, "token_ids": [12]}],
        },
        {
            "id": "c",
            "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [13]}],
        },
        {
            "id": "c",
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        },
    ]
    raw = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    asm = StreamAssembler()
    for k in range(0, len(raw), 37):  # arbitrary cuts, as the network delivers them
        asm.feed(raw[k : k + 37].encode())
    r = parse(asm.body())
    assert (r.message.reasoning, r.message.content) == ("th", "ok")
    assert r.prompt_token_ids == (1, 2, 3) and r.completion_token_ids == (10, 11, 12, 13)


def test_openai_shape_without_provider_or_cost() -> None:
    body = {
        "id": "chatcmpl-x",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        "system_fingerprint": "fp_x",
    }
    r = parse(body)
    assert (r.message.content, r.provider, r.usage.cost_usd) == ("hi", None, None)
    assert r.prompt_token_ids is None


def test_sglang_token_ids_and_streaming_lanes_do_not_mix(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        '[endpoint]\nbase_url = "http://127.0.0.1:9/v1"\ndialect = "sglang"\ntoken_ids = true\n'
        '[generation]\nmodel = "m"\n[[lanes]]\nname = "l"\nstream = true\n'
        '[[datasets]]\nname = "d"\npath = "d.jsonl"\n'
    )
    with pytest.raises(ConfigError, match="SGLang refuses token ids on streams"):
        load_job(job)


async def test_a_vllm_run_stores_the_exact_ids(tmp_path: Path) -> None:
    write_rows(tmp_path / "chat.jsonl", chat_rows(6))

    def reply(n: int, body: dict[str, Any]) -> Reply:
        assert body["return_token_ids"] is True
        answer = json.loads(json.dumps(VLLM_BODY))
        answer["choices"][0]["token_ids"] = [100 + n, 5, 151645]
        return Reply(body=answer)

    async with scripted_server(reply) as srv:
        job = tmp_path / "job.toml"
        job.write_text(
            f'[job]\noutput_dir = "out"\n[endpoint]\nbase_url = "{srv.url}"\ndialect = "vllm"\n'
            'api_key_env = "NO_KEY_NEEDED"\ntoken_ids = true\n'
            '[generation]\nmodel = "Qwen/Qwen3-8B"\nmax_tokens = 64\n'
            '[run]\nconcurrency = 4\n[[datasets]]\nname = "chat"\npath = "chat.jsonl"\n'
        )
        env = {k: v for k, v in os.environ.items() if k != "NO_KEY_NEEDED"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "regen",
            "run",
            str(job),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    rows = query(tmp_path / "out", "SELECT prompt_token_ids, completion_token_ids FROM results")
    assert len(rows) == 6
    for prompt, completion in rows:
        assert unpack_ids(prompt) == VLLM_BODY["prompt_token_ids"]
        ids = unpack_ids(completion)
        assert ids is not None and ids[1:] == [5, 151645] and 100 <= ids[0] < 106
