"""Options of the S3 blob store: names, defaults, parsing and validation (no boto3 here).

The same options can be given as keyword options of ``open_blob_store(url, **options)``, as query
parameters of the URL (``s3://bucket/prefix?connect_timeout=5&read_timeout=30&max_attempts=4``) and, for
queries, as Spark conf ``spark.blobstate.s3.<option>``. Values given as text are converted; every value is
checked, and unknown names are an error naming them.

Credentials: ``profile`` (a profile of ``~/.aws/config`` / ``~/.aws/credentials``) or
``access_key_id`` + ``secret_access_key`` (+ ``session_token``); given neither, boto3's standard chain
applies (environment keys, ``AWS_PROFILE``, the config files, container and instance roles). The values of
:data:`SECRET_OPTIONS` never appear in an error message or a ``repr``.

Time budget: with the defaults an endpoint that accepts connections and never answers fails an operation
after at most ``max_attempts * read_timeout + backoff`` = 4 * 10 s + 2.1 s = 42.1 s; the worst case of a
one-request operation (each attempt's connection set up just inside ``connect_timeout``, then no answer
for ``read_timeout``) is :attr:`S3Settings.worst_case_seconds` = 4 * (5 s + 10 s) + 2.1 s = 62.1 s.
Operations made of several requests (``delete``: HEAD then DELETE; multipart uploads) can spend the
per-request timeouts once per request of an attempt.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from blobstate.blobstore.base import DEFAULT_IO_THREADS
from blobstate.blobstore.redact import redact
from blobstate.blobstore.url_query import split_url_query
from blobstate.errors import BlobStoreError

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB
"""S3 refuses multipart parts smaller than this (all but the last)."""


class S3OptionError(BlobStoreError, ValueError):
    """An S3 option with an unknown name or a value out of range; the message names it."""


@dataclass(frozen=True)
class S3Settings:
    """The resolved options of one S3 blob store (defaults filled in, every value checked)."""

    endpoint_url: str | None = None
    """A non-AWS endpoint such as ``http://127.0.0.1:9000``; else ``BLOBSTATE_S3_ENDPOINT``, else AWS."""
    region: str | None = None
    """The signing region; else ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else us-east-1."""
    profile: str | None = None
    """A named profile of the AWS config files; else ``AWS_PROFILE``, else boto3's default chain."""
    access_key_id: str | None = None
    """An access key id, with ``secret_access_key``; they win over the environment and profiles."""
    secret_access_key: str | None = field(default=None, repr=False)
    """The secret of ``access_key_id`` (never shown in messages)."""
    session_token: str | None = field(default=None, repr=False)
    """The session token of temporary keys (never shown in messages)."""
    addressing_style: str | None = None
    """``auto``, ``virtual`` (``bucket.host/key``) or ``path`` (``host/bucket/key``); default: ``path``
    with a custom endpoint (MinIO and most S3-protocol servers), else ``auto``."""
    path_style: bool | None = None
    """``true`` is ``addressing_style=path`` (as S3A's ``fs.s3a.path.style.access``), ``false`` virtual."""
    connect_timeout: float = 5.0
    """Seconds to wait for a TCP (and TLS) connection to the endpoint."""
    read_timeout: float = 10.0
    """Seconds to wait for any bytes of an answer (per socket read, not for a whole transfer)."""
    max_attempts: int = 4
    """Tries per operation (1 = no retries) for throttling, 5xx answers, timeouts and lost connections."""
    backoff_seconds: float = 0.2
    """Pause before the first retry; it doubles for each further retry (with +-50% jitter)."""
    io_threads: int = DEFAULT_IO_THREADS
    """Size of the store's I/O pool (parallel requests of bulk work)."""
    multipart_threshold: int = 64 * MiB
    """Files of this many bytes or more are uploaded in parallel parts."""
    multipart_chunksize: int = 16 * MiB
    """Size of one part of a multipart upload (at least 5 MiB)."""
    list_page_size: int = 1000
    """Keys per listing request (1 to 1000)."""

    def __post_init__(self) -> None:
        """Check the options that only make sense together."""
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise S3OptionError(
                "S3 options access_key_id and secret_access_key must be given together (got only "
                + ("access_key_id" if self.access_key_id is not None else "secret_access_key")
                + ")"
            )
        if self.session_token is not None and self.access_key_id is None:
            raise S3OptionError("S3 option session_token needs access_key_id and secret_access_key")
        if self.profile is not None and self.access_key_id is not None:
            raise S3OptionError(
                f"S3 options profile ({self.profile!r}) and access_key_id are both given: give one of them"
            )
        if self.addressing_style is not None and self.path_style is not None:
            implied = "path" if self.path_style else "virtual"
            if implied != self.addressing_style:
                raise S3OptionError(
                    f"S3 options path_style={str(self.path_style).lower()} and addressing_style="
                    f"{self.addressing_style} disagree: give one of them"
                )

    def resolved_addressing_style(self, custom_endpoint: bool) -> str:
        """The addressing style to use: the options', else ``path`` for a custom endpoint, else ``auto``."""
        if self.addressing_style is not None:
            return self.addressing_style
        if self.path_style is not None:
            return "path" if self.path_style else "virtual"
        return "path" if custom_endpoint else "auto"

    @property
    def credentials_source(self) -> str:
        """How credentials are found, for messages (never the secret itself)."""
        if self.access_key_id is not None:
            return f"access key id {self.access_key_id} (given as an option)"
        if self.profile is not None:
            return f"profile {self.profile!r} (given as an option)"
        return "the AWS environment and config chain"

    @property
    def backoff_total_seconds(self) -> float:
        """The longest total pause between the attempts of one operation (jitter at its +50%)."""
        return 1.5 * self.backoff_seconds * (2.0 ** (self.max_attempts - 1) - 1)

    @property
    def worst_case_seconds(self) -> float:
        """How long one single-request operation can take before it fails on an endpoint that hangs."""
        per_attempt = self.connect_timeout + self.read_timeout
        return self.max_attempts * per_attempt + self.backoff_total_seconds

    @classmethod
    def resolve(cls, url: str, options: Mapping[str, Any]) -> tuple[str, S3Settings]:
        """Split ``url`` into its location and query options, merge them with ``options``, check all.

        Returns ``(the URL without its query, settings)``. An option given both in the URL and as a
        keyword must have the same value in both.
        """
        location, values = _merged(url, options)
        return location, cls(**values)


