"""The console every command prints with: keys redacted before rich lays text out, control
characters shown as escapes, and tables not squeezed into 80 columns when piped."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from regen.safe import REDACTED, printable, redact


class KeyFreeConsole(Console):
    """The console every command prints with: text is redacted before rich lays it out (a key
    folded across two lines would escape the stream's redaction), and its control characters
    are shown as escapes (a server's or a dataset's words cannot act on the terminal)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        markup = self._markup if kwargs.get("markup") is None else kwargs["markup"]
        # As markup, REDACTED would read as a tag and vanish: it is written escaped there.
        text = redact(text, escape(REDACTED)) if markup else text
        return super().render_str(printable(text, newlines=True), **kwargs)


def command_console() -> KeyFreeConsole:
    """A command's console on stdout: the terminal's width, or 160 columns when piped."""
    console = KeyFreeConsole()
    if not console.is_terminal:
        # Piped to a file or over a non-interactive SSH: do not squeeze tables into 80 columns.
        console = KeyFreeConsole(width=160)
    return console
