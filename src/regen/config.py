"""The job schema: pydantic models, defaults stated once, errors that name the file and field."""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from regen.conversation import canonical_json, stable_hash
from regen.errors import ConfigError, describe_validation_error, field_path
from regen.safe import NAME_MAX, NAME_PATTERN

DialectName = Literal["openrouter", "openai", "vllm", "sglang"]


@dataclass(frozen=True)
class Dialect:
    """What a kind of server does, so that code asks this record rather than the kind's name."""

    name: DialectName
    self_hosted: bool
    """Runs on the job's own GPUs: a key may be absent, it may still be loading (its health
    route says when it is up), and a request whose client is gone is aborted, never billed."""
    account: bool
    """Keeps an account per key (OpenRouter): usage and credit (/key, /credits), bills by
    generation id (/generation), prices (/models), management keys and `provider` routing;
    it bills by the token, never by the hour."""
    token_ids: Literal["never", "always", "unstreamed"]
    """Whether it returns the exact token ids when asked: `unstreamed` only off streams."""
    prompt_ids_field: str | None
    """The field that asks for the prompt's ids besides `return_token_ids`, if it has one."""
    reasoning_field: str
    """The name under which earlier turns' reasoning is sent back."""
    effort_only: bool
    """No `reasoning` object: only its effort is sent, as `reasoning_effort`."""
    stream_usage_on_request: bool
    """A stream carries usage only when asked (`stream_options.include_usage`)."""
    samples_as_n: bool
    """A prompt's samples can go as one request with `n` (one prefill for all)."""
    base_path: str
    """The API's path under the server's root (the health route is beside it, not under it)."""
    health_path: str | None
    """The route, at the server's root, that answers once it can serve (None: not asked)."""

    def asks_token_ids(self, stream: bool) -> bool:
        """Whether a request on a lane that does (or does not) stream asks for ids by default."""
        return self.token_ids == "always" or (self.token_ids == "unstreamed" and not stream)

    def health_url(self, base_url: str) -> str | None:
        """The health route of a server whose API is at `base_url` (None: not asked)."""
        if self.health_path is None:
            return None
        return base_url.rstrip("/").removesuffix(self.base_path) + self.health_path


def _self_hosted(name: DialectName, **kw: Any) -> Dialect:
    return Dialect(
        name,
        self_hosted=True,
        account=False,
        samples_as_n=True,
        stream_usage_on_request=True,
        base_path="/v1",
        health_path="/health",
        **kw,
    )


DIALECTS: dict[DialectName, Dialect] = {
    "openrouter": Dialect(
        "openrouter",
        self_hosted=False,
        account=True,
        token_ids="never",
        prompt_ids_field=None,
        reasoning_field="reasoning",
        effort_only=False,
        stream_usage_on_request=False,
        samples_as_n=False,
        base_path="/api/v1",
        health_path=None,
    ),
    "openai": Dialect(
        "openai",
        self_hosted=False,
        account=False,
        token_ids="never",
        prompt_ids_field=None,
        reasoning_field="reasoning",
        effort_only=False,
        stream_usage_on_request=True,
        samples_as_n=False,
        base_path="/v1",
        health_path=None,
    ),
    "vllm": _self_hosted(
        "vllm",
        token_ids="always",
        prompt_ids_field=None,
        reasoning_field="reasoning",
        effort_only=True,
    ),
    "sglang": _self_hosted(
        "sglang",
        token_ids="unstreamed",
        prompt_ids_field="return_prompt_token_ids",
        reasoning_field="reasoning_content",
        effort_only=False,
    ),
}
"""Every dialect an endpoint may speak, and what each supports."""
SourceFormat = Literal[
    "auto",
    "openai",
    "openai_batch",
    "sharegpt",
    "alpaca",
    "glaive",
    "opencodeinstruct",
    "magicoder",
    "mixture_of_thoughts",
    "openthoughts",
    "ultrachat",
    "swe_agent",
    "custom",
]
ReaderKind = Literal["auto", "jsonl", "json", "parquet", "csv", "arrow", "folder", "hf"]
RegenMode = Literal["last_turn", "each_turn", "sequential"]
SystemPolicy = Literal["keep", "drop", "replace", "fill"]
FilterValue = str | int | float | bool | None


