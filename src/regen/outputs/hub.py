"""An export folder as a Hugging Face dataset: a README.md card, rendered through
huggingface_hub's card classes, whose YAML names one config per dataset with its splits (so
`datasets.load_dataset(folder)` reads it with no arguments) and the licence, then what the
data is and how it was made; LLaMA-Factory's `dataset_info.json` beside a sharegpt export;
and the upload (`regen export --push-to-hub`)."""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from regen.errors import ConfigError, StateError
from regen.state.db import Store

CARD = "README.md"
LLAMA_FACTORY_INFO = "dataset_info.json"
NOT_DATA = frozenset({CARD, LLAMA_FACTORY_INFO, "manifest.json"})
"""Files an export writes beside its data: never carried into the next part, never listed."""


_WRITTEN = re.compile(r"^(?P<dataset>.+?)(?:\.part\d{4})?(?:-\d{5})?\.(?:jsonl|parquet)$")
"""How the writer names a data file: `<dataset>[.partNNNN][-NNNNN].<ext>` (the shard number
on Parquet files only)."""


def data_files(files: list[str]) -> dict[str, dict[str, list[str]]]:
    """The data files by dataset and split (`train/chat.part0001.jsonl` is chat's), read back
    from the names the writer gives them, for an export whose manifest does not record them:
    only the writer's own suffixes are taken off, so `code-python-00000.parquet` is
    `code-python`'s and `v1.5.jsonl` is `v1.5`'s."""
    out: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for f in files:
        split, _, name = f.partition("/")
        found = _WRITTEN.match(name) if name and "/" not in name else None
        if found is not None:
            out[found["dataset"]].setdefault(split, []).append(f)
    return out


def public_path(value: Any) -> Any:
    """A setting as an uploaded file may carry it: a local path by its name only (the rest is
    the user's machine), a hub id or a word as it is."""
    if not isinstance(value, str) or not value:
        return value
    looks_local = value.startswith(("/", "~", "./", "../")) or "\\" in value
    return Path(value).name if looks_local or Path(value).exists() else value


LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]{0,63}")
"""A Hub licence id as the Hub lists them (`apache-2.0`, `cc-by-4.0`, `other`, `unknown`)."""


def card_data(
    datasets: list[str], written: dict[str, dict[str, list[str]]], title: str, license: str
) -> dict[str, Any]:
    """The card's metadata, as huggingface_hub's DatasetCardData holds it: one config per
    dataset the export wrote (the first the default), each split with its files, then the
    licence, a name and the tags the Hub lists the dataset by."""
    configs: list[dict[str, Any]] = []
    for name in datasets:
        splits = written.get(name)
        if not splits:
            continue
        files = [
            {"split": split, "path": sorted(splits[split])}
            for split in ("train", "validation")
            if split in splits
        ]
        configs.append({"config_name": name, "data_files": files})
    if configs:  # `default` beside the name, where a reader of the YAML looks for it
        configs[0] = {"config_name": configs[0]["config_name"], "default": True} | configs[0]
    return {
        "license": license,
        "pretty_name": f"Answers regenerated with {title}",
        "task_categories": ["text-generation"],
        "tags": ["regen", "synthetic"],
        "configs": configs,
    }


def rendered_card(data: dict[str, Any], body: str) -> str:
    """README.md from its metadata and text, through huggingface_hub's card classes: the
    YAML header is written and parsed back by the code the Hub's own clients use."""
    from huggingface_hub import DatasetCard, DatasetCardData

    header = DatasetCardData(**data).to_yaml()
    # Parsing it back is the check: a header the library cannot read raises here, not on the Hub.
    card = DatasetCard(f"---\n{header}\n---\n\n{body}")
    if card.data.to_dict() != data:  # type: ignore[no-untyped-call]
        raise StateError(f"the dataset card's header does not read back as written: {header}")
    return str(card)


