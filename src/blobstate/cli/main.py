"""The ``blobstate`` command line: demo, backup, restore, inspect, lineage, verify, gc."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="blobstate: RocksDB state for PySpark streaming, checkpointed incrementally to a blob store.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    from blobstate.cli import backup_cmds, demo_cmd, lineage_cmds

    backup_cmds.register(app)
    lineage_cmds.register(app)
    demo_cmd.register(app)


_register()

if __name__ == "__main__":
    app()