class _Model(BaseModel):
    # inf and nan are refused in every float field: a cap of inf is no cap, a timeout of inf
    # waits forever (load_job says so first, in one line per field, for free-form tables too).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class JobInfo(_Model):
    """`[job]`: the job's name and where its state and exports live."""

    name: str = "regen-job"
    output_dir: str = "out"
    """Relative paths are taken from the job file's folder."""


class EndpointConfig(_Model):
    """`[endpoint]` (or each of `[[endpoints]]`): where requests go. The API key itself is only
    ever read from the environment."""

    name: str = Field(default="default", pattern=NAME_PATTERN, max_length=NAME_MAX)
    weight: float = Field(default=1.0, gt=0)
    """Share of a lane's requests, among the lane's healthy endpoints."""
    base_url: str = "https://openrouter.ai/api/v1"
    dialect: DialectName = "openrouter"
    api_key_env: str = "OPENROUTER_API_KEY"
    management_key_env: str | None = None
    """OpenRouter only: a variable holding a management key. Each run then makes a key of its
    own whose credit limit is what [budget].max_cost_usd still allows (OpenRouter enforces
    it), runs on it, and disables it at its end; the job's keys are deleted when it is done.
    api_key_env is not needed then."""
    headers: dict[str, str] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    provider: dict[str, Any] | None = None
    """OpenRouter's `provider` routing object, sent as written."""
    session_id: bool = True
    """OpenRouter: each request carries a `session_id` of its conversation (the same for its
    turns and samples), so that OpenRouter keeps the conversation on the provider that holds
    its prompt cache. Not sent when `provider.order` is set: OpenRouter's sticky routing does
    not apply then (the order decides), nor to vLLM or SGLang."""
    prompt_usd_per_mtok: float | None = Field(default=None, ge=0)
    completion_usd_per_mtok: float | None = Field(default=None, ge=0)
    """Prices, for answers without `usage.cost` and for dollar caps. OpenRouter's are read from
    its model endpoint list when not given (the highest of the model's endpoints)."""
    cache_read_usd_per_mtok: float | None = Field(default=None, ge=0)
    cache_write_usd_per_mtok: float | None = Field(default=None, ge=0)
    """A prompt token read from the provider's prompt cache, and one written to it where
    writes are billed apart (both default to the prompt price). Costs computed from prices
    use them; worst cases never assume a read's discount, and count a write dearer than the
    prompt at its own price."""
    usd_per_gpu_hour: float | None = Field(default=None, gt=0)
    gpus: int = Field(default=1, ge=1)
    """A self-hosted server priced by its time instead: `gpus` x `usd_per_gpu_hour` for each
    hour it is busy with the job, shared among its answers (each is charged the busy time
    since the server's previous answer)."""
    token_ids: bool | None = None
    """Ask a self-hosted server for the exact token ids of prompt and answer (vLLM
    `return_token_ids`; SGLang `return_token_ids` and `return_prompt_token_ids`, which it
    refuses on streams). They are stored with the answer and marked exact. By default on for
    vLLM and SGLang (SGLang: on lanes that do not stream), off elsewhere."""

    def asks_token_ids(self, stream: bool) -> bool:
        """Whether a request on a lane that does (or does not) stream asks for the ids."""
        if self.token_ids is not None:
            return self.token_ids
        return self.kind.asks_token_ids(stream)

    @property
    def kind(self) -> Dialect:
        """What this endpoint's server supports (its dialect's record)."""
        return DIALECTS[self.dialect]

    follow_redirects_to: list[str] = Field(default_factory=list)
    """Hosts (`host` or `host:port`) that a redirect may lead this endpoint's requests to,
    the key and headers with them. A redirect within base_url's own scheme, host and port is
    followed; one anywhere else stops the run with one line, and nothing is sent there."""

    samples_in_one_request: bool = True
    """vLLM and SGLang: a prompt's samples go as one request with `n` (one prefill of the
    prompt), each choice stored, billed and exported as its own sample."""

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        parts = urlsplit(v)
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "must not hold a user name or password (user:pass@): give the key in the "
                "variable api_key_env names, or other credentials in headers"
            )
        if not parts.hostname:
            raise ValueError(f"has no host name: {v}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"has a port that is not a number from 1 to 65535: {v}") from None
        if port == 0:
            raise ValueError(f"has port 0, which no server listens on: {v}")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _one_kind_of_price(self) -> EndpointConfig:
        if self.usd_per_gpu_hour is not None:
            if self.kind.account:
                raise ValueError("usd_per_gpu_hour: OpenRouter bills per token, not by the hour")
            if self.prompt_usd_per_mtok is not None or self.completion_usd_per_mtok is not None:
                raise ValueError(
                    "give either usd_per_gpu_hour or per-token prices (*_usd_per_mtok), not both"
                )
        return self

    @model_validator(mode="after")
    def _cache_prices_beside_prompt_prices(self) -> EndpointConfig:
        read, write = self.cache_read_usd_per_mtok, self.cache_write_usd_per_mtok
        if read is None and write is None:
            return self
        if self.prompt_usd_per_mtok is None or self.completion_usd_per_mtok is None:
            raise ValueError(
                "cache_read_usd_per_mtok / cache_write_usd_per_mtok: give prompt_usd_per_mtok "
                "and completion_usd_per_mtok too (cache prices are beside them)"
            )
        if read is not None and read > self.prompt_usd_per_mtok:
            raise ValueError(
                f"cache_read_usd_per_mtok = {read:g} is above prompt_usd_per_mtok = "
                f"{self.prompt_usd_per_mtok:g}: a cache read is a discount on the prompt price"
            )
        return self

    @model_validator(mode="after")
    def _management_keys_are_openrouters(self) -> EndpointConfig:
        if self.management_key_env is not None and not self.kind.account:
            raise ValueError(
                f"management_key_env: only OpenRouter makes keys with a management key, not "
                f"{self.dialect}"
            )
        return self

    @model_validator(mode="after")
    def _token_ids_from_servers_that_give_them(self) -> EndpointConfig:
        if self.token_ids and self.kind.token_ids == "never":
            givers = " and ".join(d.name for d in DIALECTS.values() if d.token_ids != "never")
            raise ValueError(
                f"token_ids: only {givers} servers return token ids, not {self.dialect}"
            )
        return self

    @field_validator("follow_redirects_to")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for host in v:
            if not _HOST.fullmatch(host):
                raise ValueError(
                    f"{host!r} is not a host name: give host or host:port (eu.example.com, "
                    "10.0.0.2:8000), without a scheme or path"
                )
        return v

    @field_validator("headers")
    @classmethod
    def _headers_fit_http(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"header name {name!r} is not an HTTP header name")
            where = _first_control(value)
            if where is not None:
                raise ValueError(
                    f"header {name} holds {where}: a header cannot hold control characters"
                )
        return v


_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)(:[0-9]{1,5})?")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROL_NAMES = {"\r": "a carriage return (CR)", "\n": "a line feed (LF)", "\t": "a tab"}


