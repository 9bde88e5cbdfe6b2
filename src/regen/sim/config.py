"""The simulator's world: models, their provider endpoints, prices and speeds (TOML, defaults)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from regen.config import describe_validation_error
from regen.errors import ConfigError


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    max_completion_tokens: int = Field(default=65536, gt=0)


class SimModel(_Model):
    id: str
    context_length: int = 262144
    reasoning: bool = True
    """Whether the model reasons by default (reasoning text comes before the answer)."""
    mean_completion_tokens: float = Field(default=300.0, gt=0)
    endpoints: list[SimEndpoint] = Field(min_length=1)


def _default_models() -> list[SimModel]:
    m = 1e-6
    return [
        SimModel(
            id="moonshotai/kimi-k2.5",
            endpoints=[
                SimEndpoint(
                    provider_name="Moonshot AI",
                    tag="moonshotai",
                    quantization="int4",
                    prompt_price=0.6 * m,
                    completion_price=2.5 * m,
                    ttft_s=0.4,
                    tokens_per_s=60,
                ),
                SimEndpoint(
                    provider_name="Fireworks",
                    tag="fireworks/fp4",
                    quantization="fp4",
                    prompt_price=0.5 * m,
                    completion_price=2.0 * m,
                    ttft_s=0.2,
                    tokens_per_s=120,
                ),
                SimEndpoint(
                    provider_name="DeepInfra",
                    tag="deepinfra/fp8",
                    quantization="fp8",
                    prompt_price=0.45 * m,
                    completion_price=2.2 * m,
                    ttft_s=0.3,
                    tokens_per_s=80,
                ),
            ],
        ),
        SimModel(
            id="qwen/qwen3-8b",
            mean_completion_tokens=200.0,
            endpoints=[
                SimEndpoint(
                    provider_name="Novita",
                    tag="novita/fp8",
                    quantization="fp8",
                    prompt_price=0.035 * m,
                    completion_price=0.138 * m,
                    ttft_s=0.15,
                    tokens_per_s=150,
                ),
            ],
        ),
    ]


class SimConfig(_Model):
    """`regen sim --config sim.toml`; every field has a default."""

    seed: int = 0
    time_scale: float = Field(default=1.0, ge=0)
    """Multiplies every simulated delay: 0 answers at once, 0.1 is ten times faster."""
    api_keys: list[str] = Field(default_factory=list)
    """If set, only these Bearer keys are accepted; otherwise any non-empty key is."""
    models: list[SimModel] = Field(default_factory=_default_models)

    def model(self, model_id: str) -> SimModel | None:
        return next((m for m in self.models if m.id == model_id), None)


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
