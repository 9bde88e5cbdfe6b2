"""The simulator's world: models, their provider endpoints, prices and speeds (TOML, defaults)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from regen.errors import ConfigError, describe_validation_error


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


REQUEST_PARAMETERS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "tools",
    "tool_choice",
    "reasoning",
    "include_reasoning",
    "response_format",
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    "top_logprobs",
    "min_p",
    "repetition_penalty",
    "logit_bias",
)
"""Request fields that count as parameters for `provider.require_parameters`."""
DEFAULT_PARAMETERS = tuple(
    p
    for p in REQUEST_PARAMETERS
    if p not in ("logprobs", "top_logprobs", "min_p", "repetition_penalty", "logit_bias")
)
"""What an endpoint supports unless its config says otherwise."""

FAULT_KINDS = (
    "500",
    "502",
    "503",
    "524",
    "529",
    "408",
    "429",
    "reset",
    "stall",
    "error_200",
    "midstream_error",
    "padding",
    "keepalive",
    "cold_start",
    "misroute",
)


class SimFaults(_Model):
    """Fault rates (0 to 1) per request. A request can also force faults with the header
    `X-Sim-Fault: kind[,kind]` (kinds: FAULT_KINDS)."""

    http_5xx: float = Field(default=0.0, ge=0, le=1)
    http_5xx_codes: list[int] = Field(default_factory=lambda: [500, 502, 503, 524, 529])
    http_408: float = Field(default=0.0, ge=0, le=1)
    reset: float = Field(default=0.0, ge=0, le=1)
    """The connection is cut part-way through the body (billed: the provider finished)."""
    stall: float = Field(default=0.0, ge=0, le=1)
    stall_s: float = Field(default=30.0, ge=0)
    """No bytes for this long, part-way through (real seconds, not scaled)."""
    error_200: float = Field(default=0.0, ge=0, le=1)
    """HTTP 200 whose body is an `error` object."""
    midstream_error: float = Field(default=0.0, ge=0, le=1)
    """A chunk with `finish_reason: "error"` (streaming) or `choices[0].error` (not)."""
    cold_start: float = Field(default=0.0, ge=0, le=1)
    """Empty content and zero completion tokens (not billed)."""
    padding: float = Field(default=0.1, ge=0, le=1)
    """Leading whitespace lines before a non-streaming body, as OpenRouter sends."""
    misroute: float = Field(default=0.0, ge=0, le=1)
    """The answer comes from an endpoint the request's provider filters removed (a routing
    leak: not documented behaviour, for testing that a client checks who answered)."""
    keepalive: float = Field(default=0.5, ge=0, le=1)
    """`: OPENROUTER PROCESSING` comment lines in a stream."""
    usage_chunk: Literal["empty_choices", "empty_choice", "random"] = "random"
    """The shape of the usage chunk that follows the finish chunk."""


class SimCache(_Model):
    """A provider endpoint's prompt cache (prefix_cache.py) and what it bills for it."""

    read_multiplier: float = Field(ge=0)
    """Cached prompt tokens cost this times the prompt price (`input_cache_read`)."""
    write_multiplier: float = Field(default=1.0, ge=0)
    """Prompt tokens written to the cache cost this times the prompt price
    (`input_cache_write`, listed only when it is not 1)."""
    block_tokens: int = Field(default=64, ge=1)
    """The cache's granularity: only whole blocks of a prompt's prefix are kept and found."""
    ttl_s: float = Field(default=300.0, gt=0)
    """A block's lifetime after its last use, in simulated seconds."""
    capacity_tokens: int = Field(default=50_000_000, ge=1)
    """Tokens the endpoint keeps; the least recently used blocks go first above it."""


PROVIDER_CACHES: dict[str, SimCache] = {
    "moonshotai": SimCache(read_multiplier=0.25),
    "deepseek": SimCache(read_multiplier=0.1),
    "alibaba": SimCache(read_multiplier=0.1, write_multiplier=1.25),
}
"""With `prompt_caching = true`, the cache of each provider (by base slug) whose endpoints do
not set their own: Moonshot-like reads at 0.25x, DeepSeek-like at 0.1x, Alibaba-like at 0.1x
with writes at 1.25x (OpenRouter's prompt-caching guide)."""


