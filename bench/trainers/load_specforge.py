"""SpecForge 0.2.0: read a regen `specforge` export the way `specforge train` prepares its data.

`specforge/training/assembly.py::_prepare_prompts` calls `prepare_prompt_tasks` on the one file
named by `data.train_data_path`. That reads the first record: if it has `input_ids` and
`loss_mask`, every record is taken as pre-tokenized (checked and truncated to
`data.max_length`); otherwise the file is loaded with `datasets` and goes through
`build_eagle3_dataset`, which renders each conversation with the tokenizer's chat template and
puts loss on every assistant turn the `data.chat_template` pattern finds
(`train_only_last_turn` False by default).
"""

from __future__ import annotations

import json
import traceback
from importlib.metadata import version
from pathlib import Path
from typing import Any

from _common import check_ids, emit, params, sample, warnings_of
from specforge.data.prompt_builder import prepare_prompt_tasks
from transformers import AutoTokenizer


def main() -> None:
    p = params()
    tok = AutoTokenizer.from_pretrained(p["tokenizer"])
    truth = json.loads(Path(p["truth"]).read_text())
    max_length = p["max_length"]
    with open(p["data"], encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    # Pre-tokenized rows keep no id: they are told apart by their ids (truncated as SpecForge
    # truncates them).
    by_ids: dict[tuple[int, ...], list[str]] = {}
    for r in records:
        if "input_ids" in r:
            by_ids.setdefault(tuple(r["input_ids"][:max_length]), []).append(r["id"])
    pretokenized = bool(records) and {"input_ids", "loss_mask"} <= set(records[0])

    def prepare(path: str) -> Any:
        return prepare_prompt_tasks(
            path,
            tok,
            chat_template=p["chat_template"],
            max_length=max_length,
            is_preformatted=False,
            train_only_last_turn=p["train_only_last_turn"],
            cache_dir=None,
            cache_key=None,
            num_proc=1,
            min_loss_tokens=1,
        )

    samples = []
    attempts = []
    with warnings_of("specforge", "datasets") as warned:
        # The export's train folder as it is (one file per dataset), then the files joined.
        try:
            n = len(prepare(p["folder"]))
            attempts.append({"way": "the train folder", "accepted": True, "rows": n})
        except Exception as exc:
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            attempts.append({"way": "the train folder", "accepted": False, "error": last[:300]})
        tasks = prepare(p["data"])
        attempts.append({"way": "the train files joined", "accepted": True, "rows": len(tasks)})
        for task in tasks:  # the raw path's rows are normalized as they are read
            ids = [int(t) for t in task["payload"]["input_ids"]]
            mask = [int(m) for m in task["payload"]["loss_mask"]]
            sid = None
            if pretokenized:
                same = by_ids.get(tuple(ids)) or [None]
                sid = same.pop(0) if len(same) > 1 else same[0]
            s = sample(tok, ids, mask, sid)
            if sid is not None and sid in truth:
                check_ids(tok, s, ids, mask, truth[sid])
            samples.append(s)
    emit(
        {
            "max_tokens": max_length,  # the length the trainer cuts a sample at
            "trainer": f"SpecForge {version('specforge')}",
            "libs": {k: version(k) for k in ("transformers", "datasets")},
            "path": "pre-tokenized (input_ids, loss_mask)"
            if pretokenized
            else f"conversations, data.chat_template {p['chat_template']} (the default llama3 "
            "finds no Qwen3 turn), data.train_only_last_turn "
            f"{p['train_only_last_turn']}, data.max_length {max_length}",
            "attempts": attempts,
            "samples": samples,
            "warnings": warned,
        }
    )


if __name__ == "__main__":
    main()