def _first_control(text: str) -> str | None:
    """The first control character of `text` named with its place, or None: such a
    character in a header splits it (CR, LF) or acts on a terminal."""
    found = _CONTROL.search(text)
    if found is None:
        return None
    ch = found.group()
    name = _CONTROL_NAMES.get(ch, f"a control character (U+{ord(ch):04X})")
    return f"{name} at character {found.start() + 1}"


def key_from_env(variable: str, setting: str) -> str:
    """The key in environment variable `variable` (which `[endpoint].<setting>` names), with
    the spaces and line end a copy adds around it taken off; '' when unset. A key with a
    control character inside is refused in one line that never shows the key."""
    key = os.environ.get(variable, "").strip()
    where = _first_control(key)
    if where is not None:
        raise ConfigError(
            f"{variable} (named by [endpoint].{setting}) holds {where}: a key cannot hold "
            "control characters; set it again (a copy may have brought a line end or a "
            "terminal code along)"
        )
    return key


Temperature = Annotated[float, Field(ge=0)]
TopP = Annotated[float, Field(gt=0, le=1)]


class GenerationConfig(_Model):
    """`[generation]`: the target model and its sampling settings (all data-affecting)."""

    model: str
    max_tokens: int = Field(default=4096, gt=0)
    temperature: Temperature | list[Temperature] | None = None
    top_p: TopP | list[TopP] | None = None
    seed: int | None = None
    reasoning: dict[str, Any] | None = None
    samples: int = Field(default=1, ge=1, le=1024)
    """Answers per prompt, each its own item (a dataset's `samples` overrides it)."""
    mix: Literal["cycle", "draw"] = "cycle"
    """How a list of temperatures, top_p values or reasoning efforts is spread over a prompt's
    samples: `cycle` gives sample k the k-th value (wrapping); `draw` picks one per sample by
    a seeded draw (the job's seed, the item, the sample)."""

    @model_validator(mode="after")
    def _mixes(self) -> GenerationConfig:
        for name in ("temperature", "top_p"):
            if getattr(self, name) == []:
                raise ValueError(f"{name}: a list needs at least one value")
        effort = (self.reasoning or {}).get("effort")
        if isinstance(effort, list) and not (effort and all(isinstance(e, str) for e in effort)):
            raise ValueError("reasoning.effort: a list of effort names, at least one")
        return self


