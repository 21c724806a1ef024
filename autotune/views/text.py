"""User and storage text written into each text form, one function a form: a terminal (:func:`printable`,
:func:`for_rich`), a comment line of a shell script, Python or YAML (:func:`comment_lines`), a shell
command line (:func:`shell_line`). Values inside a form go through that form's own writer (``json.dumps``,
``repr``, ``yaml.safe_dump``, ``html.escape``), which quote every character.

A study name, a dataset path, a trial's error or a ``--base-args`` value may hold anything: a newline that
ends a comment and starts a command, an escape sequence that retitles or clears a terminal, Rich markup
that makes a hyperlink. Every printer and every exported form writes them through here.
"""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Iterable

# Unicode's control (Cc), format (Cf: the bidirectional overrides that reorder what a reader sees) and
# line and paragraph separators (Zl, Zp): never written raw to a terminal or a comment.
_UNPRINTABLE = ("Cc", "Cf", "Zl", "Zp")


def printable(text: str) -> str:
    """``text`` with every control character escaped as Python writes it (``\\x1b``, ``\\n``, ``\\u202e``),
    the rest unchanged: what a terminal is shown of a string it did not write itself."""
    if text.isprintable():
        return text
    return "".join(
        character.encode("unicode_escape").decode("ascii")
        if unicodedata.category(character) in _UNPRINTABLE
        else character
        for character in text
    )


def for_rich(text: str) -> str:
    """:func:`printable`, with Rich's markup escaped too (``[link=...]`` would write a hyperlink), for a
    string interpolated into text a Rich console prints with markup."""
    from rich.markup import escape

    return escape(printable(text))


def comment_lines(texts: Iterable[str], prefix: str = "# ") -> list[str]:
    """Comment lines of ``texts``: each of their lines (split at every line break a shell, Python or YAML
    reader ends a comment at: ``str.splitlines``) a comment of its own, control characters escaped."""
    return [f"{prefix}{printable(line)}" for text in texts for line in (text.splitlines() or [""])]


def shell_line(tokens: Iterable[str]) -> str:
    """One POSIX shell command line of ``tokens``, each quoted (``shlex.quote``: single quotes keep a
    newline, ``$( )``, backticks and quotes literal), ending in a newline."""
    return " ".join(shlex.quote(token) for token in tokens) + "\n"
