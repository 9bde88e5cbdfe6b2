"""LLaMA-Factory 0.9.5: read a regen `sharegpt` export the way `llamafactory-cli train` (sft)
does, with its defaults and template `qwen3`.

The export is registered by the export folder's own `dataset_info.json` when it has one. When
there is none, or it fails to load (reported under `rejected`), by one entry per
`train/<dataset>.jsonl` written here (formatting `sharegpt`, columns `conversations`, and
`system` and `tools` where a row has them). `get_dataset` then runs the
loader, `SharegptDatasetConverter` and `SupervisedDatasetProcessor` (cutoff_len 2048,
mask_history False, train_on_prompt False): every gpt and function_call turn gets loss.
"""

from __future__ import annotations

import json
import traceback
from importlib.metadata import version
from pathlib import Path
from typing import Any

from _common import emit, params, sample, warnings_of
from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
from llamafactory.extras.constants import IGNORE_INDEX
from llamafactory.hparams import DataArguments, ModelArguments
from transformers import AutoTokenizer, Seq2SeqTrainingArguments


def own_entries(export: Path, workdir: Path) -> tuple[str, list[str]]:
    """A dataset_info.json written here: one entry per `train/<dataset>.jsonl`, mapping
    `system` only for a file where a row has one (a mapped column that no row has fails the
    whole load with a KeyError)."""
    info = {}
    for f in sorted((export / "train").glob("*.jsonl")):
        with f.open(encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        columns = {"messages": "conversations"}
        for col in ("system", "tools"):
            if any(col in r for r in rows):
                columns[col] = col
        info[f"regen_{f.stem}"] = {
            "file_name": str(f),
            "formatting": "sharegpt",
            "columns": columns,
        }
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "dataset_info.json").write_text(json.dumps(info, indent=2))
    return str(workdir), list(info)


def load(tok: Any, dataset_dir: str, names: list[str], p: dict[str, Any]) -> tuple[Any, Any]:
    """get_dataset with LLaMA-Factory's defaults; (the train dataset, the data arguments)."""
    data_args = DataArguments(
        template=p["template"],
        dataset=",".join(names),
        dataset_dir=dataset_dir,
        overwrite_cache=True,
        mask_history=p.get("mask_history", False),
    )
    model_args = ModelArguments(model_name_or_path=p["tokenizer"])
    out = str(Path(p["workdir"]) / "out")
    training_args = Seq2SeqTrainingArguments(output_dir=out, report_to=[])
    template = get_template_and_fix_tokenizer(tok, data_args)
    module = get_dataset(template, model_args, data_args, training_args, "sft", tok, None)
    return module["train_dataset"], data_args


def main() -> None:
    p = params()
    export, workdir = Path(p["export"]), Path(p["workdir"])
    tok = AutoTokenizer.from_pretrained(p["tokenizer"])
    registry_error = None
    samples = []
    with warnings_of("llamafactory", "datasets") as warned:
        own = export / "dataset_info.json"
        ds = None
        if own.exists():
            info = json.loads(own.read_text())
            # Validation entries, if any, are not the train split this bench counts.
            names = [k for k, v in info.items() if "validation" not in json.dumps(v)]
            registry = "the export's dataset_info.json"
            try:
                ds, data_args = load(tok, str(export), names, p)
            except Exception as exc:
                last = traceback.format_exception_only(type(exc), exc)[-1].strip()
                registry_error = f"the export's dataset_info.json fails to load: {last[:400]}"
        if ds is None:
            dataset_dir, names = own_entries(export, workdir / "registry")
            registry = "entries written by the bench"
            ds, data_args = load(tok, dataset_dir, names, p)
        for ex in ds:
            mask = [int(label != IGNORE_INDEX) for label in ex["labels"]]
            samples.append(sample(tok, list(ex["input_ids"]), mask, None))
    emit(
        {
            "max_tokens": data_args.cutoff_len,  # the length the trainer cuts a sample at
            "trainer": f"LLaMA-Factory {version('llamafactory')}",
            "libs": {k: version(k) for k in ("transformers", "datasets")},
            "path": f"sharegpt, template {p['template']}, registered by {registry}",
            "rejected": [registry_error] if registry_error else [],
            "defaults": {
                "cutoff_len": data_args.cutoff_len,
                "mask_history": data_args.mask_history,
                "train_on_prompt": data_args.train_on_prompt,
            },
            "samples": samples,
            "warnings": warned,
        }
    )


if __name__ == "__main__":
    main()