class RunConfig(_Model):
    """`[run]`: how hard to push; none of this changes the data."""

    concurrency: int = Field(default=256, ge=1, le=100_000)
    """The default lane's concurrency (when no `[[lanes]]` are given)."""
    max_attempts: int = Field(default=4, ge=1, le=100)
    """Attempts per item for failures other than rate limits."""
    max_rate_limit_retries: int = Field(default=50, ge=0)
    """Retries per item after 429s, which are flow control and do not use up max_attempts."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Total time for one attempt."""
    connect_timeout_s: float = Field(default=30.0, gt=0)
    ttfb_timeout_s: float = Field(default=300.0, gt=0)
    """Time to the response headers (streaming lanes)."""
    idle_timeout_s: float = Field(default=60.0, gt=0)
    """A stream that sends no bytes for this long is `stalled` (streaming lanes)."""
    stream_read_interval_s: float = Field(default=0.25, ge=0, le=5)
    """Streaming lanes read each stream at most this often, in one go (0: every chunk as it
    comes). Each read costs an event-loop wake-up; gathering chunks between reads cuts the
    client's CPU per chunk several times. A stream ends up to this much later."""
    adaptive: bool = True
    """Adapt each endpoint's concurrency (AIMD) between 1 and the lane's concurrency."""
    initial_limit: int = Field(default=256, ge=1)
    """Where the adaptive limit starts (it doubles every round trip until the first overload).
    256 rather than 64: on bench/compare.py's workload (capacity 400) the ramp from 64 took
    about 4 s of a 20 s run, and 256 saved 1.1-1.6 s with no more 429s; 512 saved no more
    and had about 230 answered 429."""
    stop_error_rate: float = Field(default=0.5, gt=0, le=1)
    """Stop when this share of the last 200 items failed after all their retries ..."""
    stop_error_min_attempts: int = Field(default=20, ge=1)
    """... once at least this many items ended."""
    stop_grace_s: float = Field(default=60.0, ge=0)
    """On a stop, how long requests in flight may take to finish."""
    pool_down_timeout_s: float = Field(default=900.0, gt=0)
    """How long items wait for a self-hosted server to come back (its /health probed) when
    every server of their lane is down or loading; then the run stops, its items pending."""
    prefix_affinity: bool = True
    """On a lane of several vLLM/SGLang servers, a conversation's turns and a prompt's samples
    go to the server of its last attempt (its prefix cached there) unless it is down or far
    more loaded than the least loaded (engine/servers.py AFFINITY_SLACK)."""
    cache_order: bool = True
    """A conversation's items (its turns, a prompt's samples) go out one after another, the
    longest prompt first, so that a provider's prefix cache serves all but the first; off:
    each item at its own place in the seeded shuffle. Decided when items are first read."""
    progress_interval_s: float = Field(default=10.0, gt=0)
    shuffle_seed: int = 0
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve Prometheus metrics on this port while the job runs (`regen run --metrics-port`)."""
    metrics_host: str = "127.0.0.1"


class BudgetConfig(_Model):
    """`[budget]`: the job's hard dollar cap, credit floor and how token budgets count."""

    max_cost_usd: float | None = Field(default=None, gt=0)
    """The whole job never spends more than this (ledger total, across runs)."""
    stop_when_credits_below: float | None = Field(default=None, ge=0)
    """Stop sending when the account's remaining credit (OpenRouter /key) falls below this."""
    budget_tokens: Literal["completion", "total"] = "completion"
    """What a dataset's token_budget counts: completion tokens, or prompt + completion."""
    credit_poll_s: float = Field(default=30.0, gt=0)
    """Seconds between reads of the account's remaining credit."""


