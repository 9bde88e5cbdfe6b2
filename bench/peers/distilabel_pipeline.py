"""distilabel as its docs show: a `Pipeline` of `LoadDataFromDicts` >> `ChatGeneration` whose
`OpenAILLM` has `base_url` pointed at the simulator, run with `pipeline.run()` (its cache on,
`use_cache=True` by default, is the resume: a restart is the same command). Its defaults are
kept (the openai client's six retries and 120 s timeout) except `input_batch_size`, which is
how many requests it sends at once (`agenerate` gathers a batch), set to the concurrency every
runner gets. `out.jsonl` is written from the returned Distiset, one line per row whose
generation is not empty.
"""

from __future__ import annotations

import json

from _common import KEY, MAX_TOKENS, MODEL, args, rows
from distilabel.models import OpenAILLM
from distilabel.pipeline import Pipeline
from distilabel.steps import LoadDataFromDicts
from distilabel.steps.tasks import ChatGeneration

if __name__ == "__main__":
    url, concurrency, _ = args()  # a restart is the same call: distilabel resumes from its cache
    with Pipeline(name="regen-bench", cache_dir="distilabel-cache") as pipeline:
        load = LoadDataFromDicts(data=[{"id": i, "messages": m} for i, m in rows()])
        chat = ChatGeneration(
            llm=OpenAILLM(
                model=MODEL,
                base_url=url,
                api_key=KEY,
                generation_kwargs={"max_new_tokens": MAX_TOKENS},
            ),
            input_batch_size=concurrency,
        )
        load >> chat
    distiset = pipeline.run()
    with open("out.jsonl", "w") as out:
        for row in distiset["default"]["train"]:
            if row.get("generation") is not None:
                out.write(json.dumps({"id": row["id"], "content": row["generation"]}) + "\n")
