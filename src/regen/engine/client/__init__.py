"""HTTP client: request bodies per dialect, the aiohttp session, response parsing, errors."""

from regen.engine.client.body import chat_body
from regen.engine.client.errors import FAILURE_CLASSES, RETRYABLE, STOPS_RUN
from regen.engine.client.http import ChatClient, Timeouts
from regen.engine.client.response import parse_chat_body

__all__ = [
    "FAILURE_CLASSES",
    "RETRYABLE",
    "STOPS_RUN",
    "ChatClient",
    "Timeouts",
    "chat_body",
    "parse_chat_body",
]
