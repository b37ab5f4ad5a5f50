"""Options and URLs of the Azure blob store: names, defaults, parsing and checks (no Azure SDK here).

URLs: ``az://container/prefix``, ``az://container@account.blob.core.windows.net/prefix`` and the
Hadoop forms ``abfs[s]://container@account.dfs.core.windows.net/prefix`` (the store talks to the Blob
endpoint of the same account, ``account.blob.<suffix>``). Options are keywords of
``open_blob_store(url, **options)`` or query parameters of the URL; secrets (``account_key``,
``sas_token``, ``connection_string``) are refused in the URL, where they would end up in logs and in
checkpoint paths: give them as keywords or through the standard environment variables.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from blobstate.blobstore.base import DEFAULT_IO_THREADS
from blobstate.blobstore.names import validate_blob_name
from blobstate.blobstore.redact import redact
from blobstate.blobstore.url_query import split_url_query
from blobstate.errors import BlobStoreError

SCHEMES = ("az", "abfs", "abfss")
SECRET_OPTIONS = frozenset({"account_key", "sas_token", "connection_string"})


class AzureOptionError(BlobStoreError, ValueError):
    """An Azure option or URL that is malformed, unknown or out of range; the message names it."""


@dataclass(frozen=True)
class AzureSettings:
    """The resolved options of one Azure blob store (defaults filled in, every value checked)."""

    endpoint_url: str | None = None
    """The Blob endpoint, e.g. azurite's ``http://127.0.0.1:10000/devstoreaccount1``; else
    ``BLOBSTATE_AZURE_ENDPOINT``, else the connection string's, else ``https://<account>.blob.core.windows.net``."""
    account_name: str | None = None
    """The storage account; else the URL's host, ``AZURE_STORAGE_ACCOUNT_NAME`` or the connection string's."""
    account_key: str | None = None
    """A shared key of the account (else ``AZURE_STORAGE_ACCOUNT_KEY``)."""
    sas_token: str | None = None
    """A shared access signature (else ``AZURE_STORAGE_SAS_TOKEN``)."""
    connection_string: str | None = None
    """A storage connection string (else ``AZURE_STORAGE_CONNECTION_STRING``)."""
    connect_timeout: float = 5.0
    """Seconds to wait for a TCP (and TLS) connection."""
    read_timeout: float = 30.0
    """Seconds to wait for any bytes of an answer."""
    max_attempts: int = 4
    """Tries per operation (1 = no retries) for throttling, 5xx answers, timeouts and lost connections."""
    backoff_seconds: float = 0.2
    """Pause before the first retry; it doubles for each further retry (with +-50% jitter)."""
    io_threads: int = DEFAULT_IO_THREADS
    """Size of the store's I/O pool (parallel requests of bulk work)."""
    max_single_put_size: int = 64 * 1024 * 1024
    """Objects up to this size are written in one request; larger ones in parallel blocks."""
    list_page_size: int = 5000
    """Names per listing request (1 to 5000)."""

    @classmethod
    def resolve(cls, url: str, options: Mapping[str, Any]) -> tuple[str, AzureSettings]:
        """``(the URL without its query, settings)`` from the URL's query merged with ``options``."""
        location, from_url = split_azure_url(url)
        secrets = sorted(SECRET_OPTIONS & set(from_url))
        if secrets:
            raise AzureOptionError(
                f"Azure URL {redact(location)!r} carries the secret option(s) {', '.join(secrets)} in its"
                " query: give them as keywords of open_blob_store or as AZURE_STORAGE_* environment variables"
            )
        merged = parse_azure_options(from_url, f"the query of {redact(location)!r}")
        given = parse_azure_options(options, "the options")
        for name in sorted(set(merged) & set(given)):
            if merged[name] != given[name]:
                raise AzureOptionError(
                    redact(
                        f"Azure option {name} is {merged[name]!r} in the URL {location!r} but"
                        f" {given[name]!r} as an option: give it once"
                    )
                )
        merged.update(given)
        return location, cls(**merged)


