"""Do regen's exports load in the trainers that read them, with loss on the target's text only?

Runs a small job against the simulator (`regen sim`, model qwen/qwen3-8b; `[reconstruct]`
family qwen3 with the simulator's tokenizer, so the specforge export carries exact ids) with
three datasets that hold the hard cases:

- `chat`: multi-turn chat in mode last_turn, whose history holds the dataset's own answers
  (a system prompt on some rows; some rows end on a user turn, which gets a new answer);
- `agent`: an agent trajectory in mode each_turn, tools declared, with the dataset's own tool
  calls in the history (parallel calls, calls with reasoning, calls beside text) and their
  results; some rows end on a tool result;
- `single`: single-turn rows without a system prompt, a third with tools declared;
- `seq`: two- and three-turn chats in mode sequential, each later turn asked after the
  target's own earlier answers (their reasoning included).

Then `regen export` writes each format (sharegpt and specforge once more with
--train-source-turns), and each export is read by its trainer's own code in the trainer's own
venv (`bench/trainers/load_*.py`, run as subprocesses that print JSON):

- specforge: SpecForge's `prepare_prompt_tasks` (what `specforge train` calls) on the export's
  files joined into one (SpecForge takes one file); with --train-source-turns the records have
  no ids and go through `build_eagle3_dataset` with chat_template `qwen3-thinking` and the
  default train_only_last_turn = False;
- sharegpt: LLaMA-Factory's loader, sharegpt converter and supervised preprocessing with its
  defaults and template `qwen3`, registered in the export's `dataset_info.json` if it has one;
- tokenized: `speculators prepare-data` (trying the Parquet as it is, then a conversion) and
  the training loader's `ArrowDataset`;
- openai: `datasets.load_dataset("json")` and OpenAI fine-tuning's per-message `weight`.

What the target wrote is read from state.db (`results`: content, reasoning, tool_calls), not
from the export. Every text in the sources that the target did not write carries a marker
(SRCANSWER, SRCTHINK, SRCARG and SRCTOOL in the dataset's own assistant turns and tool
results, USERTEXT, SYSTEXT): a span under loss is on non-target text when it holds a marker or
anything besides the target's reasoning, content and calls and the template's markup.
Pre-tokenized samples' ids under loss are also compared with the ids the tokenizer's chat
template gives for the answer after the source file's history (made in the trainer's venv).

Reasoning: in every sample a trainer loaded, the tokens inside `<think>`...`</think>` are
counted where the trainer's own data preparation put them: in the answer under loss, and in
the history (what the trainer's input holds, and how much of it is under loss). They are
compared with the tokenizer's own chat template (rendered here, not by regen): the answer's
reasoning tokens as the template writes the answer, and, for the sequential samples, the
history's reasoning tokens as the template shows the prompt. Each export is read with every
trainer setting docs/exports.md and the card name for it (SETTINGS: SpecForge's thinking and
general chat templates and `train_only_last_turn`, LLaMA-Factory's `mask_history`).

Missing venvs are built with the pip commands below (CPU torch: the wheel given by --torch-wheel,
else `torch` from the package index).

Run: .venv/bin/python bench/trainers.py [--venvs DIR] [--rows N] [--torch-wheel WHEEL]
Exits 1 when a default export puts loss on non-target text, on more or less reasoning than the
template's, holds history reasoning the template does not show, or a trainer drops a sample it
was given; or when a venv cannot be built or a loader fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOADERS = Path(__file__).resolve().parent / "trainers"
# A local CPU wheel where this machine has one (2.13.0 was checked), else torch from the index.
LOCAL_TORCH = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
TORCH_WHEEL = str(LOCAL_TORCH) if LOCAL_TORCH.exists() else "torch"
MODEL = "qwen/qwen3-8b"

# `pip install` arguments per venv, in order ("{torch}" is the torch wheel). SpecForge's pins
# torch==2.11.0 and sglang==0.5.14 are skipped on purpose: data preparation needs neither.
PIP: dict[str, list[list[str]]] = {
    "specforge": [
        ["--no-deps", "specforge==0.2.0"],
        ["{torch}", "transformers==5.8.1", "datasets", "numpy", "pyyaml", "pydantic", "tqdm"]
        + ["jinja2", "psutil", "safetensors", "requests", "typing-extensions", "accelerate"],
    ],
    "llamafactory": [
        ["--no-deps", "llamafactory==0.9.5"],
        ["{torch}", "transformers==5.6.0", "datasets==4.0.0", "numpy", "pyyaml", "pydantic"]
        + ["tqdm", "jinja2", "omegaconf", "packaging", "pandas", "sentencepiece", "tiktoken"]
        + ["peft==0.18.1", "accelerate==1.11.0", "fire", "trl==0.24.0"],
    ],
    "speculators": [
        ["--no-deps", "speculators==0.9.0"],
        ["{torch}", "transformers==5.8.1", "datasets==5.1.0", "numpy<2.5", "loguru"]
        + ["pydantic", "pydantic-settings", "rich", "safetensors", "tqdm", "typer", "click"]
        + ["psutil", "huggingface-hub", "protobuf"],
        ["openai", "hs-connectors==0.9.0", "aiohttp", "httpx"],
    ],
}

# Text the target never writes: the sources mark every other text with one of these.
MARKER = re.compile(r"SRC(?:ANSWER|THINK|ARG|TOOL)|USERTEXT|SYSTEXT")
OWN_ANSWER = re.compile(r"SRC(?:ANSWER|THINK|ARG)")
# The Qwen3 template's markup around an answer (the header `<|im_start|>assistant` is not:
# under loss it is prompt).
MARKUP = ("<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>")

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
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                    "metric": {"type": "boolean"},
                },
                "required": ["city"],
            },
        },
    },
]


# --- the sources ---------------------------------------------------------------------------


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def chat_row(i: int) -> dict[str, Any]:
    """Two or three user/assistant pairs; the last answer is regenerated (last_turn), the
    earlier ones are the dataset's own, as history. Every fifth row ends on a user turn."""
    tag = f"chat-r{i}"
    msgs: list[dict[str, Any]] = []
    if i % 3 == 0:
        msgs.append({"role": "system", "content": f"SYSTEXT {tag}: answer in plain words."})
    for t in range(2 + i % 2):
        msgs.append({"role": "user", "content": f"USERTEXT {tag} q{t}: why is the sky blue?"})
        answer: dict[str, Any] = {
            "role": "assistant",
            "content": f"SRCANSWER {tag} a{t}: the dataset's own answer about the sky.",
        }
        if i % 4 == 1:
            answer["reasoning_content"] = f"SRCTHINK {tag} a{t}: its own reasoning."
        msgs.append(answer)
    if i % 5 == 4:
        msgs.append({"role": "user", "content": f"USERTEXT {tag} qx: and at sunset?"})
    return {"id": tag, "messages": msgs}