class SimEndpoint(_Model):
    """One provider endpoint serving a model."""

    provider_name: str
    """Display name, as OpenRouter's response `provider` field shows it."""
    tag: str
    """Routing slug of this exact endpoint, e.g. `fireworks/fp4`."""
    quantization: str | None = None
    prompt_price: float = Field(default=0.0, ge=0)
    """USD per prompt token."""
    completion_price: float = Field(default=0.0, ge=0)
    """USD per completion token."""
    ttft_s: float = Field(default=0.2, ge=0)
    tokens_per_s: float = Field(default=200.0, gt=0)
    prefill_tokens_per_s: float = Field(default=0.0, ge=0)
    """Prompt tokens computed per second before the first token, on top of `ttft_s`; tokens
    read from a prefix cache are not computed. 0: prefill takes no time beyond `ttft_s`."""
    cache: SimCache | None = None
    """This endpoint's prompt cache (whatever `prompt_caching` says). None: its provider's
    from PROVIDER_CACHES when `prompt_caching` is on, else no cache."""
    max_completion_tokens: int = Field(default=65536, gt=0)
    context_length: int = Field(default=262144, gt=0)
    capacity: int = Field(default=0, ge=0)
    """Requests this endpoint serves at once; above it, 429 with Retry-After. 0: no limit."""
    zdr: bool = False
    trains_on_data: bool = False
    supported_parameters: list[str] = Field(default_factory=lambda: list(DEFAULT_PARAMETERS))

    @property
    def slug(self) -> str:
        """The provider's base slug: the tag without its `/suffix`."""
        return self.tag.split("/", 1)[0]


FamilyName = Literal[
    "kimi-k2.5",
    "kimi-k2",
    "qwen3",
    "deepseek-v3",
    "deepseek-r1",
    "glm-4.5",
    "gpt-oss",
    "chatml",
    "glm-4.7",
    "minimax-m2",
    "qwen3-coder",
    "qwen3.5",
    "kimi-k3",
    "llama4",
]


class SimModel(_Model):
    id: str
    family: FamilyName = "kimi-k2.5"
    """The completion grammar (and so the token layout) of the model's answers."""
    context_length: int = 262144
    reasoning: bool = True
    """Whether the model reasons by default (reasoning text comes before the answer)."""
    mean_completion_tokens: float = Field(default=300.0, gt=0)
    endpoints: list[SimEndpoint] = Field(min_length=1)


def _default_models() -> list[SimModel]:
    m = 1e-6  # prices below are USD per million tokens
    e = SimEndpoint
    return [
        SimModel(
            id="moonshotai/kimi-k2.5",
            endpoints=[
                e(
                    provider_name="Moonshot AI",
                    tag="moonshotai",
                    quantization="int4",
                    prompt_price=0.6 * m,
                    completion_price=2.5 * m,
                    ttft_s=0.4,
                    tokens_per_s=60,
                    capacity=400,
                ),
                e(
                    provider_name="Fireworks",
                    tag="fireworks/fp4",
                    quantization="fp4",
                    prompt_price=0.5 * m,
                    completion_price=2.0 * m,
                    ttft_s=0.2,
                    tokens_per_s=120,
                    capacity=300,
                ),
                e(
                    provider_name="DeepInfra",
                    tag="deepinfra/fp8",
                    quantization="fp8",
                    prompt_price=0.45 * m,
                    completion_price=2.2 * m,
                    ttft_s=0.3,
                    tokens_per_s=80,
                    capacity=300,
                ),
                e(
                    provider_name="DeepInfra",
                    tag="deepinfra/nvfp4",
                    quantization="nvfp4",
                    prompt_price=0.3 * m,
                    completion_price=1.5 * m,
                    ttft_s=0.25,
                    tokens_per_s=110,
                    capacity=300,
                ),
            ],
        ),
        SimModel(
            id="qwen/qwen3-8b",
            family="qwen3",
            mean_completion_tokens=200.0,
            endpoints=[
                e(
                    provider_name="Novita",
                    tag="novita/fp8",
                    quantization="fp8",
                    prompt_price=0.035 * m,
                    completion_price=0.138 * m,
                    ttft_s=0.15,
                    tokens_per_s=150,
                    capacity=500,
                    max_completion_tokens=32768,
                    context_length=40960,
                ),
            ],
        ),
        *(
            SimModel(
                id=model_id,
                family=family,
                reasoning=reasoning,
                mean_completion_tokens=200.0,
                endpoints=[
                    e(
                        provider_name=provider,
                        tag=provider.lower().replace(" ", ""),
                        quantization="fp8",
                        prompt_price=0.3 * m,
                        completion_price=1.2 * m,
                        ttft_s=0.2,
                        tokens_per_s=100,
                        capacity=300,
                    )
                ],
            )
            for model_id, family, reasoning, provider in _OTHER_FAMILIES
        ),
    ]


_OTHER_FAMILIES: list[tuple[str, FamilyName, bool, str]] = [
    ("moonshotai/kimi-k2", "kimi-k2", False, "Groq"),
    ("deepseek/deepseek-chat-v3", "deepseek-v3", False, "DeepSeek"),
    ("deepseek/deepseek-r1", "deepseek-r1", True, "DeepSeek"),
    ("z-ai/glm-4.5", "glm-4.5", True, "Z.AI"),
    ("openai/gpt-oss-120b", "gpt-oss", True, "Cerebras"),
    ("sim/chatml", "chatml", False, "Sim"),
    ("z-ai/glm-4.7", "glm-4.7", True, "Z.AI"),
    ("minimax/minimax-m2", "minimax-m2", True, "MiniMax"),
    ("qwen/qwen3-coder", "qwen3-coder", False, "Alibaba"),
    ("qwen/qwen3.5-397b-a17b", "qwen3.5", True, "Alibaba"),
    ("moonshotai/kimi-k3", "kimi-k3", True, "Moonshot AI"),
    ("meta-llama/llama-4-maverick", "llama4", False, "Together"),
]
"""One model for each other family the simulator speaks (each with its grammar)."""


