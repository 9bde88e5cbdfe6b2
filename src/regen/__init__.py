"""regen: regenerate prompt datasets with a target LLM into exact training data."""

from regen.conversation import Conversation, Message, Request, Result, ToolCall, Usage
from regen.errors import ConfigError, EndpointError, RegenError, SourceError, StateError

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Conversation",
    "EndpointError",
    "Message",
    "RegenError",
    "Request",
    "Result",
    "SourceError",
    "StateError",
    "ToolCall",
    "Usage",
    "__version__",
]
