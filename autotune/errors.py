"""The one exception type that means "the user can fix this", and the one line a library's exception gives it."""

from __future__ import annotations


class AutotuneError(Exception):
    """Bad input or an impossible request.

    The CLI prints the message as a single line and exits with status 2, without a traceback.
    The message says what is wrong and how to fix it.
    """


def first_line(exc: BaseException) -> str:
    """A library exception's first line (at most 300 characters), or its type's name where it has no message: what
    an :class:`AutotuneError` quotes of a library that refused the user's input. A ``KeyError``'s message is the
    bare key (``'full_attention'``): its type's name goes before it, or the line says nothing."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    line = text.splitlines()[0][:300]
    return f"{type(exc).__name__}: {line}" if isinstance(exc, KeyError) else line