class LaneConfig(_Model):
    """`[[lanes]]`: a share of the items with its own concurrency, max_tokens and timeout.

    An item goes to the first lane that selects it (by dataset and estimated prompt tokens).
    """

    name: str = Field(pattern=NAME_PATTERN, max_length=NAME_MAX)
    concurrency: int = Field(default=256, ge=1, le=100_000)
    max_tokens: int | None = Field(default=None, gt=0)
    """Defaults to [generation].max_tokens."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Defaults to [run].timeout_s."""
    stream: bool = False
    """Stream responses (SSE): needed to see a stalled long answer before its timeout."""
    datasets: list[str] | None = None
    min_prompt_tokens: int | None = Field(default=None, ge=0)
    max_prompt_tokens: int | None = Field(default=None, ge=0)
    endpoints: list[str] | None = None
    """Names of [[endpoints]] this lane uses; all of them by default."""
    escalate_to: str | None = None
    """Re-send an answer truncated at this lane's max_tokens on that lane (both are paid)."""


class CustomMapping(_Model):
    """`[datasets.custom]`: where a row of an unlisted format keeps its conversation.

    Either `messages` (a dotted field path to a list of turns, each with `role` and `content`
    keys, and a `roles` table for odd speaker names) or `prompt` (and `response`) paths for
    single-turn rows. `system` and `tools` are optional paths.
    """

    messages: str | None = None
    role: str = "role"
    content: str = "content"
    roles: dict[str, Literal["system", "user", "assistant", "tool"]] = Field(default_factory=dict)
    prompt: str | None = None
    response: str | None = None
    system: str | None = None
    tools: str | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> CustomMapping:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give either messages or prompt")
        return self