def agent_row(i: int) -> dict[str, Any]:
    """A tool-using trajectory; each_turn answers every assistant turn after a user turn or
    a tool result, with the dataset's own calls and their results as history."""
    tag = f"agent-r{i}"
    msgs: list[dict[str, Any]] = []
    if i % 2 == 0:
        msgs.append({"role": "system", "content": f"SYSTEXT {tag}: use the tools."})
    msgs.append({"role": "user", "content": f"USERTEXT {tag} q0: look up the tallest tower."})
    calls = [_call(f"call_{i}_0", "search", {"query": f"SRCARG {tag} c0", "top_k": 3})]
    if i % 4 == 3:  # parallel calls: two results follow
        calls.append(_call(f"call_{i}_1", "get_weather", {"city": "Oslo", "metric": True}))
    turn: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": calls}
    if i % 3 == 1:
        turn["reasoning_content"] = f"SRCTHINK {tag}: I should search first."
    if i % 5 == 2:
        turn["content"] = f"SRCANSWER {tag} pre: let me look that up."
    msgs.append(turn)
    for c in calls:
        msgs.append(
            {"role": "tool", "tool_call_id": c["id"], "content": f"SRCTOOL {tag} {c['id']}: 828 m"}
        )
    if i % 6 != 5:  # else the row ends on the tool results: a new answer follows them
        msgs.append({"role": "assistant", "content": f"SRCANSWER {tag} a1: it is 828 m tall."})
        if i % 2 == 1:
            msgs.append({"role": "user", "content": f"USERTEXT {tag} q1: and the second?"})
            msgs.append({"role": "assistant", "content": f"SRCANSWER {tag} a2: about 679 m."})
    return {"id": tag, "messages": msgs, "tools": TOOLS}


def single_row(i: int) -> dict[str, Any]:
    """One user turn (half with the dataset's answer after it, which is replaced), no system
    prompt, as most single-turn datasets have."""
    tag = f"single-r{i}"
    msgs: list[dict[str, Any]] = []
    msgs.append({"role": "user", "content": f"USERTEXT {tag}: name three rivers in Europe."})
    if i % 2 == 0:
        msgs.append({"role": "assistant", "content": f"SRCANSWER {tag}: the Rhine and others."})
    row: dict[str, Any] = {"id": tag, "messages": msgs}
    if i % 3 == 0:
        row["tools"] = TOOLS
    return row


def seq_row(i: int) -> dict[str, Any]:
    """Two or three user turns, answered in `sequential` mode: every answer is the target's,
    and each later turn is asked after the target's own earlier answers, reasoning and all
    (the dataset's answers here are only placeholders, replaced)."""
    tag = f"seq-r{i}"
    msgs: list[dict[str, Any]] = []
    if i % 3 == 0:
        msgs.append({"role": "system", "content": f"SYSTEXT {tag}: answer in plain words."})
    for t in range(2 + i % 2):
        msgs.append({"role": "user", "content": f"USERTEXT {tag} q{t}: and then what happened?"})
        msgs.append({"role": "assistant", "content": f"SRCANSWER {tag} a{t}: a placeholder."})
    return {"id": tag, "messages": msgs}


