"""bespokelabs-curator as its README shows: a `curator.LLM` subclass with `prompt` and `parse`,
called on the dataset, its OpenAI backend pointed at the simulator with `backend_params`.
Its defaults are kept (ten retries; `length` and `content_filter` answers count as failures and
are asked again; `require_all_responses`), and its own cache is the resume: a restart is the
same command, which finds the run's responses in `CURATOR_CACHE_DIR` by the run's hash.

Three settings a user must give for an OpenAI-compatible endpoint that sends no rate-limit
headers, without which curator falls back to 200 requests and 100,000 tokens a minute: the
concurrency every runner gets, and request and token rates high enough never to bind.

Offline: the bench sets `TIKTOKEN_CACHE_DIR` to the cl100k_base copy that litellm (a curator
dependency) ships, `LITELLM_LOCAL_MODEL_COST_MAP=True`, and `TELEMETRY_ENABLED=false`.

`out.jsonl` is written from the dataset curator returns. When curator raises at the end
(`require_all_responses`: some rows failed every attempt), it is written from the answers in
curator's cache instead (what a rerun would keep), and the exit code is 1.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import traceback

from _common import KEY, MAX_TOKENS, MODEL, args, rows
from bespokelabs import curator


class Regenerate(curator.LLM):
    """Answer each row's messages again."""

    def prompt(self, row: dict) -> list[dict]:
        return row["messages"]

    def parse(self, row: dict, response: str) -> dict:
        return {"id": row["id"], "content": response}


def from_cache() -> list[dict]:
    """The answered rows in curator's response files."""
    out = {}
    cache = os.environ["CURATOR_CACHE_DIR"]
    for path in glob.glob(os.path.join(cache, "*", "responses_*.jsonl")):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("response_errors") is None and r.get("response_message") is not None:
                    i = r["generic_request"]["original_row_idx"]
                    out[i] = {"id": i, "content": r["response_message"]}
    return list(out.values())


if __name__ == "__main__":
    url, concurrency, _ = args()  # a restart is the same call: curator resumes from its cache
    llm = Regenerate(
        model_name=MODEL,
        backend="openai",
        generation_params={"max_tokens": MAX_TOKENS},
        backend_params={
            "base_url": url,
            "api_key": KEY,
            "max_concurrent_requests": concurrency,
            "max_requests_per_minute": 1_000_000,
            "max_tokens_per_minute": 1_000_000_000,
        },
    )
    code = 0
    try:
        answered = llm([{"id": i, "messages": m} for i, m in rows()]).dataset.to_list()
    except Exception:  # noqa: BLE001 - report it, keep what curator has
        traceback.print_exc()
        answered, code = from_cache(), 1
    with open("out.jsonl", "w") as out:
        for row in answered:
            out.write(json.dumps({"id": row["id"], "content": row["content"]}) + "\n")
    sys.exit(code)
