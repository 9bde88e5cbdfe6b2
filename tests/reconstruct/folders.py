"""Model folders as a user downloads them, for families regen has no rules for: the model's
published chat template and special tokens in tokenizer_config.json, its
generation_config.json (or none), and a small byte-level tokenizer.json standing in for the
model's vocabulary (none of these is on PyPI: text is compared, ids only for consistency)."""

from __future__ import annotations

import json
from pathlib import Path


def model_folder(
    out: Path,
    template: str,
    specials: list[str],
    eos: str,
    bos: str | None = None,
    generation_eos: list[str] | None = None,
) -> Path:
    """A folder with tokenizer.json (bytes, then `specials` as added special tokens),
    tokenizer_config.json (`template`, `eos`, `bos`) and, when `generation_eos` is given,
    generation_config.json naming those tokens' ids as `eos_token_id`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    tok.save(str(out / "tokenizer.json"))
    config = {"chat_template": template, "eos_token": eos, "bos_token": bos}
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    if generation_eos is not None:
        ids = [tok.token_to_id(t) for t in generation_eos]
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    return out
