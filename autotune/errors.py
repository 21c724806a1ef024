"""The one exception type that means "the user can fix this"."""

from __future__ import annotations


class AutotuneError(Exception):
    """Bad input or an impossible request.

    The CLI prints the message as a single line and exits with status 2, without a traceback.
    The message says what is wrong and how to fix it.
    """
