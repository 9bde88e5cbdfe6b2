"""The turns every family's reference test renders: one request's history (and tools) and
the answer the model gave, as the model wrote it (reasoning, content, calls).

Each covers one shape of agentic and chat data: a plain answer; reasoning; tool calls only;
content then calls; parallel calls; a multi-turn tool loop with earlier reasoning and tool
results; a system prompt; tools declared; non-ASCII text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}},
            "required": ["tz"],
        },
    },
}


def call(cid: str, name: str, args: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


@dataclass(frozen=True)
class Case:
    name: str
    history: list[dict[str, Any]]
    reasoning: str
    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    @property
    def answer(self) -> dict[str, Any]:
        """The answer as a history message, for the template to render."""
        m: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            m["reasoning_content"] = self.reasoning
        if self.calls:
            m["tool_calls"] = self.calls
        return m


USER = {"role": "user", "content": "What is the weather in Paris?"}
PARIS = '{"city": "Paris"}'

CASES = [
    Case("plain", [{"role": "user", "content": "Say hello."}], "", "Hello! How can I help?"),
    Case(
        "reasoning",
        [{"role": "user", "content": "What is 17 * 23?"}],
        "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.",
        "17 × 23 = **391**.",
    ),
    Case(
        "calls_only",
        [USER],
        "The user wants the weather; call the tool.",
        "",
        [call("call_a1", "get_weather", PARIS)],
        [WEATHER],
    ),
    Case(
        "content_then_calls",
        [USER],
        "I should look it up.",
        "Let me check the weather.",
        [call("call_b2", "get_weather", '{"city": "Paris", "unit": "c"}')],
        [WEATHER],
    ),
    Case(
        "parallel_calls",
        [{"role": "user", "content": "Weather and time in Tokyo?"}],
        "Two independent lookups.",
        "",
        [
            call("call_c3", "get_weather", '{"city": "Tokyo"}'),
            call("call_c4", "get_time", '{"tz": "Asia/Tokyo"}'),
        ],
        [WEATHER, TIME],
    ),
    Case(
        "tool_loop",
        [
            {"role": "system", "content": "You are a concise weather assistant."},
            USER,
            {
                "role": "assistant",
                "content": "",
                "reasoning": "Need the weather tool.",
                "tool_calls": [call("functions.get_weather:0", "get_weather", PARIS)],
            },
            {
                "role": "tool",
                "tool_call_id": "functions.get_weather:0",
                "name": "get_weather",
                "content": '{"temp_c": 21, "sky": "clear"}',
            },
        ],
        "The tool says 21 °C and clear.",
        "It is 21 °C and clear in Paris.",
        tools=[WEATHER],
    ),
    Case(
        "second_loop_call",
        [
            USER,
            {
                "role": "assistant",
                "content": "",
                "reasoning": "First Paris.",
                "tool_calls": [call("functions.get_weather:0", "get_weather", PARIS)],
            },
            {
                "role": "tool",
                "tool_call_id": "functions.get_weather:0",
                "name": "get_weather",
                "content": "sunny",
            },
        ],
        "Now the time as well.",
        "",
        [call("functions.get_time:1", "get_time", '{"tz": "Europe/Paris"}')],
        [WEATHER, TIME],
    ),
    Case(
        "multi_turn_system",
        [
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris.", "reasoning": "Easy: Paris."},
            {"role": "user", "content": "And of Japan?"},
        ],
        "Japan's capital is Tokyo.",
        "Tokyo.",
    ),
]

CUT = [
    Case("cut_in_reasoning", [USER], "The user wants the weather; I will", "", [], [WEATHER]),
    Case(
        "cut_in_content",
        [{"role": "user", "content": "Tell me a story."}],
        "A short one.",
        "Once upon a time there was",
    ),
]
"""Answers cut at max_tokens: in the reasoning (no closing tag, no end token) and in the
content."""
