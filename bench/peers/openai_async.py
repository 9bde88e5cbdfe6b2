"""The naive baseline: `openai.AsyncOpenAI` (its default two retries) behind an
`asyncio.Semaphore`, each answer appended to `out.jsonl` as it arrives (buffered, as such loops
write); a restart skips the ids already in the file."""

from __future__ import annotations

import asyncio
import json

import openai
from _common import KEY, MAX_TOKENS, MODEL, args, done_ids, rows


async def main(url: str, concurrency: int, todo: list[tuple[int, list[dict[str, str]]]]) -> None:
    client = openai.AsyncOpenAI(base_url=url, api_key=KEY)
    sem = asyncio.Semaphore(concurrency)
    failed = 0
    with open("out.jsonl", "a") as out:

        async def one(i: int, messages: list[dict[str, str]]) -> None:
            nonlocal failed
            async with sem:
                try:
                    r = await client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=MAX_TOKENS
                    )
                    content = r.choices[0].message.content
                except Exception:  # noqa: BLE001 - the naive loop counts and moves on
                    failed += 1
                    return
                out.write(json.dumps({"id": i, "content": content}) + "\n")

        await asyncio.gather(*(one(i, m) for i, m in todo))
    print(json.dumps({"failed": failed}))


if __name__ == "__main__":
    url, concurrency, resume = args()
    done = done_ids() if resume else set()
    asyncio.run(main(url, concurrency, [r for r in rows() if r[0] not in done]))
