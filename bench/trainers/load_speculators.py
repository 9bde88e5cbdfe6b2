"""speculators 0.9.0: read a regen `tokenized` export (Parquet) with `speculators prepare-data`
and the training loader.

`prepare-data` (speculators/cli/prepare_data.py) hands each `--data` to
`load_and_preprocess_dataset`, whose `load_raw_dataset` takes a `.json`/`.jsonl` file, a
folder of them, `hf://datasets/...jsonl` or `hf:<id>[:<subset>:<split>]`
(`datasets.load_dataset(id)`, which also reads a local folder). Rows with `input_ids` and
`loss_mask` pass through as they are (truncated to --seq-length, 8192 by default; rows with no
token under loss dropped) and get `seq_len`; the result is saved with `save_to_disk`, which
the trainer's `ArrowDataset` reads with `load_from_disk`.

Each way a user might name the export is tried and reported (with the rows it loads); the
first that loads is the one judged. The last is the conversion a user would write when none
does: the Parquet rows' `input_ids` and `loss_mask` as JSONL.
"""

from __future__ import annotations

import json
import traceback
from importlib.metadata import version
from pathlib import Path

import pyarrow.parquet as pq
from _common import check_ids, emit, params, sample, warnings_of
from speculators.cli.prepare_data import prepare_data
from speculators.train.data import ArrowDataset
from transformers import AutoTokenizer


def main() -> None:
    p = params()
    export, workdir = Path(p["export"]), Path(p["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(p["tokenizer"])
    truth = json.loads(Path(p["truth"]).read_text())
    seq_length = p["seq_length"]
    files = sorted((export / "train").glob("*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    by_ids: dict[tuple[int, ...], list[str]] = {}
    for r in rows:
        by_ids.setdefault(tuple(r["input_ids"][:seq_length]), []).append(r["id"])
    converted = workdir / "converted.jsonl"
    with converted.open("w") as f:
        for r in rows:
            f.write(json.dumps({"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}) + "\n")
    ways = [
        ("the Parquet files as they are (--data FILE.parquet ...)", [str(f) for f in files]),
        ("the export's train folder (--data DIR/train)", [str(export / "train")]),
        ("the train folder through datasets (--data hf:DIR/train)", [f"hf:{export / 'train'}"]),
        ("the export folder through datasets (--data hf:DIR)", [f"hf:{export}"]),
        ("converted to JSONL {input_ids, loss_mask} (--data converted.jsonl)", [str(converted)]),
    ]
    attempts = []
    samples: list[dict[str, object]] = []
    judged = False
    with warnings_of("speculators", "datasets") as warned:
        for k, (way, data) in enumerate(ways):
            out = workdir / f"prepared-{k}"
            try:
                prepare_data(
                    model=p["tokenizer"],
                    data=data,
                    output=str(out),
                    seq_length=seq_length,
                    num_preprocessing_workers=1,
                )
                # What training reads: ArrowDataset does load_from_disk and needs seq_len.
                loaded = ArrowDataset(max_len=seq_length, datapath=str(out), on_missing="skip")
            except (Exception, SystemExit) as exc:
                last = traceback.format_exception_only(type(exc), exc)[-1].strip()
                attempts.append({"way": way, "accepted": False, "error": last[:500]})
                continue
            attempts.append(
                {
                    "way": way,
                    "accepted": True,
                    "rows": len(loaded.data),
                    "of": len(rows),
                    "columns": loaded.data.column_names,
                }
            )
            if judged:
                continue  # the first way that loads is the one judged; the rest are reported
            judged = True
            for r in loaded.data:
                ids = [int(t) for t in r["input_ids"]]
                mask = [int(m) for m in r["loss_mask"]]
                same = by_ids.get(tuple(ids)) or [None]
                sid = same.pop(0) if len(same) > 1 else same[0]
                s = sample(tok, ids, mask, sid)
                if sid is not None and sid in truth:
                    check_ids(tok, s, ids, mask, truth[sid])
                samples.append(s)
    emit(
        {
            "max_tokens": seq_length,  # the length the trainer cuts a sample at
            "trainer": f"speculators {version('speculators')}",
            "libs": {k: version(k) for k in ("transformers", "datasets")},
            "path": next((a["way"] for a in attempts if a["accepted"]), "none"),
            "attempts": attempts,
            "written_ids": [r["id"] for r in rows],
            "samples": samples,
            "warnings": warned,
        }
    )


if __name__ == "__main__":
    main()
