from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regen.engine.client.errors import FAILURE_CLASSES, class_of_status, parse_retry_after
from regen.engine.client.response import parse_chat_body
from regen.errors import EndpointError

OK = {
    "id": "gen-1-abc",
    "provider": "Novita",
    "model": "z-ai/glm-4.6",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "I'll check.",
                "reasoning": "The user asks...",
                "tool_calls": [
                    {
                        "type": "function",
                        "index": 0,
                        "id": "call_1",
                        "function": {"name": "weather", "arguments": '{"location":"Florence"}'},
                    }
                ],
            },
        }
    ],
    "usage": {
        "prompt_tokens": 173,
        "completion_tokens": 74,
        "total_tokens": 247,
        "cost": 0.00023947,
        "completion_tokens_details": {"reasoning_tokens": 48},
    },
}


def parse(body: Any, raw: bytes | None = None) -> Any:
    data = raw if raw is not None else json.dumps(body).encode()
    return parse_chat_body("item", data, status=200, latency_s=0.5)


def fails(body: Any, raw: bytes | None = None) -> EndpointError:
    with pytest.raises(EndpointError) as info:
        parse(body, raw)
    return info.value


def test_openrouter_body_parses_into_a_result() -> None:
    r = parse(OK)
    assert r.message.content == "I'll check."
    assert r.message.reasoning == "The user asks..."
    assert r.message.tool_calls[0].arguments == '{"location":"Florence"}'
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.reasoning_tokens) == (
        173,
        74,
        48,
    )
    assert r.usage.cost_usd == pytest.approx(0.00023947)
    assert (r.provider, r.model, r.generation_id, r.finish_reason) == (
        "Novita",
        "z-ai/glm-4.6",
        "gen-1-abc",
        "tool_calls",
    )


def test_leading_whitespace_padding_is_accepted() -> None:
    assert parse(None, b"\n         \n" * 50 + json.dumps(OK).encode()).provider == "Novita"


def test_reasoning_content_of_sglang_is_read() -> None:
    body = {
        "choices": [
            {"finish_reason": "stop", "message": {"content": "a", "reasoning_content": "r"}}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "reasoning_tokens": 1},
    }
    r = parse(body)
    assert r.message.reasoning == "r" and r.usage.reasoning_tokens == 1
    assert r.usage.cost_usd is None


def test_error_in_a_200_body_is_classified_by_its_code() -> None:
    assert fails({"error": {"code": 429, "message": "slow down"}}).failure_class == "rate_limited"
    assert fails({"error": {"code": "502", "message": "bad gw"}}).failure_class == "server"
    assert fails({"error": {"code": 402, "message": "credits"}}).failure_class == (
        "insufficient_credits"
    )


def test_choice_error_and_error_finish_reason_are_server_failures() -> None:
    body = {
        "choices": [
            {
                "finish_reason": "error",
                "error": {"code": 502, "message": "cut"},
                "message": {"content": "partial"},
            }
        ]
    }
    assert fails(body).failure_class == "server"
    body = {"choices": [{"finish_reason": "error", "message": {"content": "partial"}}]}
    assert fails(body).failure_class == "server"


def test_empty_and_malformed_responses_are_invalid() -> None:
    assert fails(None, b"<html>oops").failure_class == "invalid_response"
    assert fails({"choices": []}).failure_class == "invalid_response"
    cold = {"choices": [{"finish_reason": None, "message": {"content": ""}}]}
    assert fails(cold).failure_class == "invalid_response"


def test_reasoning_only_truncated_answer_is_a_result_not_an_error() -> None:
    body = {
        "choices": [
            {"finish_reason": "length", "message": {"content": None, "reasoning": "long..."}}
        ]
    }
    r = parse(body)
    assert r.finish_reason == "length" and r.message.content == ""


def test_availability_retry_after_and_retryable_are_honoured() -> None:
    err = fails(
        {
            "error": {
                "code": 503,
                "message": "busy",
                "availability": {"retryable": True, "retry_after": 7},
            }
        }
    )
    assert (err.failure_class, err.retry_after_s) == ("overloaded", 7.0)
    err = fails({"error": {"code": 503, "message": "no", "availability": {"retryable": False}}})
    assert err.failure_class == "bad_request"


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, "bad_request"),
        (401, "auth"),
        (402, "insufficient_credits"),
        (403, "moderation"),
        (404, "bad_request"),
        (408, "timeout"),
        (413, "bad_request"),
        (422, "bad_request"),
        (429, "rate_limited"),
        (500, "server"),
        (502, "server"),
        (503, "overloaded"),
        (524, "timeout"),
        (529, "overloaded"),
    ],
)
def test_status_classes(status: int, cls: str) -> None:
    assert class_of_status(status) == cls


def test_retry_after_forms() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("Wed, 02 Dec 2026 12:00:10 GMT", now=1796212800.0) == 10.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "message",
                    "content",
                    "error",
                    "usage",
                    "tool_calls",
                    "function",
                    "reasoning",
                    "code",
                    "finish_reason",
                    "arguments",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(body=json_values)
def test_any_body_gives_a_result_or_a_classified_error(body: Any) -> None:
    try:
        parse(body)
    except EndpointError as exc:
        assert exc.failure_class in FAILURE_CLASSES


@pytest.mark.parametrize("call", [{"function": 3}, {"function": {"name": 5}}, {"id": "x"}])
def test_malformed_tool_calls_are_invalid_responses(call: dict[str, Any]) -> None:
    body = {
        "choices": [
            {"finish_reason": "tool_calls", "message": {"content": "", "tool_calls": [call]}}
        ]
    }
    assert fails(body).failure_class == "invalid_response"