DATASETS = {  # name: (row maker, mode)
    "chat": (chat_row, "last_turn"),
    "agent": (agent_row, "each_turn"),
    "single": (single_row, "last_turn"),
    "seq": (seq_row, "sequential"),
}


def write_job(work: Path, base_url: str, rows: int) -> dict[str, list[dict[str, Any]]]:
    """The job file and its sources in `work`; returns each dataset's rows."""
    sources = {}
    blocks = ""
    for name, (make, mode) in DATASETS.items():
        sources[name] = [make(i) for i in range(rows)]
        text = "".join(json.dumps(r) + "\n" for r in sources[name])
        (work / f"{name}.jsonl").write_text(text)
        blocks += (
            f'\n[[datasets]]\nname = "{name}"\npath = "{name}.jsonl"\n'
            f'format = "openai"\nmode = "{mode}"\n'
        )
    (work / "job.toml").write_text(
        f"""[job]
name = "trainers-bench"
output_dir = "out"

[endpoint]
base_url = "{base_url}"
api_key_env = "REGEN_BENCH_KEY"

[generation]
model = "{MODEL}"
max_tokens = 2048
temperature = 0.7

[run]
concurrency = 32
progress_interval_s = 1

# The simulator's tokenizer with its Qwen3 template: the same vocabulary and template as the
# trainers' tokenizer (tok_qwen3), so `regen export --format specforge` writes exact ids.
[reconstruct]
family = "qwen3"
tokenizer = "sim"
{blocks}"""
    )
    return sources


# --- venvs ---------------------------------------------------------------------------------


