"""Click's errors in reading the command line, as one ``autotune: error:`` line (``autotune.__main__.main`` prints it):
a value not of its option's declared type names the option (``--global-batch: '2.5' is not a whole number``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

# What a value that is not of its option's declared type is not (plan/cli_options.py declares these two).
_NOT_A = {int: "a whole number", float: "a number"}


def click_exception() -> type[Exception]:
    """Click's ``ClickException``, whichever Click Typer runs on: its own copy from 0.29 (``typer._click``),
    Click itself before; reached through the class Typer exports, ``typer.BadParameter``."""
    return next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException")


def usage_error(error: Exception, args: list[str], app: typer.Typer) -> str:
    """Click's error in reading the command line, in one line: a value not of its option's type names the
    option, the value and what it must be (``--global-batch: '2.5' is not a whole number``); any other (a
    missing option, an unknown one, an extra argument) is Click's message and where the options are listed."""
    param, ctx = getattr(error, "param", None), getattr(error, "ctx", None)
    if isinstance(error, typer.BadParameter) and param is not None and ctx is not None:
        expected = _declared_type(app, ctx.info_name, param.name)
        given = _value_given(args, param.opts)
        if expected in _NOT_A and given is not None:
            return f"{max(param.opts, key=len)}: {given!r} is not {_NOT_A[expected]}"
    message = " ".join(str(getattr(error, "format_message", error.__str__)()).split()).rstrip(".")
    command = next((f"autotune {arg}" for arg in args[:1] if _command(app, arg) is not None), "autotune")
    return f"{message}; `{command} --help` lists the options"


def _command(app: typer.Typer, name: str | None) -> Callable[..., Any] | None:
    """The function of the command the command line calls ``name`` (``chat-corpus``: ``chat_corpus``)."""
    for info in app.registered_commands:
        callback = info.callback
        if callback is not None and (info.name or callback.__name__.replace("_", "-")) == name:
            return callback
    return None


def _declared_type(app: typer.Typer, command: str | None, parameter: str | None) -> type | None:
    """The type a command's parameter is declared with (``int`` for ``option.GlobalBatch``), ``None`` aside."""
    import typing

    callback = _command(app, command)
    if callback is None:
        return None
    hint = typing.get_type_hints(callback).get(parameter or "")
    return next((t for t in typing.get_args(hint) or (hint,) if t is not type(None)), None)


def _value_given(args: list[str], opts: list[str]) -> str | None:
    """The value the command line gave an option last (``--opt value`` or ``--opt=value``): the one Click read."""
    given = None
    for index, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name in opts:
            given = value if equals else next(iter(args[index + 1 : index + 2]), None)
    return given
