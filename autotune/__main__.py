"""The ``autotune`` command (``[project.scripts]``) and ``python -m autotune``: the command line's entry point.

It runs the command ``autotune.cli`` names, with Click's parse errors raised to it
(``standalone_mode=False``): every user error, Click's and autotune's own, becomes one ``autotune: error:``
line on stderr and exit status 2; what the libraries it imports print, warn or log goes to the debug log
(``autotune.runner._quiet``).
"""

from __future__ import annotations

import sys

import typer

from autotune import cli
from autotune.errors import AutotuneError
from autotune.plan.cli_errors import click_exception, usage_error


def error_text(error: BaseException | str) -> str:
    """What an error line shows of an error's text: the secrets of every storage this process opened
    scrubbed (a driver's words may carry them), control characters escaped (a study name or a trial's
    error read from a shared storage may hold a terminal's escape sequences)."""
    from autotune.storage import scrub_password
    from autotune.views.text import printable

    return printable(scrub_password(str(error)))


def main() -> None:
    """Console entry point: the command's exit status; user errors as one line, library output to the debug log."""
    import optuna

    from autotune.runner import library_output_to_debug_log

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with library_output_to_debug_log():
        sys.exit(_run())


def _run() -> int:
    """The command the command line names, run; its exit status."""
    import optuna

    try:
        # Not standalone: Click's parse errors come here instead of its usage box; an Exit's status comes back.
        status = cli.app(standalone_mode=False)
    except click_exception() as exc:
        if type(exc).__name__ != "NoArgsIsHelpError":  # `autotune` alone prints the help, then exits 2
            _print_error(usage_error(exc, sys.argv[1:], cli.app))
        return int(getattr(exc, "exit_code", 2))
    except typer.Abort:
        cli.err_console.print("Aborted!")
        return 1
    except AutotuneError as exc:
        _print_error(str(exc))
        return 2
    except optuna.exceptions.StorageInternalError as exc:
        # A full disk or a lost database at ask, at the start of a trial: nothing measured is at stake
        # (a failed tell keeps its result, see study._record.tell_or_keep).
        from autotune.storage import storage_failure

        _print_error(
            f"the study storage failed ({storage_failure(exc)}); free space or fix the database, "
            f"then run the same command again"
        )
        return 2
    return status if isinstance(status, int) else 0


def _print_error(message: str) -> None:
    """The one error line: ``autotune: error:`` and the message through :func:`error_text` (on the CLI's
    stderr console, looked up at each call: a test swaps it)."""
    cli.err_console.print(f"autotune: error: {error_text(message)}", markup=False, highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
