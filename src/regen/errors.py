"""Errors in the user's terms. The CLI maps every RegenError to one line in one place."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError


class RegenError(Exception):
    """Root of every error regen reports to the user (exit code 1)."""

    exit_code = 1


class UsageError(RegenError):
    """The command was given something it cannot take (exit code 2, as argparse's own)."""

    exit_code = 2


class ConfigError(RegenError):
    """A job or sim config is invalid: names the file and the field."""


class SourceError(RegenError):
    """A dataset cannot be read at all (a bad row is reported, never raised)."""


class StateError(RegenError):
    """The output directory or state.db cannot be used."""


class StateGone(StateError):
    """state.db was deleted or replaced under a running job: nothing more can be saved."""


class EndpointError(RegenError):
    """A request failed; `failure_class` is one of regen.engine.client.errors.FAILURE_CLASSES."""

    def __init__(
        self,
        failure_class: str,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        generation_id: str | None = None,
        maybe_billed: bool = False,
    ) -> None:
        super().__init__(f"{failure_class}: {message}")
        self.failure_class = failure_class
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s
        self.generation_id = generation_id
        """The generation's id, when the answer had begun (its headers came): it can be looked
        up for what the provider billed."""
        self.maybe_billed = maybe_billed
        """The request reached the provider and no error status came back (a timeout, a cut
        connection, a broken 200 body): the provider may have billed it."""
        self.unbilled = False
        """A whole JSON body that is an error object (OpenRouter's HTTP 200 with `error`): the
        provider's answer is that it failed, and such answers are not billed."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's text, or its type's name when it has none."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def one_line(exc: BaseException) -> str:
    """An exception as one line: regen's own as they are, others with their type."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return first if isinstance(exc, RegenError) and first else f"{type(exc).__name__}: {first}"


class Interrupted(KeyboardInterrupt):
    """A signal before a run's first request: the run stops where it is (nothing is in flight,
    and what it read is committed). Not a RegenError: nothing went wrong."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def describe_validation_error(exc: ValidationError, root: type[BaseModel]) -> str:
    """One line naming each bad field, with the allowed names for unknown ones."""
    parts = []
    for err in exc.errors():
        loc = field_path(err["loc"])
        if err["type"] == "extra_forbidden":
            allowed = _allowed_fields(root, err["loc"][:-1])
            hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
            parts.append(f"unknown field '{loc}'{hint}")
        elif err["type"] == "missing":
            parts.append(f"missing field '{loc}'")
        else:
            where = f"field '{loc}': " if loc else ""
            # A validator's own words, without pydantic's "Value error, " before them.
            ctx = err.get("ctx") or {}
            msg = (
                str(ctx["error"]) if err["type"] == "value_error" and "error" in ctx else err["msg"]
            )
            parts.append(f"{where}{msg}")
    return "; ".join(parts)


def field_path(loc: tuple[int | str, ...]) -> str:
    """Where a field is, as a job file names it: `lanes[0].max_tokens`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _allowed_fields(root: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", None)
        model = args[0] if args else ann
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return [name for name, f in model.model_fields.items() if not f.exclude]
