"""Blob store URL schemes: one registry of what each kind of location means to blobstate.

A location's URL scheme (``s3``, ``az`` ...; none for a plain path) picks one :class:`Scheme`, which
opens the store, splits off the options a URL may carry as its query, adds options to a URL (so they
travel with it to Spark's tasks) and names the same location as Spark writes it through Hadoop
(``s3a://``, ``abfss://``). Code outside this package asks the registry (:func:`scheme_of` and the
functions below) instead of testing URL prefixes; a new backend is one more :class:`Scheme` in
:data:`SCHEMES`. A backend's module is imported only when one of its stores is opened, so a missing
optional dependency fails only for its own URLs, naming the extra to install.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from blobstate.blobstore.base import BlobStore
from blobstate.blobstore.redact import redact
from blobstate.errors import BlobStoreError, ConfigurationError


class BackendNotInstalledError(ConfigurationError, ImportError):
    """The blob store backend of a URL needs an optional dependency that is not installed."""


class UnsupportedSchemeError(BlobStoreError, ValueError):
    """A URL whose scheme no blob store backend serves."""


class NoHadoopLocationError(BlobStoreError, ValueError):
    """A location Spark (through Hadoop) cannot name, so Spark cannot write files beside it."""


def _no_options(url: str) -> tuple[str, dict[str, str]]:
    return url, {}


@dataclass(frozen=True)
class Scheme:
    """One kind of blob store location: its URL schemes and what blobstate asks of such a location."""

    label: str
    """The backend's name in messages (``S3``, ``Azure`` ...)."""
    url_schemes: tuple[str, ...]
    """The URL schemes it serves (``""`` for a plain path without ``://``)."""
    forms: str
    """How the command line's help names its locations."""
    store_class: str
    """``module:class`` of its :class:`BlobStore`, imported when a store is opened."""
    extra: str | None = None
    """The optional dependency group (``pip install 'blobstate[<extra>]'``) its store needs, if any."""
    option_family: str | None = None
    """The options a URL of this scheme carries (``s3``, ``azure``), None if it takes none."""
    canonical_scheme: str | None = None
    """The scheme its store is opened with, for an alias (``s3a://`` opens ``s3://``); None: as given."""
    split_options: Callable[[str], tuple[str, dict[str, str]]] = _no_options
    """``(url without its query, {option: text})``, checked (never echoing a secret)."""
    add_options: Callable[[str, Mapping[str, Any]], str] | None = None
    """The URL with options added as its query (checked; the URL's own must agree); None: takes none."""
    hadoop: Callable[[str], str] | None = None
    """The location as Hadoop names it; None: Hadoop has no name for this backend's locations."""

    def canonical(self, url: str) -> str:
        """``url`` with an alias scheme replaced by the one its store is opened with."""
        if self.canonical_scheme is None or "://" not in url:
            return url
        return f"{self.canonical_scheme}://{url.split('://', 1)[1]}"

    def open(self, url: str, **options: Any) -> BlobStore:
        """Open the store at ``url`` with ``options`` (keywords of the backend's store)."""
        module_name, _, class_name = self.store_class.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if self.extra is None or error.name == module_name:
                raise
            raise BackendNotInstalledError(
                f"{redact(url.partition('?')[0])} is an {self.label} checkpoint, which needs {error.name}"
                f" (not installed): pip install 'blobstate[{self.extra}]'"
            ) from error
        store: BlobStore = getattr(module, class_name)(self.canonical(url), **options)
        return store

    def location(self, url: str) -> str:
        """``url`` without the options its query carries and without a trailing ``/``; a location of a
        backend that takes no options is returned as given."""
        if self.option_family is None:
            return url
        return self.split_options(url)[0].rstrip("/")

    def url_with_options(self, url: str, options: Mapping[str, Any]) -> str:
        """``url`` with ``options`` added as its query, checked as the store would check them."""
        if self.add_options is not None:
            return self.add_options(url, options)
        if options:
            raise UnsupportedSchemeError(
                f"{self.label} location {redact(url)!r} takes no options, got {', '.join(sorted(options))}"
            )
        return url

    def hadoop_location(self, url: str) -> str:
        """The same location as Spark names it through Hadoop (for files Spark writes beside it)."""
        if self.hadoop is None:
            raise NoHadoopLocationError(
                f"{redact(url)} is a {self.label} location, which Spark cannot write to"
            )
        return self.hadoop(url)

    def normalize(self, url: str) -> str:
        """One spelling of the location: a local path made absolute, else without a trailing ``/``."""
        return url.rstrip("/")


