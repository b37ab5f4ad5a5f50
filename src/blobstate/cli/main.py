"""The ``blobstate`` command line: demo, backup, restore, inspect, lineage, verify, gc, accept-loss,
rescale, report.

Errors are one ``error: ...`` line on stderr (exit status 1) that names the object at fault; the
traceback is shown only with ``--debug`` (anywhere on the command line). Both, and click's usage errors
(which quote arguments), go through :func:`blobstate.blobstore.redact.redact` last, so no credential a
URL or an endpoint carries is shown.
"""

from __future__ import annotations

import io
import sys
import traceback
from collections.abc import Sequence

import typer

from blobstate.blobstore.redact import redact
from blobstate.errors import BlobstateError

app = typer.Typer(
    help="blobstate: RocksDB state for PySpark streaming, checkpointed incrementally to a blob store.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # typer's rich help shows every flag as "--json <bool>", as if it took a value; the plain help
    # shows flags as flags.
    rich_markup_mode=None,
)

DEBUG_FLAG = "--debug"


def version_line() -> str:
    """``blobstate <version>`` (:data:`blobstate.__version__`, the release of the code that runs), then
    one line per stored format this release writes and reads (:data:`blobstate.formats.STORED_FORMATS`,
    the README's table). When the installed distribution's metadata names another release (an editable
    install made before the version changed), the first line says so: the executors' check compares that
    metadata."""
    from importlib.metadata import PackageNotFoundError, version

    from blobstate import __version__
    from blobstate.formats import plain_lines

    release = __version__
    try:
        installed = version("blobstate")
    except PackageNotFoundError:
        installed = None
    if installed is not None and installed != __version__:
        release += f" (installed metadata says {installed}: reinstall blobstate)"
    formats = "\n".join(f"  {line}" for line in plain_lines())
    return f"blobstate {release}\nstored formats this release writes and reads:\n{formats}"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, DEBUG_FLAG, help="On an error, show the full traceback."),
    show_version: bool = typer.Option(
        False,
        "--version",
        help="Print blobstate's version and the checkpoint formats it writes and reads, then exit.",
        callback=_print_version,
        is_eager=True,
    ),
) -> None:
    """blobstate: RocksDB state for PySpark streaming, checkpointed incrementally to a blob store."""


def _register() -> None:
    from blobstate.cli import (
        backup_cmds,
        connect_cmd,
        demo_cmd,
        gc_cmd,
        lineage_cmds,
        loss_cmd,
        report_cmd,
        rescale_cmd,
    )

    backup_cmds.register(app)
    gc_cmd.register(app)
    loss_cmd.register(app)
    rescale_cmd.register(app)
    lineage_cmds.register(app)
    report_cmd.register(app)
    demo_cmd.register(app)
    connect_cmd.register(app)


_register()


def describe_error(error: BaseException) -> str:
    """One line for an error: blobstate's own messages as they are, anything else with its type; any
    secret a URL in it carries masked (the last line of defence: messages are redacted where made)."""
    if isinstance(error, BlobstateError):
        text = str(error)
    elif isinstance(error, OSError) and error.filename is not None:
        text = f"{error.strerror or type(error).__name__}: {error.filename}"
    else:
        text = f"{type(error).__name__}: {error}"
    return redact(" ".join(text.split())) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command line (the ``blobstate`` console script); exits with the command's status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in args
    args = [a for a in args if a != DEBUG_FLAG]
    try:
        status = app(args=args, prog_name="blobstate", standalone_mode=False)
    except SystemExit:
        raise
    except typer.TyperException as error:  # a usage error, whose message may quote an argument (a URL)
        shown = io.StringIO()
        show = getattr(error, "show", None)  # click's usage line, hint and message
        if show is not None:
            show(file=shown)
        else:
            shown.write(f"Error: {error.format_message()}\n")
        typer.echo(redact(shown.getvalue()), err=True, nl=False)
        sys.exit(error.exit_code)
    except typer.Abort:  # interrupted while the command line was parsed or ran
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
    except Exception as error:
        if debug:
            typer.echo(redact(traceback.format_exc()).rstrip("\n"), err=True)
        hint = "" if debug else f" (run with {DEBUG_FLAG} for the traceback)"
        typer.echo(f"error: {describe_error(error)}{hint}", err=True)
        sys.exit(1)
    sys.exit(status if isinstance(status, int) else 0)


if __name__ == "__main__":
    main()
