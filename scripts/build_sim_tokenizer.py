"""Build the simulator's small tokenizer (byte-level BPE with the special tokens of the model
families the simulator speaks: Kimi, Qwen, DeepSeek, GLM, MiniMax and gpt-oss's harmony).

Run: .venv/bin/python scripts/build_sim_tokenizer.py
Writes src/regen/sim/tokenizer/{tokenizer.json,tokenizer_config.json}. Deterministic: the same
tokenizers version gives the same file. Every simulated word, with and without a leading space,
is a single token, so simulated completions have exact token counts.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from regen.sim.words import WORDS

OUT = Path(__file__).resolve().parent.parent / "src" / "regen" / "sim" / "tokenizer"
VOCAB_SIZE = 4096

KIMI_SPECIALS = [
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
    "[UNK]",
    "[PAD]",
]
QWEN_SPECIALS = ["<|im_start|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]
SPECIALS = KIMI_SPECIALS + QWEN_SPECIALS
# Added after training, so the ids of the tokens above stay what they were.
EXTRA_SPECIALS = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
    # MiniMax-M2
    "]~!b[",
    "]~b]",
    "[e~[",
    "<minimax:tool_call>",
    "</minimax:tool_call>",
    # Kimi-K3
    "<|open|>",
    "<|close|>",
    "<|sep|>",
    "<|end_of_msg|>",
    # Llama 4
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eot|>",
    "<|eom|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|image|>",
]


def corpus(rng: random.Random) -> list[str]:
    lines = []
    for _ in range(20000):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20))))
    for w in WORDS:  # line-initial forms too, as the first word after a special token
        lines.extend([w] * 50)
    for _ in range(3000):
        key, val = rng.choice(WORDS), rng.choice(WORDS)
        lines.append(json.dumps({key: val, "n": rng.randint(0, 999)}))
        lines.append(f"functions.{key}_{val}:{rng.randint(0, 9)}")
    lines.extend(["system", "user", "assistant", "tool", "tool_declare", "## Return of "] * 200)
    return lines


def main() -> None:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(random.Random(0)), trainer=trainer)
    tok.add_special_tokens(EXTRA_SPECIALS)
    for w in WORDS:
        for form in (w, " " + w):
            ids = tok.encode(form).ids
            assert len(ids) == 1, (form, ids)
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]",
        "eos_token": "<|im_end|>",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "model_max_length": 262144,
        "clean_up_tokenization_spaces": False,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {OUT} ({tok.get_vocab_size()} tokens)")


if __name__ == "__main__":
    main()
