"""The vocabulary of the whole program: plain frozen dataclasses, no imports from regen."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call made by an assistant turn; `arguments` is kept verbatim as produced."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_openai(cls, d: dict[str, Any]) -> ToolCall:
        fn = d.get("function")
        if not isinstance(fn, dict):
            fn = {}
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        return cls(id=str(d.get("id") or ""), name=str(fn.get("name") or ""), arguments=args)


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of a conversation in OpenAI roles."""

    role: str
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI-compatible request sends it."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [tc.to_openai() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        return d

    def to_dict(self) -> dict[str, Any]:
        """Lossless form for storage."""
        d = self.to_openai()
        if self.reasoning is not None:
            d["reasoning"] = self.reasoning
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        return cls(
            role=d["role"],
            content=d.get("content") or "",
            reasoning=d.get("reasoning"),
            tool_calls=tuple(ToolCall.from_openai(tc) for tc in d.get("tool_calls") or ()),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
        )


@dataclass(frozen=True, slots=True)
class Conversation:
    """A normalized source row: messages, the tools it declares, and where it came from."""

    dataset: str
    row_index: int
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    source_id: str | None = None
    """The row's own id in its source (a batch file's `custom_id`, a ShareGPT `id`, ...), to
    join an answer back to its row; not part of the conversation's id."""

    @property
    def id(self) -> str:
        """Stable id: a hash of the dataset name and the normalized row content."""
        return conversation_id(self.dataset, self.content_json())

    def content_json(self) -> str:
        return canonical_json(
            {"messages": [m.to_dict() for m in self.messages], "tools": list(self.tools)}
        )

    def to_dict(self) -> dict[str, Any]:
        return {"messages": [m.to_dict() for m in self.messages], "tools": list(self.tools)}

    def estimate_prompt_tokens(self, turn_index: int) -> int:
        """A tokenizer-free estimate of a turn's prompt tokens (about 4 characters a token),
        good enough to choose a lane."""
        return estimate_prompt_tokens(self.to_dict(), turn_index)

    @classmethod
    def from_dict(cls, dataset: str, row_index: int, d: dict[str, Any]) -> Conversation:
        return cls(
            dataset=dataset,
            row_index=row_index,
            messages=tuple(Message.from_dict(m) for m in d["messages"]),
            tools=tuple(d.get("tools") or ()),
        )


@dataclass(frozen=True, slots=True)
class Request:
    """One assistant turn to regenerate: the history before it, and the turn's index."""

    item_id: str
    dataset: str
    conversation_id: str
    turn_index: int
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    sample: int = 0
    """Which of the prompt's samples this is (0 for the first; [generation] samples)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts and cost as the provider billed them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float | None = None
    source: str = "server"
    """Where the counts come from: `server` (its usage), `ids` (counted from the token ids it
    returned, when it sent no usage), `estimate` (neither: estimated from the text) or `worst`
    (what the provider said was not believed: its worst case, `engine/gate.py`)."""
    junk: tuple[str, ...] = ()
    """The fields the provider sent that were no amounts (negative, not finite, text), each
    as `name = value`: the gate does not believe such usage."""
    cached_tokens: int = 0
    """Of the prompt tokens, those read from the provider's prompt cache (billed at its cache
    read price, `usage.prompt_tokens_details.cached_tokens`)."""
    cache_write_tokens: int = 0
    """Of the prompt tokens, those written to its cache where writes are billed apart (at its
    cache write price, `cache_write_tokens`)."""


@dataclass(frozen=True, slots=True)
class Result:
    """A successful response, parsed into the turn it regenerates."""

    item_id: str
    message: Message
    finish_reason: str | None
    usage: Usage
    provider: str | None = None
    model: str | None = None
    generation_id: str | None = None
    latency_s: float = 0.0
    attempts: int = 1
    endpoint: str | None = None
    """The name of the job's endpoint that answered (set by the scheduler)."""
    prompt_token_ids: tuple[int, ...] | None = None
    completion_token_ids: tuple[int, ...] | None = None
    """The exact ids, from servers asked for them (vLLM, SGLang `return_token_ids`)."""
    settings: str | None = None
    """What the request carried besides its messages and tools (model, max_tokens, sampling,
    reasoning, routing), as canonical JSON (set by the scheduler): the answer's provenance."""


def estimate_prompt_tokens(conversation: dict[str, Any], turn_index: int) -> int:
    """The estimate of Conversation.estimate_prompt_tokens, from the stored form."""
    chars = len(json.dumps(conversation.get("tools") or [])) if conversation.get("tools") else 0
    messages = conversation.get("messages") or []
    for m in messages[:turn_index]:
        chars += len(m.get("content") or "") + len(m.get("reasoning") or "")
        for tc in m.get("tool_calls") or []:
            chars += len(str((tc.get("function") or {}).get("arguments") or "")) + 16
    return chars // 4 + 4 * min(turn_index, len(messages)) + 2


def prompt_tokens_bound(request: Request) -> int:
    """An upper bound of a request's prompt tokens, without a tokenizer: its UTF-8 bytes (a
    byte-level tokenizer never makes more tokens than bytes), the tools' JSON, and room for
    the chat template's markers and default system prompt."""
    n = 256 + len(json.dumps(request.tools).encode()) if request.tools else 256
    for m in request.messages:
        n += 16 + len(m.content.encode()) + len((m.reasoning or "").encode())
        for tc in m.tool_calls:
            n += 32 + len(tc.name.encode()) + len(tc.arguments.encode())
    return n


def conversation_id(dataset: str, content_json: str) -> str:
    """The id of a conversation from its dataset and canonical JSON (Conversation.id)."""
    return stable_hash(dataset, content_json)


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the form that ids and fingerprints hash."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def seeded_unit(*parts: object) -> float:
    """A uniform number in [0, 1) drawn from the parts (joined by ":"): the same parts always
    draw the same number, so seeded samples and splits are reproducible."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def stable_hash(*parts: str | int) -> str:
    """A short, stable hex id of the parts (blake2b, 16 bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        b = str(p).encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class BadRow:
    """A source row that could not become a conversation: counted and reported, never fatal."""

    dataset: str
    row_index: int
    reason: str


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP attempt for an item: what happened and how long it took."""

    number: int
    started_at: float
    latency_s: float
    status: int | None
    failure_class: str | None = None
    message: str | None = None
    provider: str | None = None
    generation_id: str | None = None
    lane: str | None = None
    endpoint: str | None = None
    """The job's endpoint (of its pool) the attempt went to."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one item ended in this run: a result; a failure with its class; a truncated result
    to re-send on a lane with more room (`escalate_to`); or `abandoned` at a stop, to be sent
    again by the next run."""

    item_id: str
    dataset: str
    attempts: tuple[Attempt, ...]
    result: Result | None = None
    failure_class: str | None = None
    failure_message: str | None = None
    escalate_to: str | None = None
    abandoned: bool = False

    @property
    def ok(self) -> bool:
        return self.result is not None


@dataclass(frozen=True, slots=True)
class Charge:
    """A charge learnt after the fact, with its kind in the ledger: `failed_attempt` (a stream
    cut short that the provider billed all the same, as its generation record says), `lost`
    (an answer of a killed run, billed after the client was gone: its text is lost), or
    `unverified` (a request whose bill never showed, counted at what the account's spend
    beyond the ledger allowed, at most its worst case)."""

    item_id: str
    dataset: str
    usage: Usage
    generation_id: str | None
    endpoint: str | None = None
    provider: str | None = None
    lane: str | None = None
    kind: str = "failed_attempt"
