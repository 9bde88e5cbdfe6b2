"""litellm's async API as its docs show it: `litellm.acompletion` with an `openai/` model name
and `api_base`, behind an `asyncio.Semaphore`, litellm's defaults kept (its retries, its
logging). litellm has no resume of its own, so the loop does what the openai-async baseline
does: append each answer to `out.jsonl`, and on restart skip the ids already there. Offline:
`LITELLM_LOCAL_MODEL_COST_MAP=True` (set by the bench) keeps it from fetching its cost map."""

from __future__ import annotations

import asyncio
import json

import litellm
from _common import KEY, MAX_TOKENS, MODEL, args, done_ids, rows


async def main(url: str, concurrency: int, todo: list[tuple[int, list[dict[str, str]]]]) -> None:
    sem = asyncio.Semaphore(concurrency)
    failed = 0
    with open("out.jsonl", "a") as out:

        async def one(i: int, messages: list[dict[str, str]]) -> None:
            nonlocal failed
            async with sem:
                try:
                    r = await litellm.acompletion(
                        model=f"openai/{MODEL}",
                        api_base=url,
                        api_key=KEY,
                        messages=messages,
                        max_tokens=MAX_TOKENS,
                    )
                    content = r.choices[0].message.content
                except Exception:  # noqa: BLE001 - count and move on, as the loop above
                    failed += 1
                    return
                out.write(json.dumps({"id": i, "content": content}) + "\n")

        await asyncio.gather(*(one(i, m) for i, m in todo))
    print(json.dumps({"failed": failed}))


if __name__ == "__main__":
    url, concurrency, resume = args()
    done = done_ids() if resume else set()
    asyncio.run(main(url, concurrency, [r for r in rows() if r[0] not in done]))
