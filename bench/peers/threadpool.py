"""SpecForge's `regenerate_train_data.py` pattern: a `ThreadPoolExecutor` of synchronous
`openai.OpenAI` calls, results appended in completion order to `out.jsonl` and failures to
`out_error.jsonl`; `--resume` skips as many input rows as both files have lines."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import openai
from _common import KEY, MAX_TOKENS, MODEL, args, rows


def lines(name: str) -> int:
    if not os.path.exists(name):
        return 0
    with open(name, errors="replace") as f:
        return sum(1 for _ in f)


if __name__ == "__main__":
    url, concurrency, resume = args()
    todo = rows()
    if resume:  # SpecForge's --resume: skip as many input rows as lines written
        todo = todo[lines("out.jsonl") + lines("out_error.jsonl") :]
    client = openai.OpenAI(base_url=url, api_key=KEY)

    def call(i: int, messages: list[dict[str, str]]) -> dict[str, Any]:
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS)
        return {"id": i, "content": r.choices[0].message.content, "status": "success"}

    with (
        ThreadPoolExecutor(max_workers=concurrency) as pool,
        open("out.jsonl", "a") as out,
        open("out_error.jsonl", "a") as err,
    ):
        futures = {pool.submit(call, i, m): i for i, m in todo}
        for fut in as_completed(futures):
            try:
                out.write(json.dumps(fut.result()) + "\n")
            except Exception as exc:  # noqa: BLE001
                err.write(json.dumps({"id": futures[fut], "error": str(exc)[:200]}) + "\n")