_FIELDS = {f.name: f for f in dataclasses.fields(AzureSettings)}
AZURE_OPTION_NAMES: tuple[str, ...] = tuple(_FIELDS)
"""Every Azure option name, in the order of :class:`AzureSettings`."""

_LIMITS: dict[str, tuple[float, float | None]] = {
    "connect_timeout": (0.001, None),
    "read_timeout": (0.001, None),
    "max_attempts": (1, 100),
    "backoff_seconds": (0, 60),
    "io_threads": (1, 1024),
    "max_single_put_size": (1, 5000 * 1024 * 1024),
    "list_page_size": (1, 5000),
}


def parse_azure_options(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Convert and check Azure options (text or typed values); ``source`` says where they came from."""
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise AzureOptionError(
            f"unknown Azure option(s) in {source}: {', '.join(unknown)}"
            f" (known: {', '.join(AZURE_OPTION_NAMES)})"
        )
    return {name: _convert(name, value, source) for name, value in raw.items()}


def _convert(name: str, value: Any, source: str) -> Any:
    kind = str(_FIELDS[name].type)
    try:
        if kind.startswith("str"):
            if not isinstance(value, str) or not value:
                raise ValueError(
                    "expected a non-empty string, got"
                    f" {'<secret>' if name in SECRET_OPTIONS else repr(value)}"
                )
            if name == "endpoint_url" and urlsplit(value).scheme not in ("http", "https"):
                raise ValueError(f"expected an http:// or https:// URL, got {redact(value)!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"expected a number, got {value!r}")
        number: float = int(value) if kind == "int" else float(value)
        if not math.isfinite(number):
            raise ValueError(f"expected a finite number, got {value!r}")
        low, high = _LIMITS[name]
        if number < low or (high is not None and number > high):
            raise ValueError(
                f"must be between {low:g} and {high:g}, got {value!r}"
                if high is not None
                else f"must be at least {low:g}, got {value!r}"
            )
        return number
    except ValueError as error:
        raise AzureOptionError(f"Azure option {name} in {source}: {error}") from None


def split_azure_url(url: str) -> tuple[str, dict[str, str]]:
    """``(location, {option: text})`` of an Azure URL that may carry options as its query."""
    return split_url_query(url, backend="Azure", error=AzureOptionError)


def azure_url_with_options(url: str, options: Mapping[str, Any]) -> str:
    """``url`` with the (non-secret) ``options`` added as query parameters, checked as the store would."""
    location, settings = AzureSettings.resolve(url, options)
    defaults = AzureSettings()
    given = {
        f: getattr(settings, f) for f in AZURE_OPTION_NAMES if getattr(settings, f) != getattr(defaults, f)
    }
    secrets = sorted(SECRET_OPTIONS & set(given))
    if secrets:
        raise AzureOptionError(
            f"Azure option(s) {', '.join(secrets)} are secrets and cannot travel with the checkpoint URL:"
            " set AZURE_STORAGE_* environment variables on the driver and executors instead"
        )
    if not given:
        return location
    return f"{location}?{urlencode({k: str(v) for k, v in given.items()}, quote_via=quote)}"


@dataclass(frozen=True)
class AzureLocation:
    """Where an Azure URL points: container, key prefix ('' or ending in '/') and, if named, the account."""

    container: str
    prefix: str
    account: str | None
    """The account named by the URL's host (``container@account.blob.core.windows.net``), else None."""
    blob_host: str | None
    """The account's Blob endpoint host named by the URL (``dfs`` turned into ``blob``), else None."""


def parse_azure_url(url: str) -> AzureLocation:
    """Container, prefix and account of ``az://container/prefix`` or ``abfs[s]://container@host/prefix``."""
    location = split_azure_url(url)[0]
    parsed = urlsplit(location)
    shown = redact(url)
    expected = "expected az://container/prefix or abfss://container@account.dfs.core.windows.net/prefix"
    if parsed.scheme not in SCHEMES or not parsed.netloc:
        raise AzureOptionError(f"not an Azure URL {shown!r}: {expected}")
    container, at, host = parsed.netloc.partition("@")
    if parsed.scheme != "az" and not at:
        raise AzureOptionError(f"{parsed.scheme}:// URL {shown!r} names no account: {expected}")
    if not _valid_container(container):
        named = f" {container!r}" if redact(location) == location else ""  # not user:password@
        raise AzureOptionError(
            f"invalid container name{named} in {shown!r}: 3 to 63 lowercase letters, digits and"
            " single hyphens, starting and ending with a letter or digit"
        )
    account, blob_host = None, None
    if at:
        labels = host.lower().split(".")
        if len(labels) < 2 or not labels[0]:
            raise AzureOptionError(f"invalid account host {host!r} in {shown!r}: {expected}")
        account = labels[0]
        if labels[1] == "dfs":
            labels[1] = "blob"
        blob_host = ".".join(labels)
    prefix = parsed.path.strip("/")
    if prefix:
        try:
            validate_blob_name(prefix)
        except ValueError as error:
            raise AzureOptionError(f"invalid prefix in Azure URL {shown!r}: {redact(str(error))}") from None
        prefix += "/"
    return AzureLocation(container, prefix, account, blob_host)


def _valid_container(name: str) -> bool:
    if not 3 <= len(name) <= 63 or "--" in name or name[0] == "-" or name[-1] == "-":
        return False
    return all(c.isdigit() or ("a" <= c <= "z") or c == "-" for c in name) or name == "$root"


def parse_connection_string(text: str) -> dict[str, str]:
    """The ``Key=Value`` pairs of a storage connection string (values may contain ``=``)."""
    pairs: dict[str, str] = {}
    for part in text.strip().strip(";").split(";"):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise AzureOptionError(
                "malformed Azure storage connection string: expected Key=Value pairs separated by ';'"
                " (AccountName=...;AccountKey=...;BlobEndpoint=...)"
            )
        pairs[key.strip()] = value.strip()
    return pairs


def hadoop_url(url: str) -> str | None:
    """The same location as Hadoop's ABFS driver names it (``abfss://container@account.dfs.../prefix``).

    For Spark's own checkpoint (offsets) beside an Azure store, which Spark writes through Hadoop. None for
    ``az://container/prefix``, which names no account: such a query gives ``spark_checkpoint`` itself.
    """
    location = parse_azure_url(url)
    if location.account is None or location.blob_host is None:
        return None
    labels = location.blob_host.split(".")
    labels[1] = "dfs" if labels[1] == "blob" else labels[1]
    path = f"/{location.prefix.rstrip('/')}" if location.prefix else ""
    return f"abfss://{location.container}@{'.'.join(labels)}{path}"


AZURE_CONF_PREFIX = "spark.blobstate.azure."
"""Spark conf keys ``spark.blobstate.azure.<option>`` set one Azure option of a query's checkpoint."""


def azure_options_from_spark_conf(spark_conf: Mapping[str, str]) -> dict[str, Any]:
    """The Azure options set as Spark conf ``spark.blobstate.azure.<option>``, converted and checked.

    Secrets are refused here too: Spark conf is shown in the Spark UI and event logs.
    """
    raw = {k[len(AZURE_CONF_PREFIX) :]: v for k, v in spark_conf.items() if k.startswith(AZURE_CONF_PREFIX)}
    secrets = sorted(SECRET_OPTIONS & set(raw))
    if secrets:
        raise AzureOptionError(
            f"Spark conf {', '.join(AZURE_CONF_PREFIX + s for s in secrets)} would show a secret in the Spark"
            " UI and event logs: set AZURE_STORAGE_* environment variables on the driver and executors"
            " (spark.executorEnv.*) or use an identity (DefaultAzureCredential)"
        )
    return parse_azure_options(raw, f"Spark conf {AZURE_CONF_PREFIX}<option>")