class DatasetConfig(_Model):
    """`[[datasets]]`: one prompt source, regenerated in the order the file lists them."""

    name: str = Field(pattern=NAME_PATTERN, max_length=NAME_MAX)
    path: str
    """A file (.jsonl, .json, .parquet, .csv, .arrow), a folder of them, a dataset saved with
    `datasets.save_to_disk`, or `hf://org/name` (needs `pip install 'regen[hub]'`)."""
    format: SourceFormat = "openai"
    reader: ReaderKind = "auto"
    config: str | None = None
    """The hub dataset's config (Mixture-of-Thoughts needs one; OpenCodeInstruct's is `train`)."""
    split: str | None = None
    """The split of a hub dataset, a saved DatasetDict or a folder; `train` by default."""
    custom: CustomMapping | None = None
    mode: RegenMode = "last_turn"
    """last_turn: the final assistant turn; each_turn: every assistant turn with the original
    history before it; sequential: every assistant turn, each after the regenerated ones."""
    system: SystemPolicy = "keep"
    """What happens to the row's system prompt: keep, drop, replace (with system_prompt), or
    fill (system_prompt where the row has none)."""
    system_prompt: str | None = None
    leading_assistant: Literal["keep", "drop"] = "drop"
    """Turns before the first user turn that are not system turns (ShareGPT's split pieces
    start with the end of an answer): dropped, or kept as history."""
    limit: int | None = Field(default=None, ge=0)
    """Read at most this many rows of the source (before filter and sample)."""
    filter: dict[str, FilterValue | list[FilterValue]] = Field(default_factory=dict)
    """Keep rows whose field (a dotted path) equals the value, or one of a list of values."""
    sample: float | int | None = Field(default=None, gt=0)
    """A fraction (0 < x < 1) or a count of the rows that pass the filter, chosen by seed."""
    shuffle_seed: int | None = None
    """Seed for this dataset's sample and dispatch order; [run].shuffle_seed by default."""
    max_prompt_tokens: int | None = Field(default=None, gt=0)
    """Turns whose prompt is estimated longer than this are skipped, with the reason."""
    max_row_bytes: int = Field(default=16 * 2**20, gt=0)
    """Rows larger than this are reported as bad rows instead of being read."""
    token_budget: int | None = Field(default=None, gt=0)
    """Stop sending this dataset's items once this many tokens were used ([budget].budget_tokens
    says which)."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    """A hard dollar cap for this dataset."""
    samples: int | None = Field(default=None, ge=1, le=1024)
    """Answers per prompt for this dataset ([generation].samples by default)."""

    @model_validator(mode="after")
    def _consistent(self) -> DatasetConfig:
        if (self.format == "custom") != (self.custom is not None):
            raise ValueError('format = "custom" and a [datasets.custom] table go together')
        if self.system in ("replace", "fill") and not self.system_prompt:
            raise ValueError(f'system = "{self.system}" needs system_prompt')
        if isinstance(self.sample, float) and not self.sample < 1:
            raise ValueError("sample is a fraction below 1 or a whole count of rows")
        return self

    def source_fields(self) -> dict[str, Any]:
        """What decides which conversations this dataset yields (its fingerprint part).
        Defaults are left out, so a state made before a setting existed still matches."""
        fields: dict[str, Any] = {"format": self.format, "mode": self.mode}
        optional = {
            "config": self.config,
            "split": self.split,
            "custom": self.custom.model_dump() if self.custom else None,
            "system": None if self.system == "keep" else self.system,
            "leading_assistant": None if self.leading_assistant == "drop" else "keep",
            "system_prompt": self.system_prompt,
            "filter": self.filter or None,
            "sample": self.sample,
            "shuffle_seed": self.shuffle_seed,
            "max_prompt_tokens": self.max_prompt_tokens,
        }
        fields.update({k: v for k, v in optional.items() if v is not None})
        return fields


class ReconstructConfig(_Model):
    """`[reconstruct]`: how `regen audit` and `regen export --format tokenized` rebuild the
    target's token ids (flags of those commands override it)."""

    family: str
    tokenizer: str = "sim"
    """A folder with tokenizer files, a tokenizer.json, a Hugging Face hub id, or `sim`."""
    chat_template: str | None = None
    """A Jinja file to use instead of the tokenizer's own chat template."""
    template_kwargs: dict[str, Any] = Field(default_factory=dict)
    trust_remote_code: bool = False
    """Needed by tokenizers that ship their own code (Kimi's tiktoken tokenizer) and by
    DeepSeek-V3.2's encoder, which regen runs from the model's folder."""
    stop: str | None = None
    """The token the model ends its turn with, where its template writes several or none."""
    live_audit: bool = True
    """Audit a sample of the answers while the job runs; failing samples are printed."""
    live_audit_sample: int = Field(default=32, ge=1)
    """Answers checked per progress interval (the first ones of each interval)."""

    @model_validator(mode="after")
    def _auto_reads_a_template(self) -> ReconstructConfig:
        from regen.reconstruct.families import auto_without_template

        why = auto_without_template(self.family, self.tokenizer, self.chat_template)
        if why is not None:
            raise ValueError(why)
        return self

    @field_validator("family")
    @classmethod
    def _known(cls, v: str) -> str:
        from regen.reconstruct.families import AUTO, FAMILIES

        if v != AUTO and v not in FAMILIES:
            raise ValueError(
                f"unknown template family {v!r} (allowed: auto, {', '.join(FAMILIES)}; "
                "`regen families` lists them)"
            )
        return v


