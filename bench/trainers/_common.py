"""What every trainer loader shares (bench/trainers.py runs them, each in its trainer's venv).

A loader is run as `python load_X.py PARAMS.json`: it reads the export with the trainer's own
code, and prints one line `RESULT {json}` with, per sample the trainer kept, its token count
and the decoded spans under loss. Whether those spans are the target's text is judged by
bench/trainers.py against state.db, not here. Needs only the standard library and a tokenizer
object (`transformers`, which every trainer venv has).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def params() -> dict[str, Any]:
    """The loader's parameters: the JSON file named on the command line."""
    return json.loads(Path(sys.argv[1]).read_text())


def emit(result: dict[str, Any]) -> None:
    """Print the result on its own line (trainers print their own noise around it)."""
    sys.stdout.write("\nRESULT " + json.dumps(result, ensure_ascii=False) + "\n")
    sys.stdout.flush()


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}"[:600])


@contextlib.contextmanager
def warnings_of(*loggers: str) -> Iterator[list[str]]:
    """The WARNING-and-above messages these loggers (and Python's warnings) log meanwhile."""
    keep = _Keep()
    logging.captureWarnings(True)
    targets = [logging.getLogger(n) for n in (*loggers, "py.warnings")]
    for lg in targets:
        lg.addHandler(keep)
    try:
        yield keep.messages
    finally:
        for lg in targets:
            lg.removeHandler(keep)


def reasoning_counts(
    tok: Any, ids: list[int], mask: list[int], answer_start: int | None = None
) -> dict[str, int]:
    """Tokens inside `<think>`...`</think>` (the tags not counted), as the trainer holds them:
    in the answer under loss (`answer_loss`), and in the history: all of them (`history`) and
    those under loss (`history_loss`). The answer is what follows the last `<|im_start|>` (the
    header of the last turn) unless `answer_start` says where it starts."""
    opens, closes, start = tok.convert_tokens_to_ids(["<think>", "</think>", "<|im_start|>"])
    if answer_start is None:
        answer_start = max((i for i, t in enumerate(ids) if t == start), default=0)
    out = {"answer_loss": 0, "history": 0, "history_loss": 0}
    block: list[tuple[int, int, int]] = []  # (position, token, under loss) inside a block
    inside = False
    for i, (t, m) in enumerate([*zip(ids, mask, strict=True), (closes, 0)]):
        if t not in (opens, closes):
            if inside:
                block.append((i, t, m))
            continue
        # An empty block (`<think>\n\n</think>`, a template's markup) holds no reasoning.
        if block and tok.decode([b[1] for b in block]).strip():
            for at, _, under in block:
                if at >= answer_start:
                    out["answer_loss"] += bool(under)
                else:
                    out["history"] += 1
                    out["history_loss"] += bool(under)
        inside, block = t == opens, []
    return out


def sample(
    tok: Any, ids: list[int], mask: list[int], sid: str | None, answer_start: int | None = None
) -> dict[str, Any]:
    """One loaded sample: its id when the trainer kept one (else its decoded text, to be
    matched to its answer by bench/trainers.py), its length, each contiguous run of tokens
    under loss as [token count, decoded text], and its reasoning tokens (reasoning_counts)."""
    spans: list[list[Any]] = []
    run: list[int] = []
    for t, m in [*zip(ids, mask, strict=True), (None, 0)]:
        if m:
            run.append(int(t))  # type: ignore[arg-type]
        elif run:
            spans.append([len(run), tok.decode(run, skip_special_tokens=False)])
            run = []
    out: dict[str, Any] = {"id": sid, "n_tokens": len(ids), "spans": spans}
    out["reasoning"] = reasoning_counts(tok, ids, mask, answer_start)
    if sid is None:
        out["text"] = tok.decode(ids, skip_special_tokens=False)
    return out


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A message as a server hands it to the chat template: calls' arguments parsed."""
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
    reasoning = m.get("reasoning_content", m.get("reasoning"))
    if reasoning:
        out["reasoning_content"] = reasoning
    if m.get("tool_calls"):
        calls = []
        for tc in m["tool_calls"]:
            fn = tc["function"]
            args = fn.get("arguments")
            calls.append(
                {
                    "id": tc.get("id"),
                    "type": "function",
                    "function": {
                        "name": fn["name"],
                        "arguments": json.loads(args) if isinstance(args, str) else args,
                    },
                }
            )
        out["tool_calls"] = calls
    for k in ("tool_call_id", "name"):
        if m.get(k) is not None:
            out[k] = m[k]
    return out


def expected_ids(
    tok: Any, history: list[dict[str, Any]], tools: list[Any] | None, answer: dict[str, Any]
) -> tuple[list[int], list[int]]:
    """The prompt and answer ids the tokenizer's own chat template gives, made here without
    regen: the prompt is the history with the generation prompt; the answer is what the
    template writes after it for the stored answer, through its end-of-turn token (the
    newline the template puts after it is not the model's)."""
    msgs = [_message(m) for m in history]
    kw = {"tools": tools} if tools else {}
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)
    full = tok.apply_chat_template([*msgs, _message(answer)], tokenize=False, **kw)
    if not full.startswith(prompt):
        raise ValueError("the template's render of the answer does not extend its prompt")
    completion = full[len(prompt) :]
    end = completion.rindex("<|im_end|>") + len("<|im_end|>")
    encode = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    return encode(prompt), encode(completion[:end])


def check_ids(
    tok: Any, out: dict[str, Any], ids: list[int], mask: list[int], truth: dict[str, Any]
) -> None:
    """For a pre-tokenized sample: do the ids under loss equal the answer's ids from the
    template (`ids_match`), and the ids before them the prompt's (`prompt_match`)?"""
    try:
        prompt, completion = expected_ids(tok, truth["history"], truth["tools"], truth["answer"])
    except Exception as exc:  # reported, not fatal: the judge says what it could not check
        out["ids_error"] = f"{type(exc).__name__}: {exc}"
        return
    under = [t for t, m in zip(ids, mask, strict=True) if m]
    first = mask.index(1) if 1 in mask else len(mask)
    out["ids_match"] = under == completion
    out["prompt_match"] = list(ids[:first]) == prompt
    if not out["ids_match"]:
        out["expected_text"] = tok.decode(completion, skip_special_tokens=False)
