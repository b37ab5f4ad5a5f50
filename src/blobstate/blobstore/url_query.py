"""Options carried as the query of a blob store URL (``s3://b/p?read_timeout=30``, ``az://c/p?...``):
split off and checked the same way for every backend, with secrets kept out of messages
(:func:`blobstate.blobstore.redact.redact`)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from blobstate.blobstore.redact import redact


def split_url_query(url: str, *, backend: str, error: type[Exception]) -> tuple[str, dict[str, str]]:
    """``(url without its query, {option: text})``; ``error`` (naming the ``backend`` and the URL with
    its secrets redacted) for a fragment, a query that is not name=value pairs, or an option given twice."""
    parts = urlsplit(url)
    if parts.fragment:
        raise error(f"{backend} URL {redact(url)!r} must not have a fragment")
    if not parts.query:
        return url, {}
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise error(
            f"{backend} URL {redact(url)!r}: the query must be name=value pairs joined by &"
        ) from None
    options: dict[str, str] = {}
    for name, value in pairs:
        if name in options:
            raise error(f"{backend} URL {redact(url)!r} gives option {name} twice")
        options[name] = value
    return url.split("?", 1)[0], options