class Job(_Model):
    """A whole job file."""

    job: JobInfo = Field(default_factory=JobInfo)
    endpoint: EndpointConfig | None = None
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    generation: GenerationConfig
    run: RunConfig = Field(default_factory=RunConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    lanes: list[LaneConfig] = Field(default_factory=list)
    datasets: list[DatasetConfig] = Field(min_length=1)
    reconstruct: ReconstructConfig | None = None
    base_dir: str = Field(default=".", exclude=True)
    """The job file's folder; set by load_job, not by the file."""

    @field_validator("datasets")
    @classmethod
    def _unique_names(cls, v: list[DatasetConfig]) -> list[DatasetConfig]:
        _unique("dataset", [d.name for d in v])
        return v

    @model_validator(mode="after")
    def _references(self) -> Job:
        if self.endpoint is not None and self.endpoints:
            raise ValueError("give either [endpoint] or [[endpoints]], not both")
        _unique("endpoints", [e.name for e in self.endpoints])
        _unique("lanes", [lane.name for lane in self.lanes])
        datasets = {d.name for d in self.datasets}
        for d in self.datasets:
            if d.mode == "sequential" and self.dataset_samples(d) > 1:
                raise ValueError(
                    f"dataset '{d.name}': samples > 1 with mode sequential: each sample would "
                    "need its own chain of regenerated turns; use each_turn or samples = 1"
                )
        for e in self.endpoint_pool:
            if "n" in e.extra_body:
                raise ValueError(
                    f"endpoint '{e.name}': n in extra_body: answers per prompt are "
                    "[generation] samples (each stored, billed and exported as its own answer)"
                )
        endpoints = {e.name for e in self.endpoint_pool}
        lanes = {lane.name: lane for lane in self.lanes}
        for i, lane in enumerate(self.lanes):
            for ds in lane.datasets or []:
                if ds not in datasets:
                    raise ValueError(f"lanes[{i}].datasets names unknown dataset '{ds}'")
            for ep in lane.endpoints or []:
                if ep not in endpoints:
                    raise ValueError(f"lanes[{i}].endpoints names unknown endpoint '{ep}'")
            target = lanes.get(lane.escalate_to or "")
            if lane.escalate_to is not None:
                if target is None or target.name == lane.name:
                    raise ValueError(f"lanes[{i}].escalate_to must name another lane")
                if self.lane_max_tokens(target) <= self.lane_max_tokens(lane):
                    raise ValueError(
                        f"lanes[{i}].escalate_to '{target.name}' must have a larger max_tokens"
                    )
        pool = {e.name: e for e in self.endpoint_pool}
        for i, lane in enumerate(self.lane_list):
            for name in lane.endpoints or list(pool):
                server = pool[name]
                if lane.stream and server.token_ids and server.kind.token_ids == "unstreamed":
                    raise ValueError(
                        f"lanes[{i}] streams, and SGLang refuses token ids on streams: set "
                        f"stream = false or drop token_ids on endpoint '{name}'"
                    )
        return self

    @property
    def endpoint_pool(self) -> list[EndpointConfig]:
        """The endpoints requests may go to: `[[endpoints]]`, or the one `[endpoint]`."""
        return self.endpoints or [self.endpoint or EndpointConfig()]

    @property
    def lane_list(self) -> list[LaneConfig]:
        """The lanes, or one `default` lane with [run].concurrency for everything."""
        return self.lanes or [LaneConfig(name="default", concurrency=self.run.concurrency)]

    def lane_max_tokens(self, lane: LaneConfig) -> int:
        return lane.max_tokens or self.generation.max_tokens

    def lane_timeout_s(self, lane: LaneConfig) -> float:
        return lane.timeout_s or self.run.timeout_s

    def dataset_seed(self, ds: DatasetConfig) -> int:
        return self.run.shuffle_seed if ds.shuffle_seed is None else ds.shuffle_seed

    def dataset_samples(self, ds: DatasetConfig) -> int:
        """Answers per prompt for a dataset."""
        return self.generation.samples if ds.samples is None else ds.samples

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p

    @property
    def output_path(self) -> Path:
        return self.resolve(self.job.output_dir)

    def fingerprint_fields(self) -> dict[str, Any]:
        """The data-affecting settings: what a resumed run must not change.

        Left out, because they do not change what a response is made from: max_tokens (a
        limit, like a lane's), concurrency, timeouts, display settings, dataset paths and
        limits (items are identified by content), and an endpoint pool's size (a server added
        with the same settings serves the same model the same way).
        """
        endpoints = {
            canonical_json({"dialect": e.dialect, "provider": e.provider, "extra": e.extra_body})
            for e in self.endpoint_pool
        }
        return {
            # samples: more adds items and fewer is refused (prepare.check_samples); mix only
            # when not the default, so a state made before it existed still matches.
            "generation": self.generation.model_dump(
                exclude={"max_tokens", "samples"}
                | ({"mix"} if self.generation.mix == "cycle" else set())
            ),
            "endpoints": [json.loads(e) for e in sorted(endpoints)],
            "datasets": {d.name: d.source_fields() for d in self.datasets},
        }

    def fingerprint(self) -> str:
        return stable_hash(canonical_json(self.fingerprint_fields()))


def fingerprint_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two `fingerprint_fields()`, as `field: old -> new` lines.

    A dataset added to the job or left out of it is not a change: only the settings of a
    dataset present in both are compared.
    """
    changes: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            keys = a.keys() & b.keys() if path == "datasets" else a.keys() | b.keys()
            for key in sorted(keys):
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif canonical_json(a) != canonical_json(b):
            changes.append(f"{path}: {_show(a)} -> {_show(b)}")

    walk(old, new, "")
    return changes


def _show(value: Any) -> str:
    text = "unset" if value is None else canonical_json(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _unique(what: str, names: list[str]) -> None:
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{what} names must be unique, repeated: {', '.join(dupes)}")


def job_schema() -> dict[str, Any]:
    """The job file's JSON Schema (draft 2020-12, as pydantic writes it from `Job`): its
    fields, types, defaults and allowed values, for an editor to check a file as it is typed.
    The checks across fields (a lane's escalation, a price and its kind) are load_job's."""
    schema = Job.model_json_schema()
    schema["properties"].pop("base_dir", None)  # set by load_job, refused in a file
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def load_job(path: str | Path, **overrides: Any) -> Job:
    """Read and validate a job file; every problem becomes a one-line ConfigError."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{p}: no such job file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from exc
    if "base_dir" in raw:
        raise ConfigError(f"{p}: unknown field 'base_dir'")
    for dotted, value in overrides.items():
        _set_dotted(raw, dotted, value)
    bad = [
        f"field '{field_path(loc)}': {value} is not a finite number (give a number, or leave "
        "the field out for its default)"
        for loc, value in _non_finite(raw)
    ]
    if bad:
        raise ConfigError(f"{p}: {'; '.join(bad)}")
    raw["base_dir"] = str(p.resolve().parent)
    try:
        return Job.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{p}: {describe_validation_error(exc, Job)}") from exc


def _non_finite(
    node: Any, loc: tuple[int | str, ...] = ()
) -> Iterator[tuple[tuple[int | str, ...], float]]:
    """Every inf or nan in a parsed job file, with where it is. One rule for every number:
    typed fields and free-form tables alike (extra_body, provider and reasoning are sent as
    JSON, which has no inf or nan: orjson would send null in their place)."""
    if isinstance(node, float) and not math.isfinite(node):
        yield loc, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _non_finite(value, (*loc, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _non_finite(value, (*loc, i))


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
