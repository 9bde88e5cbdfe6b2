"""The `openai` export: loaded with `datasets.load_dataset("json")`, one file at a time, and
trained by OpenAI fine-tuning's per-message rule: an assistant message is trained unless its
`weight` is 0 (system, user and tool messages never are). Its text under loss is its reasoning,
content and calls, written as the Qwen3 template writes them; tokens are counted with the
same tokenizer as the other formats (OpenAI's own is not public), so the count is indicative.
Also tries `load_dataset(FOLDER)` on the whole export and reports what it does.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

from _common import emit, params, reasoning_counts, warnings_of
from datasets import load_dataset
from transformers import AutoTokenizer


def trained_text(m: dict[str, object]) -> str:
    text = ""
    if m.get("reasoning_content"):
        text += f"<think>\n{m['reasoning_content']}\n</think>\n\n"
    text += str(m.get("content") or "")
    for tc in m.get("tool_calls") or []:  # type: ignore[attr-defined]
        fn = tc["function"]
        args = fn["arguments"]
        call = {
            "name": fn["name"],
            "arguments": json.loads(args) if isinstance(args, str) else args,
        }
        text += "\n<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>"
    return text + "<|im_end|>"


def main() -> None:
    p = params()
    export = Path(p["export"])
    tok = AutoTokenizer.from_pretrained(p["tokenizer"])
    samples = []
    with warnings_of("datasets") as warned:
        try:
            whole = load_dataset(str(export))
            folder = f"loads: {whole}".replace("\n", " ")
        except Exception as exc:
            folder = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        for f in sorted((export / "train").glob("*.jsonl")):
            for row in load_dataset("json", data_files=str(f), split="train"):
                spans = []
                ids: list[int] = []  # the assistant messages' tokens, for the reasoning count
                mask: list[int] = []
                start = 0
                for m in row["messages"]:
                    if m["role"] != "assistant":
                        continue
                    text = trained_text(m)
                    tokens = tok(text, add_special_tokens=False)["input_ids"]
                    start = len(ids)  # the last assistant message is the answer
                    ids += tokens
                    mask += [int(m.get("weight") != 0)] * len(tokens)
                    if m.get("weight") != 0:
                        spans.append([len(tokens), text])
                sample = {"id": row["id"], "n_tokens": None, "spans": spans}
                sample["reasoning"] = reasoning_counts(tok, ids, mask, start)
                samples.append(sample)
    emit(
        {
            "trainer": f"datasets {version('datasets')} + OpenAI `weight`",
            "libs": {"transformers": version("transformers")},
            "path": "load_dataset('json', data_files=FILE) per file; tokens: tok_qwen3's count"
            " of each trained message's text",
            "folder": folder,
            "samples": samples,
            "warnings": warned,
        }
    )


if __name__ == "__main__":
    main()