@dataclass(frozen=True)
class LocalScheme(Scheme):
    """A local directory: ``file://`` URLs and plain paths."""

    def normalize(self, url: str) -> str:
        """The absolute path of a plain path or a ``file://`` URL (relative to the working directory), read
        as the local store reads it (a URL naming another host is refused, never taken for a path)."""
        from blobstate.blobstore.local import local_path

        return os.path.abspath(local_path(url))

    def hadoop_location(self, url: str) -> str:
        """The absolute path: Spark writes local files by path."""
        return self.normalize(url)


def _s3_split(url: str) -> tuple[str, dict[str, str]]:
    from blobstate.blobstore.s3_options import split_s3_url

    return split_s3_url(url)


def _s3_add(url: str, options: Mapping[str, Any]) -> str:
    from blobstate.blobstore.s3_options import s3_url_with_options

    return s3_url_with_options(url, options)


def _s3a(url: str) -> str:
    return "s3a://" + _s3_split(url)[0].split("://", 1)[1].rstrip("/")


def _azure_split(url: str) -> tuple[str, dict[str, str]]:
    from blobstate.blobstore.azure_options import split_azure_url

    return split_azure_url(url)


def _azure_add(url: str, options: Mapping[str, Any]) -> str:
    from blobstate.blobstore.azure_options import azure_url_with_options

    return azure_url_with_options(url, options)


def _abfss(url: str) -> str:
    from blobstate.blobstore.azure_options import hadoop_url

    location = hadoop_url(url)
    if location is None:
        raise NoHadoopLocationError(
            f"{redact(url.partition('?')[0])} names no storage account, so Spark (which writes Azure through"
            " abfss://container@account.dfs.core.windows.net/...) cannot name it"
        )
    return location


LOCAL = LocalScheme(
    label="local directory",
    url_schemes=("file", ""),
    forms="a local path or file:// URL",
    store_class="blobstate.blobstore.local:LocalBlobStore",
)
MEMORY = Scheme(
    label="memory",
    url_schemes=("memory",),
    forms="memory:// (tests)",
    store_class="blobstate.blobstore.memory:MemoryBlobStore",
)
S3 = Scheme(
    label="S3",
    url_schemes=("s3", "s3a"),
    forms="s3://bucket/prefix (or s3a://)",
    store_class="blobstate.blobstore.s3:S3BlobStore",
    extra="s3",
    option_family="s3",
    canonical_scheme="s3",
    split_options=_s3_split,
    add_options=_s3_add,
    hadoop=_s3a,
)
AZURE = Scheme(
    label="Azure",
    url_schemes=("az", "abfs", "abfss"),
    forms="az://container/prefix, abfss://container@account.dfs.core.windows.net/prefix (or abfs://)",
    store_class="blobstate.blobstore.azure:AzureBlobStore",
    extra="azure",
    option_family="azure",
    split_options=_azure_split,
    add_options=_azure_add,
    hadoop=_abfss,
)

SCHEMES: tuple[Scheme, ...] = (LOCAL, S3, AZURE, MEMORY)
"""Every backend, in the order the command line's help lists them."""

_BY_URL_SCHEME = {name: scheme for scheme in SCHEMES for name in scheme.url_schemes}


def scheme_of(url: str) -> Scheme:
    """The :class:`Scheme` of ``url`` (a plain path without ``://`` is a local directory)."""
    name = url.split("://", 1)[0] if "://" in url else ""
    try:
        return _BY_URL_SCHEME[name]
    except KeyError:
        known = ", ".join(f"{n}://" for s in SCHEMES for n in s.url_schemes if n)
        raise UnsupportedSchemeError(
            f"unsupported blob store URL {redact(url.partition('?')[0])!r}: use a plain path or {known}"
        ) from None


def url_forms() -> str:
    """The forms of a location every command accepts, for the command line's help."""
    forms = [scheme.forms for scheme in SCHEMES]
    return ", ".join(forms[:-1]) + ", or " + forms[-1]


def normalize_location(url: str) -> str:
    """One spelling of a location: a plain path or ``file://`` URL made absolute, else no trailing ``/``."""
    return scheme_of(url).normalize(url)


def location_without_options(url: str) -> str:
    """``url`` without the options its query carries (the location as messages and paths name it)."""
    return scheme_of(url).location(url)


def hadoop_location(url: str) -> str:
    """The location as Spark names it through Hadoop (``s3a://``, ``abfss://``, a local path).

    :class:`NoHadoopLocationError` if Spark has no name for it (``memory://``, an ``az://`` URL without
    an account)."""
    return scheme_of(url).hadoop_location(url)


__all__ = [
    "SCHEMES",
    "BackendNotInstalledError",
    "NoHadoopLocationError",
    "Scheme",
    "UnsupportedSchemeError",
    "hadoop_location",
    "location_without_options",
    "normalize_location",
    "scheme_of",
    "url_forms",
]
