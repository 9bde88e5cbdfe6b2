"""Write the demo's bundled datasets (deterministic). Run: python scripts/make_demo_data.py"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "src" / "regen" / "demo" / "data"
rng = random.Random(2026)

CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Pune", "Quito", "Hanoi", "Perth", "Tunis"]
TOPICS = [
    "photosynthesis",
    "compound interest",
    "the French revolution",
    "black holes",
    "sourdough bread",
    "the immune system",
    "plate tectonics",
    "jazz harmony",
    "container shipping",
    "public key cryptography",
    "bird migration",
    "tide pools",
]
ASKS = [
    "Explain {t} to a twelve-year-old.",
    "Give me three surprising facts about {t}.",
    "What is the most common misconception about {t}?",
    "Summarize {t} in one paragraph.",
    "How would you teach {t} in a single lesson?",
    "Write a short poem about {t}.",
]
TASKS = [
    "reverses a linked list",
    "checks whether a string is a palindrome",
    "merges two sorted lists",
    "computes the n-th Fibonacci number iteratively",
    "parses an ISO-8601 date",
    "counts word frequencies in a text",
    "finds the longest common prefix of a list of strings",
    "flattens a nested list",
    "implements binary search",
    "validates an email address with a regex",
]
LANGS = ["Python", "Rust", "Go", "TypeScript", "C++"]
PERSONAS = ["student", "nurse", "retired engineer", "chef", "farmer", "pilot", "novelist"]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the product documentation.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}


def chat_rows() -> list[str]:
    """OpenAI messages, JSONL: single and multi-turn chat, tool use, and two bad rows."""
    lines = []
    for i in range(118):
        topic = rng.choice(TOPICS)
        if i % 4 == 0:
            city = rng.choice(CITIES)
            row = {
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant with tools."},
                    {"role": "user", "content": f"What's the weather like in {city} today?"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": f"call_{i}",
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": json.dumps({"city": city}),
                                },
                            }
                        ],
                    },
                    {
                        "role": "tool",
                        "tool_call_id": f"call_{i}",
                        "content": json.dumps({"temp_c": rng.randint(-5, 35), "sky": "clear"}),
                    },
                    {"role": "assistant", "content": f"It is clear in {city}."},
                ],
                "tools": [WEATHER_TOOL, SEARCH_TOOL],
            }
        elif i % 4 == 1:
            row = {
                "messages": [
                    {
                        "role": "user",
                        "content": f"Search the docs for {TOPICS[i % len(TOPICS)]}, "
                        f"at most {i % 7 + 2} results.",
                    },
                ],
                "tools": [SEARCH_TOOL],
            }
        else:
            first = ASKS[i % len(ASKS)].format(t=TOPICS[(i // len(ASKS)) % len(TOPICS)])
            if i >= len(ASKS) * len(TOPICS):
                first += " Keep it brief."
            msgs = [
                {"role": "user", "content": first},
                {"role": "assistant", "content": f"Here is an answer about {topic}."},
            ]
            if i % 3 == 0:
                msgs += [
                    {"role": "user", "content": "Can you make it shorter?"},
                    {"role": "assistant", "content": "Sure: a shorter answer."},
                ]
            row = {"messages": msgs}
        lines.append(json.dumps(row))
    lines.insert(37, '{"messages": [{"role": "user", "content": "unterminated')
    lines.insert(81, json.dumps({"messages": [{"role": "assistant", "content": "no question"}]}))
    return lines


def sharegpt_rows() -> list[dict[str, object]]:
    """ShareGPT from/value, one JSON list, some rows with a system prompt."""
    rows = []
    for i in range(100):
        topic = TOPICS[i % len(TOPICS)]
        ask = ASKS[(i // len(TOPICS)) % len(ASKS)].format(t=topic)
        convs = [
            {"from": "human", "value": f"{ask} (I am a {rng.choice(PERSONAS)}.)"},
            {"from": "gpt", "value": f"An original answer about {topic}."},
        ]
        for _ in range(rng.randint(0, 2)):
            convs += [
                {"from": "human", "value": f"Tell me more about {topic}, step by step."},
                {"from": "gpt", "value": "More detail."},
            ]
        row: dict[str, object] = {"id": f"sg-{i:04d}", "conversations": convs}
        if i % 5 == 0:
            row["system"] = "You are a patient teacher."
        rows.append(row)
    # Three exact repeats, as real dumps have: regen sends each prompt once.
    return rows + [rows[10], rows[20], rows[30]]


def alpaca_rows() -> list[str]:
    """Alpaca instruction/input/output, JSONL: code tasks."""
    lines = []
    for i in range(80):
        lang = LANGS[i % len(LANGS)]
        task = TASKS[(i // len(LANGS)) % len(TASKS)]
        row = {
            "instruction": f"Write a {lang} function that {task}.",
            "input": "" if i < 50 else "Include unit tests and explain the complexity.",
            "output": f"```{lang.lower()}\n// original solution\n```",
        }
        lines.append(json.dumps(row))
    return lines


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "chat.jsonl").write_text("\n".join(chat_rows()) + "\n")
    (OUT / "sharegpt.json").write_text(json.dumps(sharegpt_rows(), indent=1) + "\n")
    (OUT / "code_alpaca.jsonl").write_text("\n".join(alpaca_rows()) + "\n")


if __name__ == "__main__":
    main()