_FIELDS = {f.name: f for f in dataclasses.fields(S3Settings)}
S3_OPTION_NAMES: tuple[str, ...] = tuple(_FIELDS)
"""Every S3 option name, in the order of :class:`S3Settings`."""

SECRET_OPTIONS: frozenset[str] = frozenset({"secret_access_key", "session_token"})
"""Options whose values are secrets: never echoed in messages (:func:`~blobstate.blobstore.redact.redact`
masks them, and ``access_key_id`` too, in a URL)."""

ADDRESSING_STYLES = ("auto", "virtual", "path")


def parse_s3_options(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Convert and check S3 options (text or typed values); ``source`` says where they came from.

    Unknown names are an error naming them.
    """
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise S3OptionError(
            f"unknown S3 option(s) in {source}: {', '.join(unknown)} (known: {', '.join(S3_OPTION_NAMES)})"
        )
    return {name: _convert(name, value, source) for name, value in raw.items()}


def _convert(name: str, value: Any, source: str) -> Any:
    kind = str(_FIELDS[name].type)
    try:
        if name in SECRET_OPTIONS:
            if not isinstance(value, str) or not value:
                raise ValueError("expected a non-empty string")  # the value itself is never shown
            return value
        if kind.startswith("str"):
            return _text(name, value)
        if kind.startswith("bool"):
            return _boolean(value)
        if kind == "int":
            return _checked(name, _integer(value))
        return _checked(name, _number(value))
    except (TypeError, ValueError) as error:
        raise S3OptionError(f"S3 option {name} in {source}: {error}") from None


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    if name == "endpoint_url":
        check_endpoint(value)
    if name == "addressing_style" and value not in ADDRESSING_STYLES:
        raise ValueError(f"expected one of {', '.join(ADDRESSING_STYLES)}, got {value!r}")
    return value


def check_endpoint(value: str) -> str:
    """``value`` if it is an http(s) endpoint without credentials, else ``ValueError`` (showing it
    redacted). Credentials in an endpoint (``http://user:password@host``) are refused: S3 requests are
    signed with the access keys, and botocore would send the userinfo in the ``Host`` header."""
    if urlsplit(value).scheme not in ("http", "https"):
        raise ValueError(f"expected an http:// or https:// URL, got {redact(value)!r}")
    if redact(value) != value:
        raise ValueError(
            f"{redact(value)!r} carries credentials: give the endpoint as http(s)://host:port and the keys as"
            " access_key_id and secret_access_key (S3 requests are signed with them; botocore would send"
            " user:password@ in the Host header)"
        )
    return value


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"expected true or false, got {value!r}")


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"expected an integer, got {value!r}") from None


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a number of seconds, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number of seconds, got {value!r}")
    return number


_LIMITS: dict[str, tuple[float, float | None]] = {
    "connect_timeout": (0.001, None),
    "read_timeout": (0.001, None),
    "max_attempts": (1, 100),
    "backoff_seconds": (0, 60),
    "io_threads": (1, 1024),
    "multipart_threshold": (1, None),
    "multipart_chunksize": (MIN_PART_SIZE, None),
    "list_page_size": (1, 1000),
}


def _checked(name: str, value: float) -> Any:
    low, high = _LIMITS[name]
    if value < low or (high is not None and value > high):
        bounds = f"at least {_show(low)}" if high is None else f"between {_show(low)} and {_show(high)}"
        raise ValueError(f"must be {bounds}, got {value!r}")
    return value


def _show(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")
"""What botocore takes for a bucket name (S3's own rules are stricter; S3 says which it refuses)."""


def split_s3_url(url: str) -> tuple[str, dict[str, str]]:
    """``(s3://bucket/prefix, {option: text})`` of a URL that may carry options as its query.

    A URL whose bucket is not a bucket name is refused here, before any request; keys written before
    the bucket (``s3://KEY:SECRET@bucket/prefix``, a form Hadoop's S3A no longer reads either) are
    refused without being shown.
    """
    location, options = split_url_query(url, backend="S3", error=S3OptionError)
    bucket = urlsplit(location).netloc
    if "@" in bucket or (":" in bucket and "@" in location):  # a secret may hold a "/"
        raise S3OptionError(
            f"S3 URL {redact(url)!r} carries credentials before the bucket name (s3://KEY:SECRET@bucket):"
            " blobstate does not read keys from there; give access_key_id and secret_access_key as"
            " options (keywords of open_blob_store, the URL's query or Spark conf"
            " spark.blobstate.s3.<option>), a profile, or the AWS environment (AWS_ACCESS_KEY_ID and"
            " AWS_SECRET_ACCESS_KEY, AWS_PROFILE)"
        )
    if bucket and not _BUCKET.fullmatch(bucket):
        raise S3OptionError(
            f"S3 URL {redact(url)!r}: {bucket!r} is not a bucket name (letters, digits, '.', '-', '_')"
        )
    return location, options


def s3_url_with_options(url: str, options: Mapping[str, Any]) -> str:
    """``url`` with ``options`` added as query parameters (checked; the URL's own must agree)."""
    location, merged = _merged(url, options)
    if not merged:
        return location
    return f"{location}?{urlencode({k: str(v) for k, v in merged.items()}, quote_via=quote)}"


def _merged(url: str, options: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    location, from_url = split_s3_url(url)
    merged = parse_s3_options(from_url, f"the query of {redact(url)!r}")
    given = parse_s3_options(options, "the options")
    for name in sorted(set(merged) & set(given)):
        if merged[name] != given[name]:
            if name in SECRET_OPTIONS:
                raise S3OptionError(
                    f"S3 option {name} differs between the URL {redact(location)!r} and the options:"
                    " give it once"
                )
            raise S3OptionError(
                redact(
                    f"S3 option {name} is {merged[name]!r} in the URL {redact(url)!r} but"
                    f" {given[name]!r} as an option: give it once"
                )
            )
    merged.update(given)
    return location, merged