def _table(head: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def dataset_card(store: Store, manifest: dict[str, Any], datasets: list[str], policy: str) -> str:
    """README.md for an export: the YAML header, then what the data is (model, endpoints,
    providers, quantization filters, the settings sent), how its token ids were made, the
    audit, counts and cost, which text carries loss, and the provenance fields."""
    orphans = bool(manifest["filters"].get("keep_orphans"))  # counted as the export wrote them
    models = store.answers.counted_by("model", datasets, orphans)
    title = models[0][0] if models and models[0][0] else "a target model"
    license = manifest["filters"].get("license") or "unknown"
    lines = [
        f"# Answers regenerated with {title}",
        "",
        f"Written by regen {manifest['regen_version']} (`regen export --format "
        f"{manifest['format']}`). Every answer is the target model's own; prompts come from "
        "the source datasets below.",
        "",
    ]
    lines += _card_how_made(store, datasets, orphans, models)
    lines += _card_ids_and_audit(store, manifest)
    lines += _card_contents(store, manifest)
    lines += _card_loss_provenance_licence(manifest, policy, license)
    written = manifest.get("data_files")
    if written is None:
        written = data_files(manifest["files"])
    return rendered_card(card_data(datasets, written, title, license), "\n".join(lines))


def _card_how_made(
    store: Store, datasets: list[str], orphans: bool, models: list[tuple[Any, int]]
) -> list[str]:
    """The card's "How it was made": who answered (model, endpoint, provider, with counts),
    the provider routing the job asked for, and the settings the requests carried."""
    lines = ["## How it was made", ""]
    lines += _table(
        ("what", "values (answers)"),
        [
            (what, ", ".join(f"{v if v is not None else 'unknown'} ({n})" for v, n in counts))
            for what, counts in (
                ("model", models),
                ("endpoint (the job's)", store.answers.counted_by("endpoint", datasets, orphans)),
                ("provider", store.answers.counted_by("provider", datasets, orphans)),
            )
        ],
    )
    fields = json.loads(store.get_meta("fingerprint_fields") or "{}")
    routing = [e.get("provider") for e in fields.get("endpoints", []) if e.get("provider")]
    lines += [
        "",
        "Provider routing the job asked for (quantizations, order, ignore): "
        + (", ".join(f"`{json.dumps(r, sort_keys=True)}`" for r in routing) or "none")
        + ".",
        "",
        "Settings each request carried besides its messages and tools (answers):",
        "",
    ]
    for settings, n in store.answers.counted_by("settings", datasets, orphans)[:8]:
        lines.append(f"- `{settings or 'not recorded (answered before regen stored it)'}` ({n})")
    return lines


def _card_ids_and_audit(store: Store, manifest: dict[str, Any]) -> list[str]:
    """The card's lines on how the token ids were made and what the run's live audit found."""
    reconstruct = manifest.get("reconstruct")
    ids = (
        f"token ids from the server where it returned them, else rebuilt with the "
        f"`{reconstruct['family']}` family of the model's own chat template "
        f"(tokenizer `{reconstruct.get('tokenizer')}`); each row's `token_ids` says which"
        if reconstruct
        else "no token ids were rebuilt for this export"
    )
    audit = _audit_line(store.get_meta("live_audit"))
    return [
        "",
        f"Token ids: {ids}.",
        "",
        "Audit: "
        + (audit or "not in this card: run `regen audit OUT` on the job's output folder."),
        "",
    ]


_CONTENTS_HEAD = (
    "config",
    "source",
    "train",
    "validation",
    "prompt tokens",
    "completion tokens",
    "cost $",
    "left out",
)


def _card_contents(store: Store, manifest: dict[str, Any]) -> list[str]:
    """The card's "Contents": per dataset its source, samples by split, tokens, cost and what
    this part left out; over every part in the folder where the manifest knows them."""
    lines = ["## Contents", ""]
    totals = manifest.get("totals") or manifest["datasets"]
    if manifest.get("part") and manifest.get("totals"):
        lines += [
            f"Counts over all {manifest['part'] + 1} parts in this folder (`--since-last`); "
            "what was left out, this part's.",
            "",
        ]
    elif manifest.get("part"):
        lines += ["Counts of this part only (the earlier parts' were not recorded).", ""]
    rows = []
    for name, d in totals.items():
        part = manifest["datasets"].get(name, {})
        dropped = ", ".join(f"{k} {v}" for k, v in part.get("dropped", {}).items()) or "-"
        rows.append(
            (
                name,
                public_source(store.sources.source(name)),
                d["samples"]["train"],
                d["samples"]["validation"],
                d["prompt_tokens"],
                d["completion_tokens"],
                f"{d['cost_usd']:.4f}",
                dropped,
            )
        )
    return lines + _table(_CONTENTS_HEAD, rows)


_PROVENANCE = (
    "Each sample's `provenance` (columns of their own in Parquet) joins it to its source "
    "row: `source_file`, `source_row` (from 0), `source_id` (the row's own id: "
    "`custom_id`, `id`, ...), `mode`, `turn_index` and `sample`, `history` (who wrote "
    "the assistant turns before it: `none`, `target`, `source`), who answered (`model`, "
    "`provider`, `endpoint`, `run_id`, `generation_id`), `settings` (JSON of what the request "
    "carried), the bill (`prompt_tokens`, `completion_tokens`, `reasoning_tokens`, "
    "`cost_usd`, `usage_source`), `finish_reason`, and `token_ids` (`exact`, "
    "`reconstructed`, `none`)."
)


def _card_loss_provenance_licence(manifest: dict[str, Any], policy: str, license: str) -> list[str]:
    """The card's closing sections: which text carries loss (the export's notes and the
    history policy), the provenance fields, and the licence."""
    return [
        "",
        "## Which text carries loss",
        "",
        *(f"{note}." for note in manifest.get("notes", [])),
        *([""] if manifest.get("notes") else []),
        "Only text the target wrote. A sample whose history holds the dataset's own assistant "
        f"turns is {policy}.",
        "",
        "## Provenance",
        "",
        _PROVENANCE,
        "",
        "## Licence",
        "",
        f"`{license}`"
        + (
            ": regen does not know it. The prompts carry their source datasets' licences, the "
            "answers the target model's terms: set it with `regen export --license ID`."
            if license == "unknown"
            else " (given with `regen export --license`)."
        ),
        "",
    ]


def public_source(path: str) -> str:
    """A source as a published card or export names it: a hub id as it is, a local file or
    folder by its name only (the rest of the path is the user's machine)."""
    if "://" in path or "/" not in path:
        return path
    return Path(path).name


def _audit_line(recorded: str | None) -> str | None:
    """The run's live audit tally (`[reconstruct] live_audit`) in words."""
    try:
        tally = json.loads(recorded) if recorded else None
        if not isinstance(tally, dict):
            return None
        return (
            f"the run's live audit rebuilt {tally['checked']} answers with the "
            f"`{tally['family']}` family: {tally['failed']} failed its checks; rebuilt minus "
            f"billed completion tokens: mean {tally['mean_abs_diff']}, largest "
            f"{tally['max_abs_diff']}."
        )
    except (ValueError, KeyError, TypeError):
        return None


def llama_factory_info(
    datasets: list[str], files: list[str], written: dict[str, dict[str, list[str]]] | None = None
) -> dict[str, Any]:
    """dataset_info.json entries for a sharegpt export: one per dataset and split file, as
    LLaMA-Factory registers a local sharegpt file."""
    info: dict[str, Any] = {}
    for name, splits in (written if written is not None else data_files(files)).items():
        if name not in datasets:
            continue
        for split, paths in splits.items():
            for k, path in enumerate(sorted(paths)):
                key = name if split == "train" else f"{name}_{split}"
                info[key if k == 0 else f"{key}_{k}"] = {
                    "file_name": path,
                    "formatting": "sharegpt",
                    "columns": {"messages": "conversations", "system": "system", "tools": "tools"},
                }
    return info


def push_to_hub(folder: Path, repo: str, *, private: bool = False) -> str:
    """Upload an export folder as a dataset repository (created if missing) with
    huggingface_hub; the token comes from HF_TOKEN (or the user's huggingface-cli login), the
    Hub's address from HF_ENDPOINT (default huggingface.co). Returns the commit's URL."""
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError as exc:  # pragma: no cover - a dependency of transformers
        raise ConfigError(f"--push-to-hub needs huggingface_hub: {exc}") from exc
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ConfigError(f"--push-to-hub takes OWNER/NAME, not {repo!r}")
    # Read at the call (huggingface_hub reads its environment once, at import).
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=os.environ.get("HF_TOKEN"))
    try:
        api.create_repo(repo, repo_type="dataset", exist_ok=True, private=private)
        info = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo,
            repo_type="dataset",
            commit_message=f"regen export ({folder.name})",
        )
    except Exception as exc:  # HTTP errors, and the transport's own (refused, reset, DNS)
        status = ""
        if isinstance(exc, HfHubHTTPError) and exc.response is not None:
            status = f" (HTTP {exc.response.status_code})"
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise StateError(
            f"cannot upload {folder} to the Hub dataset {repo}{status}: {first}; the export "
            "folder is complete: upload it again with the same command once the problem is "
            "fixed (a token with write access in HF_TOKEN)"
        ) from exc
    return str(getattr(info, "commit_url", info))