SimDialect = Literal["openrouter", "vllm", "sglang"]


class SimConfig(_Model):
    """`regen sim --config sim.toml`; every field has a default."""

    dialect: SimDialect = "openrouter"
    """Which server to be: OpenRouter (every model of `models`, routed among their provider
    endpoints), or one self-hosted vLLM or SGLang server of one model (selfhosted.py)."""
    served_model: str | None = None
    """The model a self-hosted server serves (its `--served-model-name`): the first of
    `models` by default. Its first endpoint's speed is the server's."""
    max_num_seqs: int = Field(default=256, ge=1)
    """Self-hosted: requests generated at once; more wait in the server's queue (no 429)."""
    loading_s: float = Field(default=0.0, ge=0)
    """Self-hosted: for this long after start (real seconds) the server is still loading its
    weights: vLLM does not listen yet; SGLang answers 503 on `/health` and chat requests."""
    refuse_fields: list[str] = Field(default_factory=list)
    """Self-hosted: request fields this server refuses with 422, as a server (or a proxy in
    front of it) that validates bodies strictly does (`["return_token_ids"]`: an older vLLM
    behind such a proxy)."""
    ignore_n: bool = False
    """Self-hosted: answer one choice whatever `n` asks (a server that does not take `n`)."""
    insert_without_thinking: str = ""
    """Self-hosted: text put before the content the server returns when thinking is off
    (`"\n\n"`), which its token ids do not hold: a server whose parser adds it."""
    health_route: bool = True
    """Self-hosted: serve `/health` (false: 404 there, as behind a proxy that routes only
    `/v1`)."""
    prompt_caching: bool = False
    """OpenRouter: endpoints of the providers in PROVIDER_CACHES cache prompts at their
    prices, and requests stick to the endpoint that cached them (`sticky_s`). False: only
    endpoints with their own `cache` table cache."""
    sticky_s: float = Field(default=600.0, ge=0)
    """OpenRouter: how long (simulated seconds since its last request) a conversation stays on
    the endpoint that cached it."""
    prefix_caching: bool = True
    """Self-hosted: automatic prefix caching (vLLM's, on by default; SGLang's radix cache)."""
    prefix_cache_tokens: int = Field(default=1_000_000, ge=1)
    """Self-hosted: tokens the server's prefix cache holds (its free KV cache); LRU above."""
    prefix_block_tokens: int | None = Field(default=None, ge=1)
    """Self-hosted: the cache's block size (None: vLLM's 16, SGLang's page size 1)."""
    report_cached_tokens: bool = False
    """Self-hosted: report `usage.prompt_tokens_details.cached_tokens` (vLLM's
    `--enable-prompt-tokens-details`, SGLang's `--enable-cache-report`)."""
    seed: int = 0
    time_scale: float = Field(default=1.0, ge=0)
    """Multiplies every simulated delay: 0 answers at once, 0.1 is ten times faster."""
    api_keys: list[str] = Field(default_factory=list)
    """If set, only these Bearer keys are accepted; otherwise any non-empty key is."""
    management_keys: list[str] = Field(default_factory=list)
    """Keys that may read /credits and manage keys (`/api/v1/keys`); others get 403, as
    OpenRouter's current docs say. They cannot make completions (401)."""
    credits_usd: float | None = None
    """The account's credit; requests it cannot cover get 402. None: unlimited."""
    global_rps: float | None = Field(default=None, gt=0)
    """A platform request-rate limit (429 with X-RateLimit-* headers). None: none."""
    retry_after_s: float = Field(default=1.0, ge=0)
    """Retry-After sent with capacity 429s."""
    generation_delay_s: float = Field(default=1.0, ge=0)
    """/generation answers 404 for this long after a request completes (real seconds)."""
    stream_chunk_tokens: int = Field(default=4, ge=1)
    log_bodies: bool = False
    """Keep every request body in the in-memory request log (tests; costs memory)."""
    faults: SimFaults = Field(default_factory=SimFaults)
    models: list[SimModel] = Field(default_factory=_default_models)

    def model(self, model_id: str) -> SimModel | None:
        return next((m for m in self.models if m.id == model_id), None)

    def cache_of(self, endpoint: SimEndpoint) -> SimCache | None:
        """The prompt cache an OpenRouter endpoint has: its own, else its provider's when
        `prompt_caching` is on."""
        if endpoint.cache is not None:
            return endpoint.cache
        return PROVIDER_CACHES.get(endpoint.slug) if self.prompt_caching else None


def load_sim_config(path: str | Path | None) -> SimConfig:
    if path is None:
        return SimConfig()
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{p}: no such sim config") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from exc
    try:
        return SimConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{p}: {describe_validation_error(exc, SimConfig)}") from exc
