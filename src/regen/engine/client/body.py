"""Request bodies per dialect."""

from __future__ import annotations

from typing import Any

from regen.config import DIALECTS, DialectName, EndpointConfig, GenerationConfig
from regen.conversation import Message, Request, canonical_json, seeded_unit, stable_hash


def history_message(m: Message, dialect: DialectName) -> dict[str, Any]:
    """A history message as the dialect wants it sent back (reasoning under its own name)."""
    d = m.to_openai()
    if m.role == "assistant" and m.reasoning:
        d[DIALECTS[dialect].reasoning_field] = m.reasoning
    return d


def sample_settings(gen: GenerationConfig, req: Request, samples: int = 1) -> dict[str, Any]:
    """What one sample of a prompt is sent: temperature, top_p, reasoning effort (a list is
    spread over the prompt's samples: `cycle` gives sample k the k-th value; `draw`, and any
    list when a prompt has one sample, picks one by a seeded draw) and the seed (the job's
    seed as it is for a prompt with one sample; for several, one per sample derived from the
    job's seed, the prompt and the sample index, so each sample differs and a resend is the
    same). None: not sent."""
    base = (gen.seed or 0, req.conversation_id, req.turn_index)

    def pick(name: str, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        if gen.mix == "cycle" and samples > 1:
            return value[req.sample % len(value)]
        return value[int(seeded_unit(*base, req.sample, name) * len(value))]

    out: dict[str, Any] = {
        "temperature": pick("temperature", gen.temperature),
        "top_p": pick("top_p", gen.top_p),
        "seed": gen.seed if samples == 1 else int(seeded_unit(*base, req.sample, "seed") * 2**31),
    }
    if gen.reasoning is not None:
        reasoning = dict(gen.reasoning)
        if "effort" in reasoning:
            reasoning["effort"] = pick("effort", reasoning["effort"])
        out["reasoning"] = reasoning
    return out


def chat_body(
    req: Request,
    gen: GenerationConfig,
    endpoint: EndpointConfig,
    max_tokens: int | None = None,
    *,
    stream: bool = False,
    samples: int = 1,
) -> dict[str, Any]:
    """The JSON body of one chat completion request. `max_tokens` is always explicit: the lane's
    if given, else [generation].max_tokens. A stream asks for its usage where the server sends
    it only when asked (vLLM, SGLang, OpenAI: `stream_options.include_usage`); OpenRouter
    always sends it."""
    kind = endpoint.kind
    body: dict[str, Any] = {
        "model": gen.model,
        "messages": [history_message(m, endpoint.dialect) for m in req.messages],
        "max_tokens": max_tokens or gen.max_tokens,
    }
    if req.tools:
        body["tools"] = list(req.tools)
    chosen = sample_settings(gen, req, samples)
    for key in ("temperature", "top_p", "seed"):
        if chosen[key] is not None:
            body[key] = chosen[key]
    reasoning = chosen.get("reasoning")
    if reasoning is not None:
        if kind.effort_only:
            # No `reasoning` object (vLLM would ignore it): its field is the effort.
            effort = reasoning.get("effort")
            if isinstance(effort, str):
                body["reasoning_effort"] = effort
        else:
            body["reasoning"] = reasoning
    if kind.account and endpoint.provider is not None:
        body["provider"] = endpoint.provider
    if sends_session_id(endpoint):
        body["session_id"] = session_id(gen, req)
    if endpoint.asks_token_ids(stream):
        body["return_token_ids"] = True
        if kind.prompt_ids_field is not None:
            body[kind.prompt_ids_field] = True
    if stream:
        body["stream"] = True
        if kind.stream_usage_on_request:
            body["stream_options"] = {"include_usage": True}
    body.update(endpoint.extra_body)
    return body


def sends_session_id(endpoint: EndpointConfig) -> bool:
    """Whether requests carry a session id: on OpenRouter unless turned off, and not with
    `provider.order` (sticky routing does not apply to a request with an order)."""
    order = (endpoint.provider or {}).get("order")
    return endpoint.kind.account and endpoint.session_id and not order


def session_id(gen: GenerationConfig, req: Request) -> str:
    """The stable session id of a request's conversation: a hash of the model and the
    conversation's id (its dataset and content), the same for its turns and samples and in
    every run, holding no text of it, and within OpenRouter's 256 characters."""
    return "regen-" + stable_hash(gen.model, req.conversation_id)


SAMPLES_KEY = "_regen_samples"
"""A body field for the sample batcher (client/batch.py), never sent: how many samples the
item's prompt has."""
NOT_SETTINGS = frozenset(
    {
        "messages",
        "tools",
        "stream",
        "stream_options",
        "return_token_ids",
        "return_prompt_token_ids",
        "session_id",
        SAMPLES_KEY,
    }
)
"""Body fields that are the prompt or the transport (a session id only routes, and differs
per conversation), not how the answer was sampled."""


def sent_settings(body: dict[str, Any]) -> str:
    """The settings a request body carried (model, max_tokens, sampling, reasoning, routing,
    extra_body), as canonical JSON: stored with its answer and exported as its provenance."""
    return canonical_json({k: v for k, v in body.items() if k not in NOT_SETTINGS})