def ensure_tokenizer(venvs: Path) -> Path:
    """tok_qwen3: the simulator's tokenizer.json with the Qwen3 chat template, as the
    trainers load a model's tokenizer (pad `<|endoftext|>`, no bos)."""
    tok = venvs / "tok_qwen3"
    if (tok / "tokenizer.json").exists() and (tok / "tokenizer_config.json").exists():
        return tok
    sim = REPO / "src" / "regen" / "sim" / "tokenizer"
    tok.mkdir(parents=True, exist_ok=True)
    shutil.copy(sim / "tokenizer.json", tok / "tokenizer.json")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "[UNK]",
        "model_max_length": 262144,
        "clean_up_tokenization_spaces": False,
        "chat_template": (sim / "templates" / "qwen3.jinja").read_text(),
    }
    (tok / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tok


def ensure_venv(venvs: Path, name: str, wheel: str, python: str, ran: list[str]) -> str | None:
    """Build `venvs/name` with PIP[name] unless it has a python already. Returns why it could
    not be built, or None. A failed build is removed (its log stays), so a rerun tries again."""
    venv = venvs / name
    if (venv / "bin" / "python").exists():
        return None
    if not Path(wheel).exists():
        return f"no venv at {venv}, and the torch wheel {wheel} is missing: give --torch-wheel"
    log = venvs / f"log_{name}.txt"
    print(f"building the {name} venv at {venv} (log: {log}) ...", flush=True)
    pip = str(venv / "bin" / "pip")
    cmds = [[python, "-m", "venv", str(venv)]]
    cmds += [
        [pip, "install", *(wheel if a == "{torch}" else a for a in args)] for args in PIP[name]
    ]
    with log.open("a") as out:
        for cmd in cmds:
            ran.append(shlex.join(cmd))
            out.write(f"\n$ {shlex.join(cmd)}\n")
            out.flush()
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                shutil.rmtree(venv, ignore_errors=True)
                return f"`{shlex.join(cmd)}` exited {rc} (see {log})"
    if name == "llamafactory":
        # llamafactory/data/mm_plugin.py imports torchaudio; PyPI's newest torchaudio does not
        # load with torch 2.13, and text-only data never uses it: an empty stub stands in.
        site = next((venv / "lib").glob("python3*/site-packages"))
        (site / "torchaudio").mkdir(exist_ok=True)
        (site / "torchaudio" / "__init__.py").write_text("# stub\n")
        ran.append(f"mkdir -p {site}/torchaudio && echo '# stub' > {site}/torchaudio/__init__.py")
    return None


def python_version(python: str) -> str:
    if not Path(python).exists():
        return "none"
    out = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "unknown"


# --- the run -------------------------------------------------------------------------------


@contextlib.contextmanager
def simulator(regen: str, work: Path) -> Iterator[str]:
    """`regen sim` as its own process on a free port, answering at once; yields its URL."""
    (work / "sim.toml").write_text("seed = 7\ntime_scale = 0.0\n")
    log = work / "sim.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [regen, "sim", "--port", "0", "--config", str(work / "sim.toml")],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"regen sim did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        # "regen sim listening on http://127.0.0.1:PORT/api/v1"
        yield log.read_text().split("listening on", 1)[1].split()[0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run(cmd: list[str], commands: list[str], work: Path, **kw: Any) -> None:
    """Run a regen command, record it for the report (with the work dir as $WORK), and stop
    the bench with its output when it fails."""
    commands.append(shlex.join(cmd).replace(str(work), "$WORK"))
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise SystemExit(
            f"`{shlex.join(cmd)}` exited {res.returncode}:\n{res.stdout[-3000:]}"
            f"\n{res.stderr[-3000:]}"
        )


EXPORTS = [  # (label, format, extra flags, default mode?)
    ("specforge", "specforge", [], True),
    ("specforge --train-source-turns", "specforge", ["--train-source-turns"], False),
    ("sharegpt", "sharegpt", [], True),
    ("sharegpt --train-source-turns", "sharegpt", ["--train-source-turns"], False),
    ("tokenized", "tokenized", [], True),
    ("openai", "openai", [], True),
]


def export_dir(work: Path, label: str) -> Path:
    return work / "exports" / label.replace(" --", "-")


def read_truth(out: Path, sources: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per answer (item id), from state.db and the source files, not from any export: the
    target's answer, the history it was asked after (the source row's messages before its
    turn), the row's tools and where it came from."""
    db = sqlite3.connect(f"file:{out / 'state.db'}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT r.item_id, r.dataset, r.content, r.reasoning, r.tool_calls, r.finish_reason,"
            " c.row_index, i.turn_index, c.id FROM results r JOIN items i ON i.id = r.item_id"
            " JOIN conversations c ON c.id = i.conversation_id"
        ).fetchall()
    finally:
        db.close()
    answers = {}  # (conversation, turn): the target's answer
    for item, _, content, reasoning, calls, _, _, turn, conv in rows:
        answers[(conv, turn)] = {
            "role": "assistant",
            "content": content or "",
            "reasoning_content": reasoning,
            "tool_calls": json.loads(calls) if calls else None,
        }
        if MARKER.search(json.dumps(answers[(conv, turn)])):
            raise SystemExit(f"answer {item} holds a source marker: the judge cannot tell")
    truth = {}
    for item, dataset, _, _, _, finish, row, turn, conv in rows:
        msgs = sources[dataset][row]["messages"]
        if not (turn == len(msgs) or msgs[turn]["role"] == "assistant"):
            raise SystemExit(f"{dataset} row {row}: turn {turn} is not an assistant turn")
        answer = answers[(conv, turn)]
        history = msgs[:turn]
        earlier: list[dict[str, Any]] = []  # the target's own answers in the history
        if DATASETS[dataset][1] == "sequential":
            history = [answers.get((conv, j), m) for j, m in enumerate(history)]
            earlier = [answers[(conv, j)] for j in range(turn) if (conv, j) in answers]
        truth[item] = {
            "dataset": dataset,
            "row": row,
            "tag": f"{dataset}-r{row}",
            "history": history,
            "tools": sources[dataset][row].get("tools"),
            "answer": answer,
            "earlier": earlier,
            "finish_reason": finish,
            "tools_involved": bool(answer["tool_calls"])
            or any(m.get("tool_calls") or m["role"] == "tool" for m in history),
        }
    return truth


def written_ids(work: Path, label: str, fmt: str) -> list[str]:
    """The ids of the samples the export wrote (train split)."""
    train = export_dir(work, label) / "train"
    if fmt == "tokenized":
        import pyarrow.parquet as pq

        return [
            i for f in sorted(train.glob("*.parquet")) for i in pq.read_table(f)["id"].to_pylist()
        ]
    ids = []
    for f in sorted(train.glob("*.jsonl")):
        ids += [json.loads(line)["id"] for line in f.read_text().splitlines() if line.strip()]
    return ids


SETTINGS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    # The trainer settings docs/exports.md and the card name, per export: (what the table
    # calls it, the loader's parameters). An export not listed is read one way.
    "specforge --train-source-turns": [
        ("chat_template qwen3-thinking", {}),
        ("chat_template qwen3-thinking, train_only_last_turn", {"train_only_last_turn": True}),
        ("chat_template qwen (the general parser)", {"chat_template": "qwen"}),
    ],
    "sharegpt --train-source-turns": [
        ("template qwen3", {}),
        ("template qwen3, mask_history", {"mask_history": True}),
    ],
}


def loader_jobs(
    work: Path, venvs: Path, tok: Path, main_python: str
) -> list[tuple[str, str, str, Path, dict[str, Any]]]:
    """(export label, trainer setting, python, loader script, params) for each export read
    with each setting it documents."""
    jobs = []
    for label, python, script, p in _loader_jobs(work, venvs, tok, main_python):
        for setting, extra in SETTINGS.get(label, [("", {})]):
            own = p | extra
            if "workdir" in p:  # each setting's run writes its own files
                own["workdir"] = f"{p['workdir']}-{slug(setting)}"
            jobs.append((label, setting, python, script, own))
    return jobs


def slug(text: str) -> str:
    """`text` as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def _loader_jobs(
    work: Path, venvs: Path, tok: Path, main_python: str
) -> list[tuple[str, str, Path, dict[str, Any]]]:
    """(export label, python, loader script, params) for each export."""
    truth = str(work / "truth.json")
    jobs = []
    for label, fmt, _, _ in EXPORTS:
        exp = export_dir(work, label)
        workdir = str(work / "loaders" / label.replace(" --", "-"))
        if fmt == "specforge":
            # SpecForge reads one file: the export's per-dataset files, joined.
            joined = work / f"{exp.name}-train.jsonl"
            parts = sorted((exp / "train").glob("*.jsonl"))
            joined.write_text("".join(p.read_text() for p in parts))
            p = {
                "tokenizer": str(tok),
                "data": str(joined),
                "folder": str(exp / "train"),
                "truth": truth,
                "chat_template": "qwen3-thinking",
                "max_length": 2048,  # DataConfig.max_length's default
                "train_only_last_turn": False,  # the default
            }
            jobs.append(
                (label, str(venvs / "specforge/bin/python"), LOADERS / "load_specforge.py", p)
            )
        elif fmt == "sharegpt":
            p = {"tokenizer": str(tok), "export": str(exp), "workdir": workdir, "template": "qwen3"}
            py = str(venvs / "llamafactory/bin/python")
            jobs.append((label, py, LOADERS / "load_llamafactory.py", p))
        elif fmt == "tokenized":
            p = {
                "tokenizer": str(tok),
                "export": str(exp),
                "workdir": workdir,
                "truth": truth,
                "seq_length": 8192,  # prepare-data's default
            }
            py = str(venvs / "speculators/bin/python")
            jobs.append((label, py, LOADERS / "load_speculators.py", p))
        else:
            p = {"tokenizer": str(tok), "export": str(exp)}
            jobs.append((label, main_python, LOADERS / "load_openai.py", p))
    return jobs


def run_loader(
    work: Path, label: str, python: str, script: Path, p: dict[str, Any]
) -> tuple[dict[str, Any] | None, str]:
    """Run one loader; (its result, or None, and its command line)."""
    params = work / f"params-{slug(label)}.json"
    params.write_text(json.dumps(p, indent=2))
    cmd = [python, str(script), str(params)]
    env = {
        **os.environ,
        "HF_HOME": str(work / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "DISABLE_VERSION_CHECK": "1",  # LLaMA-Factory: its pins are not ours to check
    }
    if not Path(python).exists():
        return {"error": f"no python at {python}"}, shlex.join(cmd)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    (work / f"loader-{params.stem}.log").write_text(res.stdout + "\n--- stderr\n" + res.stderr)
    line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
    if res.returncode != 0 or line is None:
        tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exited {res.returncode}: {tail}"}, shlex.join(cmd)
    return json.loads(line[len("RESULT ") :]), shlex.join(cmd)


# --- the judge -----------------------------------------------------------------------------


def target_pieces(answer: dict[str, Any]) -> list[str]:
    """The target's own text: reasoning, content, and each call's name, argument keys and
    values (as JSON writes them)."""
    pieces = [(answer.get("reasoning_content") or "").strip(), answer["content"].strip()]
    for tc in answer.get("tool_calls") or []:
        pieces.append(tc["function"]["name"])
        for k, v in json.loads(tc["function"]["arguments"] or "{}").items():
            pieces.append(k)
            pieces.append(json.dumps(v, ensure_ascii=False).strip('"'))
    return [p for p in pieces if p]


def residue(text: str, pieces: list[str]) -> str:
    """What is left of a span under loss once the target's pieces, the template's markup and
    JSON punctuation are taken out: empty for a span of the target's text only."""
    for m in MARKUP:
        text = text.replace(m, " ")
    for p in sorted(pieces, key=len, reverse=True):
        text = text.replace(p, " ", 1)
    text = re.sub(r'"(?:name|arguments)"', " ", text)
    return re.sub(r'[\s{}\[\]":,]+', "", text)


def match_ids(samples: list[dict[str, Any]], candidates: list[str], truth: dict[str, Any]) -> None:
    """Give each sample without an id (the trainer kept none) the answer whose text it holds
    last: a sample ends on its answer, and only a sequential sample's history holds other
    answers of the target (the earlier turns of the same conversation)."""
    left = Counter(candidates)
    for s in samples:
        if s.get("id") is not None:
            continue
        hits = []
        for iid in left:
            pieces = sorted(target_pieces(truth[iid]["answer"]), key=len, reverse=True)
            # The start of the longest piece: a sample cut at the trainer's length keeps it.
            sig = [pieces[0][:64]] if pieces and len(pieces[0]) >= 16 else pieces
            if sig and all(p in s["text"] for p in sig) and left[iid] > 0:
                hits.append((max(s["text"].rfind(p) for p in sig), iid))
        if hits:
            iid = max(hits)[1]
            s["id"] = iid
            left[iid] -= 1


@dataclass
class Row:
    """One line of the table, and what its notes say."""

    label: str
    default: bool
    setting: str = ""
    """The trainer setting it was read with, where the export documents more than one."""
    trainer: str = "-"
    answers: int = 0
    written: int = 0
    left_out: dict[str, int] = field(default_factory=dict)
    loaded: int = 0
    loss_tokens: int = 0
    non_target: int = 0
    own_tokens: int = 0
    missing: int = 0
    tool_loaded: int = 0
    tool_written: int = 0
    ids_checked: int = 0
    ids_equal: int = 0
    cut: int = 0
    """Samples the trainer cut at its length limit: their text is not judged."""
    reasoning: Counter[str] = field(default_factory=Counter)
    """Reasoning tokens: `samples`, `target` (the answers' as the template renders them),
    `loss` (under loss in the answers), `differ` (samples where the two differ); over the
    sequential samples, `seq`, `history` (in the history as the trainer holds it),
    `history_loss`, `template` (as the model's template shows the history), `seq_differ`."""
    error: str | None = None
    rejected: list[str] = field(default_factory=list)
    """What the trainer refused as the export gave it (the numbers are then from a workaround)."""
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        dropped = self.written - self.loaded
        bad = self.non_target > 0 or dropped > 0 or bool(self.rejected)
        bad = bad or self.reasoning["differ"] > 0 or self.reasoning["seq_differ"] > 0
        return self.error is not None or (self.default and bad)

    @property
    def name(self) -> str:
        return f"`{self.label}`" + (f" ({self.setting})" if self.setting else "")


def judge(row: Row, result: dict[str, Any], written: list[str], truth: dict[str, Any]) -> None:
    """Count what the trainer loaded and where its loss falls."""
    samples = result["samples"]
    match_ids(samples, written, truth)
    row.trainer = result["trainer"]
    row.loaded = sum(1 for s in samples if s.get("id") in truth)
    unmatched = [s for s in samples if s.get("id") not in truth]
    if unmatched:
        row.notes.append(
            f"{len(unmatched)} loaded sample(s) could not be joined to an answer, e.g. "
            f"{(unmatched[0].get('text') or '')[:200]!r}"
        )
    row.tool_written = sum(1 for i in written if truth[i]["tools_involved"])
    shown = Counter[str]()
    for s in samples:
        t = truth.get(s.get("id") or "")
        row.loss_tokens += sum(n for n, _ in s["spans"])
        if t is None:
            continue
        row.tool_loaded += t["tools_involved"]
        if s.get("n_tokens") and s["n_tokens"] >= result.get("max_tokens", float("inf")):
            row.cut += 1  # what is past the trainer's limit is not trained, by its own rule
            continue
        pieces = target_pieces(t["answer"])
        # A sequential sample's history is the target's own: under loss it is its text too.
        own = pieces + [p for e in t["earlier"] for p in target_pieces(e)]
        bad = False
        for n, text in s["spans"]:
            if MARKER.search(text) or residue(text, own):
                bad = True
                row.own_tokens += n if OWN_ANSWER.search(text) else 0
                if shown["non-target"] < 2:
                    shown["non-target"] += 1
                    row.notes.append(
                        f"loss on non-target text in {s['id']} ({t['tag']}, {t['dataset']}): "
                        f"{n} tokens {text[:160]!r}"
                    )
        row.non_target += bad
        under = "".join(text for _, text in s["spans"])
        lost = [p for p in pieces if p not in under]
        if lost:
            row.missing += 1
            if shown["missing"] < 2:
                shown["missing"] += 1
                row.notes.append(
                    f"target text not under loss in {s['id']} ({t['tag']}): {lost[0][:120]!r}"
                )
        if "ids_match" in s:
            row.ids_checked += 1
            row.ids_equal += s["ids_match"]
            if not s["ids_match"] and shown["ids"] < 2:
                shown["ids"] += 1
                got = "".join(text for _, text in s["spans"])
                row.notes.append(
                    f"ids under loss differ from the template's in {s['id']} ({t['tag']}): "
                    f"loss {got[:150]!r} vs template {s.get('expected_text', '')[:150]!r}"
                )
        if "ids_error" in s and shown["ids_error"] < 2:
            shown["ids_error"] += 1
            row.notes.append(f"could not render {s['id']} with the template: {s['ids_error']}")
        if "reasoning" in s and "reasoning" in t:
            judge_reasoning(row, s, t, shown)
    if row.cut:
        row.notes.append(
            f"{row.cut} sample(s) cut at the trainer's length limit ({result['max_tokens']} "
            "tokens): their text is not judged"
        )
    loaded_ids = Counter(s.get("id") for s in samples)
    dropped = [i for i in written if loaded_ids[i] == 0]
    for i in dropped[:5]:
        t = truth[i]
        said = [w for w in result.get("warnings", []) if t["tag"] + " " in w]
        row.notes.append(
            f"dropped {i} ({t['tag']}, {t['dataset']}): "
            + (f"the trainer said {said[0][:300]!r}" if said else "no warning names it")
        )
    if len(dropped) > 5:
        row.notes.append(f"... and {len(dropped) - 5} more dropped")


def judge_reasoning(row: Row, s: dict[str, Any], t: dict[str, Any], shown: Counter[str]) -> None:
    """Count one sample's reasoning tokens against the template's: the answer's under loss,
    and, in a sequential sample, the history's as the trainer holds it."""
    got, want = s["reasoning"], t["reasoning"]
    r = row.reasoning
    r["samples"] += 1
    r["target"] += want["answer"]
    r["loss"] += got["answer_loss"]
    if got["answer_loss"] != want["answer"]:
        r["differ"] += 1
        if shown["reasoning"] < 2:
            shown["reasoning"] += 1
            row.notes.append(
                f"reasoning under loss in {s['id']} ({t['tag']}): {got['answer_loss']} tokens, "
                f"the template's {want['answer']}"
            )
    if not t["earlier"]:
        return
    r["seq"] += 1
    r["history"] += got["history"]
    r["history_loss"] += got["history_loss"]
    r["template"] += want["history"]
    if got["history"] != want["history"]:
        r["seq_differ"] += 1
        if shown["history"] < 2:
            shown["history"] += 1
            row.notes.append(
                f"history reasoning in {s['id']} ({t['tag']}): {got['history']} tokens "
                f"({got['history_loss']} under loss), the template shows {want['history']}"
            )


def template_reasoning(tok_dir: Path, truth: dict[str, dict[str, Any]]) -> None:
    """Each answer's reasoning tokens as the tokenizer's own chat template renders them
    (`reasoning`: `answer`, and `history`, what it shows of the history's), made here with
    the trainers' tokenizer, not by regen."""
    from transformers import AutoTokenizer

    sys.path.insert(0, str(LOADERS))
    from _common import expected_ids, reasoning_counts

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    for t in truth.values():
        try:
            prompt, completion = expected_ids(tok, t["history"], t["tools"], t["answer"])
        except Exception:  # the judge then has nothing to compare: the sample is not counted
            continue
        ids = prompt + completion
        counts = reasoning_counts(tok, ids, [0] * len(prompt) + [1] * len(completion))
        t["reasoning"] = {"answer": counts["answer_loss"], "history": counts["history"]}


def left_out(work: Path, label: str) -> tuple[int, dict[str, int]]:
    """The samples the export's manifest counts as written, and what it left out, by reason."""
    manifest = json.loads((export_dir(work, label) / "manifest.json").read_text())
    reasons: Counter[str] = Counter()
    written = 0
    for d in manifest["datasets"].values():
        written += d["samples"]["train"] + d["samples"]["validation"]
        reasons.update(d["dropped"])
    return written, dict(reasons)


# --- the report ----------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    head = [
        "export",
        "read by",
        "answers",
        "written (left out by the export)",
        "loaded",
        "tokens under loss",
        "samples with loss on non-target text (tokens of the dataset's own answers)",
        "samples with target text not under loss",
        "tool-call samples loaded",
        "ids under loss = template's",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        if r.error:
            cells = [r.name, r.trainer, str(r.answers), "-", f"failed: {r.error}"]
            cells += ["-"] * (len(head) - len(cells))
        else:
            out = ", ".join(f"{k} {v}" for k, v in sorted(r.left_out.items())) or "none"
            ids = f"{r.ids_equal}/{r.ids_checked}" if r.ids_checked else "-"
            cells = [
                r.name,
                r.trainer + (" (rejected the export as written: see notes)" if r.rejected else ""),
                str(r.answers),
                f"{r.written} ({out})",
                str(r.loaded),
                f"{r.loss_tokens:,}",
                f"{r.non_target} ({r.own_tokens:,})",
                str(r.missing),
                f"{r.tool_loaded}/{r.tool_written}",
                ids,
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def reasoning_table(rows: list[Row]) -> str:
    """Per export and trainer setting: the answers' reasoning tokens under loss against the
    template's, and the sequential samples' history reasoning against what the template
    shows."""
    head = [
        "export (trainer setting)",
        "samples",
        "answers' reasoning tokens: the template's / under loss",
        "samples where they differ",
        "sequential samples",
        "history reasoning tokens: the template shows / the trainer holds (under loss)",
        "samples where they differ",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        r = row.reasoning
        if row.error:
            cells = [row.name, "-", f"failed: {row.error}"] + ["-"] * 4
        else:
            cells = [
                row.name,
                str(r["samples"]),
                f"{r['target']:,} / {r['loss']:,}",
                str(r["differ"]),
                str(r["seq"]),
                f"{r['template']:,} / {r['history']:,} ({r['history_loss']:,})",
                str(r["seq_differ"]),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venvs", type=Path, default=Path.home() / ".cache" / "regen-trainer-venvs")
    ap.add_argument("--rows", type=int, default=40, help="rows per dataset")
    ap.add_argument("--torch-wheel", default=TORCH_WHEEL)
    ap.add_argument("--python", default="python3", help="Python 3.11 to make the venvs with")
    ap.add_argument("--regen", default=str(REPO / ".venv" / "bin" / "regen"))
    ap.add_argument("--keep", action="store_true", help="keep the work folder and say where")
    args = ap.parse_args()
    started = time.monotonic()
    venvs: Path = args.venvs.resolve()
    venvs.mkdir(parents=True, exist_ok=True)
    main_python = str(Path(args.regen).parent / "python")

    venv_errors = {}
    built: list[str] = []  # the commands that built missing venvs, for the report
    for name in PIP:
        err = ensure_venv(venvs, name, args.torch_wheel, args.python, built)
        if err:
            venv_errors[name] = err
            print(f"error: the {name} venv could not be built: {err}", file=sys.stderr)
    tok = ensure_tokenizer(venvs)

    work = Path(tempfile.mkdtemp(prefix="regen-trainers-"))
    commands = [shlex.join([sys.executable, *sys.argv]), *built]
    try:
        with simulator(args.regen, work) as url:
            commands.append(f"regen sim --port 0 --config $WORK/sim.toml   # {url}")
            sources = write_job(work, url, args.rows)
            env = {**os.environ, "REGEN_BENCH_KEY": "sk-bench-not-a-secret"}
            run([args.regen, "run", str(work / "job.toml")], commands, work, env=env)
        for label, fmt, flags, _ in EXPORTS:
            cmd = [args.regen, "export", str(work / "out"), "--format", fmt]
            run([*cmd, "--to", str(export_dir(work, label)), *flags], commands, work)
        truth = read_truth(work / "out", sources)
        template_reasoning(tok, truth)
        (work / "truth.json").write_text(json.dumps(truth, ensure_ascii=False))

        needs = {"specforge": "specforge", "sharegpt": "llamafactory", "tokenized": "speculators"}
        rows: list[Row] = []
        futures = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            for label, setting, python, script, p in loader_jobs(work, venvs, tok, main_python):
                fmt, default = next((f, d) for lab, f, _, d in EXPORTS if lab == label)
                row = Row(label, default, setting, answers=len(truth))
                rows.append(row)
                if needs.get(fmt) in venv_errors:
                    row.error = f"no {needs[fmt]} venv ({venv_errors[needs[fmt]]})"
                    continue
                if fmt == "specforge":
                    train = export_dir(work, label) / "train"
                    joined = f"cat {train}/*.jsonl > {p['data']}"
                    commands.append(joined.replace(str(work), "$WORK"))
                key = f"{label} {setting}".strip()
                futures[key] = pool.submit(run_loader, work, key, python, script, p)
        for row in rows:
            if row.error:
                continue
            result, cmd = futures[f"{row.label} {row.setting}".strip()].result()
            commands.append(cmd.replace(str(work), "$WORK"))
            fmt = next(f for lab, f, _, _ in EXPORTS if lab == row.label)
            row.written, row.left_out = left_out(work, row.label)
            ids = written_ids(work, row.label, fmt)
            if len(ids) != row.written:
                row.notes.append(
                    f"the manifest says {row.written} written, the files hold {len(ids)}"
                )
            if result is None or "error" in result:
                row.error = (result or {}).get("error", "no result")
                continue
            judge(row, result, ids, truth)
            row.rejected = result.get("rejected", [])
            for why in row.rejected:
                row.notes.insert(0, f"REJECTED: {why}; the numbers are from the workaround")
            row.notes.insert(
                0,
                f"read as: {result['path']}; "
                + ", ".join(f"{k} {v}" for k, v in result.get("libs", {}).items()),
            )
            verb = "prepare-data" if fmt == "tokenized" else "prepare_prompt_tasks"
            for a in result.get("attempts", []):
                said = (
                    f"accepted ({a['rows']} of {a.get('of', len(ids))} rows)"
                    if a["accepted"]
                    else f"rejected: {a['error']}"
                )
                row.notes.append(f"{verb} with {a['way']}: {said}")
            if "folder" in result:
                row.notes.append(f"load_dataset(EXPORT_FOLDER): {result['folder']}")
            if "defaults" in result:
                row.notes.append(f"settings: {result['defaults']}")
            distinct = list(dict.fromkeys(w[:300] for w in result.get("warnings", [])))
            for w in distinct[:3]:
                row.notes.append(f"warning: {w!r}")
            if len(distinct) > 3:
                row.notes.append(f"... {len(distinct) - 3} more distinct warnings")
    finally:
        if args.keep:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"## regen exports read by their trainers ({args.rows} rows per dataset)\n")
    print(table(rows))
    print("\n### Reasoning under loss and in the history, per trainer setting\n")
    print(reasoning_table(rows))
    print()
    for r in rows:
        for n in r.notes:
            print(f"- {r.name}: {n}")
    for name, err in venv_errors.items():
        print(f"- the {name} venv could not be built: {err}")
    print("\nCommands ($WORK is a temporary folder):\n")
    print("```sh")
    print("\n".join(commands))
    print("```\n")
    venv_python = python_version(str(venvs / "specforge" / "bin" / "python"))
    print(
        f"{today}; machine: {platform.machine()}, nproc {nproc}, Python "
        f"{platform.python_version()} (venvs: {venv_python}),"
        f" {platform.system()} {platform.release()}; took {time.monotonic() - started:.0f} s"
    )
    failed = [r.label for r in rows if r.failed] + list(venv_errors)
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
