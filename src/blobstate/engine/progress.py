"""blobstate's metrics read back from Spark's query progress.

Spark keeps a source's metrics as a map of strings (``SourceProgress.metrics``), so the driver publishes
each metric of :meth:`BatchReport.progress_metrics` as JSON text (``ticks.py``): ``"3"``, ``"true"``,
``'{"0": {...}}'``. :func:`progress_metrics` finds the ``blobstate`` source in one progress and turns its
values back into numbers, booleans and objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from blobstate.errors import ConfigurationError

SOURCE_DESCRIPTION = "blobstate"
"""The description of blobstate's source in Spark's progress (``java/TicksSource.java``)."""


class ProgressFormatError(ConfigurationError, ValueError):
    """A query progress that cannot be read as one: not a mapping or JSON object with ``sources``."""


def progress_metrics(progress: Mapping[str, Any] | str) -> dict[str, Any]:
    """The metrics blobstate reported for the batch of ``progress``, with their JSON values parsed.

    ``progress`` is one progress of a query: ``query.lastProgress``, an entry of
    ``query.recentProgress``, a ``StreamingQueryListener``'s ``event.progress``, or the progress's JSON
    text (``progress.json``). The result holds the keys of the ``blobstate`` source's metrics (``batchId``,
    ``inputRows``, ``loadRules``, ``standby``, ``partitions``, ...); it is empty when the progress has no
    blobstate source (another query) or when no blobstate batch has reported yet. A value that is not
    JSON is kept as the string Spark holds.
    """
    if isinstance(progress, str):
        try:
            progress = json.loads(progress)
        except ValueError as error:
            raise ProgressFormatError(f"query progress is not JSON: {error}") from None
    if not isinstance(progress, Mapping) or not isinstance(progress.get("sources"), list | tuple):
        raise ProgressFormatError(
            f"query progress {type(progress).__name__} has no 'sources' list: pass query.lastProgress,"
            " an entry of query.recentProgress or a listener event's progress"
        )
    for source in progress["sources"]:
        if isinstance(source, Mapping) and source.get("description") == SOURCE_DESCRIPTION:
            return {str(k): _value(v) for k, v in (source.get("metrics") or {}).items()}
    return {}


def _value(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text
