"""How long reconstruction and the audit take for 10M completion tokens.

Builds a state.db as a run against the simulator would leave it: conversations ingested from
JSONL (a third with tools declared), each answered by the simulator (the published Kimi-K2.5
template's text for its answer: reasoning, content, tool calls; cut at max_tokens now and then)
and billed as the simulator bills, until the completions add up to the target. Then times,
each as its own process the way a user runs them:

- `regen audit OUT --family kimi-k2.5 --json`: every prompt rendered through the chat
  template and every completion laid out, all tokenized and checked against the bill, and
  every completion decoded and parsed back;
- `regen export OUT --format tokenized --family kimi-k2.5`: the same ids written to Parquet.

Run: .venv/bin/python bench/reconstruct.py [--tokens 10000000] [--family kimi-k2.5]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import simproc

from regen.config import load_job
from regen.conversation import Attempt, Message, Outcome, Result, ToolCall, Usage
from regen.sim.generate import count_prompt_tokens, generate
from regen.sim.words import WORDS
from regen.sources.ingest import ingest
from regen.state.db import Store

MODELS = {
    "kimi-k2.5": "moonshotai/kimi-k2.5",
    "qwen3": "qwen/qwen3-8b",
    "glm-4.7": "z-ai/glm-4.7",
    "minimax-m2": "minimax/minimax-m2",
    "llama4": "meta-llama/llama-4-maverick",
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
                "required": ["query"],
            },
        },
    }
]


def build(tmp: Path, tokens: int, family: str, mean: int) -> tuple[Path, int, int]:
    rng = random.Random(0)
    n = int(tokens / mean * 1.15) + 10  # enough rows; answering stops at the target
    with (tmp / "d.jsonl").open("w") as f:
        for i in range(n):
            text = " ".join(rng.choices(WORDS, k=rng.randint(10, 120)))
            row: dict[str, object] = {"messages": [{"role": "user", "content": f"{i} {text}"}]}
            if i % 3 == 0:
                row["tools"] = TOOLS
            f.write(json.dumps(row) + "\n")
    (tmp / "job.toml").write_text(
        f'[job]\noutput_dir = "out"\n[generation]\nmodel = "{MODELS[family]}"\n'
        '[[datasets]]\nname = "d"\npath = "d.jsonl"\n'
    )
    job = load_job(tmp / "job.toml")
    store = Store.open(job.output_path)
    ingest(store, job)
    rows = store._db.execute(
        "SELECT i.id, c.data FROM items i JOIN conversations c ON c.id = i.conversation_id"
    ).fetchall()
    total = answers = 0
    batch: list[Outcome] = []
    for item, data in rows:
        if total >= tokens:
            break
        conv = json.loads(data)
        msgs, tools = conv["messages"], conv.get("tools") or []
        c = generate(
            rng,
            family=family,
            messages=msgs,
            tools=tools,
            max_tokens=16384,
            mean_tokens=mean,
            thinking=True,
        )
        calls = tuple(ToolCall.from_openai(tc) for tc in c.tool_calls)
        prompt_tokens = count_prompt_tokens(family, msgs, tools, True)
        r = Result(
            item,
            Message("assistant", c.content, reasoning=c.reasoning or None, tool_calls=calls),
            c.finish_reason,
            Usage(prompt_tokens, c.completion_tokens, c.reasoning_tokens, 0.0),
            provider="P",
        )
        batch.append(Outcome(item, "d", (Attempt(1, time.time(), 1.0, 200),), result=r))
        total += c.completion_tokens
        answers += 1
        if len(batch) == 2000:
            store.commit_outcomes(batch)
            batch = []
    store.commit_outcomes(batch)
    store.close()
    return job.output_path, answers, total


def timed(args: list[str]) -> tuple[float, float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "regen", *args], capture_output=True, text=True, check=False
    )
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if res.returncode not in (0, 3):
        raise SystemExit(f"regen {' '.join(args)} failed: {res.stderr.strip()}")
    return wall, cpu, after.ru_maxrss / 1024, res.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--family", choices=sorted(MODELS), default="kimi-k2.5")
    ap.add_argument("--mean", type=int, default=1000, help="mean completion length drawn")
    args = ap.parse_args()
    print(simproc.machine_line())
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        out, answers, tokens = build(Path(d), args.tokens, args.family, args.mean)
        print(
            f"state.db: {answers} answers, {tokens:,} completion tokens, "
            f"built in {time.monotonic() - t0:.0f} s"
        )
        print("| step | wall s | CPU s | completion tok/s (wall) | result |")
        print("|---|---|---|---|---|")
        wall, cpu, _, stdout = timed(
            ["audit", str(out), "--family", args.family, "--include-truncated", "--json"]
        )
        overall = json.loads(stdout)["overall"]
        result = (
            f"{overall['samples']} samples, match {overall['match_share']:.2%}, "
            f"prompt match {overall['prompt_match_share']:.2%}, "
            f"mean abs diff {overall['mean_abs_diff']}, "
            f"parse-back mismatches {overall['problems'].get('reparse_mismatch', 0)}, "
            f"self-check failures {overall['problems'].get('rebuild_loses_text', 0)}, "
            f"refused {overall['problems'].get('reconstruct_error', 0)}"
        )
        print(f"| audit | {wall:.1f} | {cpu:.1f} | {tokens / wall:,.0f} | {result} |", flush=True)
        wall, cpu, _, _ = timed(
            [
                "export",
                str(out),
                "--format",
                "tokenized",
                "--family",
                args.family,
                "--keep-truncated",
                "--to",
                str(Path(d) / "tok"),
            ]
        )
        manifest = json.loads((Path(d) / "tok" / "manifest.json").read_text())
        written = manifest["datasets"]["d"]["samples"]["train"]
        print(
            f"| export tokenized | {wall:.1f} | {cpu:.1f} | {tokens / wall:,.0f} | "
            f"{written} samples |",
            flush=True,
        )


if __name__ == "__main__":
    main()
