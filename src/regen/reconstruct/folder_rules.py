"""What a model's folder and template say beyond the template's text: which tokens end the
model's turn (the job's `stop`, the family's, the tokenizer's eos and generation_config.json
beside it, checked against the template's own end of turn) and which variables the template
reads that nothing sets."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from regen.errors import ConfigError
from regen.reconstruct.rendered import ReconstructError

_RENDER_VARIABLES = frozenset(
    {
        # what apply_chat_template passes and the Jinja environment defines
        "messages", "tools", "documents", "add_generation_prompt", "raise_exception",
        "strftime_now", "namespace", "range", "dict", "lipsum", "cycler", "joiner",
    }
)  # fmt: skip


def generation_eos(tokenizer: str, tok: Any) -> list[str] | None:
    """The tokens of `eos_token_id` in the generation_config.json beside the tokenizer
    (None: there is none)."""
    folder = Path(tokenizer).expanduser()
    config = (folder if folder.is_dir() else folder.parent) / "generation_config.json"
    local = folder.is_dir() or folder.is_file()  # a hub id has no folder beside it
    if tokenizer == "sim" or not local or not config.is_file():
        return None
    try:
        ids = json.loads(config.read_text("utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        ids = None
    found: list[str] = []
    for i in ids if isinstance(ids, list) else [ids]:
        token = tok.convert_ids_to_tokens(i) if isinstance(i, int) else None
        if isinstance(token, str) and token not in found:
            found.append(token)
    return found


def template_end(render_finished: Callable[[list[dict[str, Any]]], str], tok: Any) -> list[str]:
    """The special tokens the template writes right after an answer's text, in a run
    (Phi-3.5's `<|end|>`, Command R7B's `<|END_RESPONSE|><|END_OF_TURN_TOKEN|>`)."""
    probe = "Regen probe answer."
    turns = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": probe}]
    try:
        after = render_finished(turns).rpartition(probe)[2]
    except ReconstructError:
        return []
    added = sorted((t for t in tok.get_added_vocab() if t), key=len, reverse=True)
    run: list[str] = []
    while token := next((t for t in added if after.startswith(t)), None):
        run.append(token)
        after = after[len(token) :]
    return run


def stops_disagree(end: list[str], eos: str | None, config: list[str] | None) -> str | None:
    """Why the folder does not say which token ends the model's turn (None: it does).
    One of the special tokens the template writes right after an answer (`end`) must be one
    the model stops at: generation_config.json's, else the eos_token."""
    if not end:  # it writes none: each answer's render says so (rendered.py)
        return None
    shown = "".join(end)
    if config is not None and not set(end) & set(config):
        return (
            f"the chat template ends a turn with {shown!r}, which generation_config.json's "
            f"eos_token_id {config} does not hold: set [reconstruct] stop to the token the "
            "model ends its turn with"
        )
    if config is None and eos not in end:
        return (
            f"the chat template ends a turn with {shown!r}, the tokenizer's eos_token is "
            f"{eos!r} and no generation_config.json says which the model stops at: put the "
            "model's generation_config.json beside its tokenizer, or set [reconstruct] stop"
        )
    return None


def template_inputs(template: str, where: str) -> set[str]:
    """The names a chat template reads and does not set itself (`where` names it in an
    error)."""
    import jinja2
    import jinja2.meta
    import jinja2.nodes

    try:
        env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", _generation_tag()])
        ast = env.parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    # Names the template sets itself anywhere (jinja2.meta also reports a name that is set in
    # one branch or loop and read in another) are not inputs.
    stored = {n.name for n in ast.find_all(jinja2.nodes.Name) if n.ctx != "load"}
    stored |= {a.name for m in ast.find_all(jinja2.nodes.Macro) for a in m.args}
    return set(jinja2.meta.find_undeclared_variables(ast)) - stored


def unset_variables(
    template: str, tokenizer: str, chat_template: str | None, tok: Any, known: Iterable[str]
) -> list[str]:
    """What the chat template reads that nothing here sets (`known`: what regen passes): a
    variable the model's own tokenizer code would pass, or a special token a bare
    tokenizer.json does not name. Each is one line saying what to set; a `bos_token` or
    `eos_token` the template reads and the tokenizer does not name is an error."""
    names = template_inputs(template, f"chat template of {tokenizer!r}")
    special = {k for k, v in tok.special_tokens_map.items() if v is not None}
    missing = sorted(names - (set(_RENDER_VARIABLES) | set(known) | special))
    where = chat_template or f"the chat template of {tokenizer!r}"
    for token in ("bos_token", "eos_token"):
        if token in missing:
            raise ConfigError(
                f"{where} reads {token}, which tokenizer {tokenizer!r} does not "
                "name: put the model's tokenizer_config.json beside its tokenizer.json, or "
                f'set {token} in [reconstruct] template_kwargs (e.g. {{"{token}": "..."}})'
            )
    return [
        f"{where} reads `{name}`, which regen does not set: if the model's own tokenizer "
        f"code sets it (trust_remote_code), set it in [reconstruct] template_kwargs, or "
        "the rebuilt prompts may differ from the server's"
        for name in missing
    ]


def _generation_tag() -> type:
    import jinja2.ext

    class GenerationTag(jinja2.ext.Extension):
        """transformers' `{% generation %}...{% endgeneration %}` (assistant masks): only
        its body matters for which variables a template reads."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return GenerationTag
