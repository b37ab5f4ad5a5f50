"""The Azure Blob Storage blob store (``az://container/prefix``, ``abfs[s]://container@account.../prefix``).

Pending objects carry the blob index tag ``blobstate-pending=true`` (set with the write, in the same
request); ``remove_ttl`` drops that tag and keeps any other. Azure expires tagged blobs with a lifecycle
management policy filtering on the tag (:func:`blobstate.blobstore.azure_lifecycle.lifecycle_policy`),
which an account owner installs once: lifecycle policies live in the management plane, which a data-plane
credential cannot change. ``put_if_absent`` is a conditional write (``If-None-Match: *``); a loser gets
409 BlobAlreadyExists or 412 ConditionNotMet and returns False. Throttling, 5xx answers, timeouts and
connection failures become :class:`TransientBlobError`, which the base class retries (the SDK's own
retries are off, the downloader's hidden retry of a body broken off in transit included, but for the
later ranges of an object over 32 MiB). A missing container is :class:`BucketNotFoundError`, never
"object not found".

Credentials, first found wins: the ``connection_string``, ``account_key`` or ``sas_token`` option; then
``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_ACCOUNT_KEY``, ``AZURE_STORAGE_SAS_TOKEN``; else
``DefaultAzureCredential`` (managed identity, workload identity, ``az login``...) when ``azure-identity``
is installed. On accounts with a hierarchical namespace (ADLS Gen2) directory entries are not objects.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import requests.adapters
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    DecodeError,
    DeserializationError,
    HttpResponseError,
    ResourceExistsError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobServiceClient, ContainerClient

from blobstate.blobstore.answers import MalformedAnswerError, body_length
from blobstate.blobstore.azure_lifecycle import lifecycle_policy
from blobstate.blobstore.azure_options import (
    AzureOptionError,
    AzureSettings,
    parse_azure_url,
    parse_connection_string,
)
from blobstate.blobstore.base import (
    DEFAULT_PENDING_TTL_SECONDS,
    BlobNotFoundError,
    BlobStore,
    BucketNotFoundError,
    ExpiryCheck,
    TransientBlobError,
)
from blobstate.blobstore.names import validate_blob_name
from blobstate.blobstore.redact import redact
from blobstate.blobstore.s3_lifecycle import PENDING_TAG_KEY, PENDING_TAG_VALUE
from blobstate.errors import BlobStoreError

ENDPOINT_ENV = "BLOBSTATE_AZURE_ENDPOINT"
"""Environment variable naming the Blob endpoint (used when no ``endpoint_url`` option is given)."""

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""The development storage account's well-known public key (``UseDevelopmentStorage=true``)."""

DEFAULT_LIFECYCLE_DAYS = round(DEFAULT_PENDING_TTL_SECONDS / 86400)
_PENDING_TAGS = {PENDING_TAG_KEY: PENDING_TAG_VALUE}
_TRANSIENT_CODES = frozenset({"ServerBusy", "OperationTimedOut", "InternalError", "TooManyRequests"})
_CREATE_LOST_CODES = frozenset({"BlobAlreadyExists", "ConditionNotMet"})
_CHUNK_CONCURRENCY = 4
_CONTENT_RANGE = re.compile(r"bytes (\d+-\d+|\*)/(\d+|\*)|bytes 0--1/0")
"""A whole Content-Range; ``bytes 0--1/0`` is the empty range of an empty blob (Azurite's answer to a
range read of one)."""
_LATER_RANGE = re.compile(r"bytes=0*[1-9]")


class _BrokenBodyError(TransientBlobError):
    """An answer's body broke off in transit (cut short, reset, timed out) while it streamed in."""


class _GuardedBody:
    """The SDK's stream of one answer's body, raising a break in it as :class:`_BrokenBodyError`.

    The SDK's downloader catches its own errors of a broken body and repeats the request itself (three
    tries, one second apart, whatever the client's retry settings), so every cut body would cost seconds
    and attempts beyond the store's. An error the downloader does not know passes through it, and the
    store's attempts and backoff retry the download instead. Only a download's first request is guarded
    (it holds all of an object up to ``max_single_get_size``, 32 MiB): a later range of a large object
    keeps the SDK's retry, which fetches that 4 MiB range again rather than the whole object.
    """

    def __init__(self, chunks: Any) -> None:
        self._chunks = chunks

    def __getattr__(self, name: str) -> Any:
        # The downloader reads the stream's own attributes (content_length, response, request).
        return getattr(self._chunks, name)

    def __iter__(self) -> _GuardedBody:
        return self

    def __len__(self) -> int:
        return len(self._chunks)

    def __next__(self) -> bytes:
        try:
            chunk: bytes = next(self._chunks)
        except AzureError as error:
            raise _BrokenBodyError(f"answer body broke off: {_first_line(error)}") from error
        return chunk


# The SDK exports RequestsTransport through a module __getattr__, which leaves its type Any.
class _FramedTransport(RequestsTransport):  # type: ignore[misc]
    """The SDK's requests transport, refusing answers that cannot be known to be whole.

    An answer cut inside its headers loses its ``Content-Length`` or ``Transfer-Encoding`` (the server
    puts one in every answer that has a body); the SDK would read the missing body as empty and return
    no tags, no listed blobs or an empty object. Such an answer is malformed, so the request is retried.
    """

    def send(self, request: Any, **kwargs: Any) -> Any:
        """Send ``request``; raise :class:`MalformedAnswerError` for an answer without framing."""
        response = super().send(request, **kwargs)
        status = response.status_code
        bodiless = request.method == "HEAD" or 100 <= status < 200 or status in (204, 304)
        headers = response.headers
        problem = None
        if not bodiless and "Content-Length" not in headers and "Transfer-Encoding" not in headers:
            problem = "without Content-Length or Transfer-Encoding (cut inside its headers)"
        elif "Content-Range" in headers and not _CONTENT_RANGE.fullmatch(headers["Content-Range"]):
            problem = f"with a malformed Content-Range {headers['Content-Range']!r}"
        if problem is not None:
            response.close()
            raise MalformedAnswerError(
                f"malformed answer to {request.method} {redact(request.url.split('?')[0])}: HTTP {status}"
                f" {problem}"
            )
        if not _LATER_RANGE.match(request.headers.get("x-ms-range", "")):
            stream_download = response.stream_download
            response.stream_download = lambda *args, **kwargs: _GuardedBody(stream_download(*args, **kwargs))
        return response


@dataclass(frozen=True)
class AzureCredentials:
    """How a store reaches its account: the Blob endpoint URL, the SDK credential and where it came from."""

    account_url: str
    credential: Any
    source: str
    """Which credential was chosen: ``connection string``, ``account key``, ``SAS token`` or
    ``DefaultAzureCredential`` (with the option or variable it came from)."""


def resolve_credentials(
    url: str, settings: AzureSettings, env: Mapping[str, str] | None = None
) -> AzureCredentials:
    """Choose the endpoint and credential of the store at ``url`` as Azure users expect (see module doc)."""
    env = os.environ if env is None else env
    location = parse_azure_url(url)
    named = location.account or settings.account_name  # a connection string must be for this account
    account = named or env.get("AZURE_STORAGE_ACCOUNT_NAME") or None
    endpoint = settings.endpoint_url or env.get(ENDPOINT_ENV) or None

    def account_url(for_account: str | None) -> str:
        if endpoint:
            return endpoint.rstrip("/")
        if location.blob_host:
            return f"https://{location.blob_host}"
        if for_account:
            return f"https://{for_account}.blob.core.windows.net"
        raise AzureOptionError(
            f"{redact(url)} names no storage account: use az://container@ACCOUNT.blob.core.windows.net/prefix,"
            " the account_name option, AZURE_STORAGE_ACCOUNT_NAME or a connection string"
        )

    if settings.connection_string:
        return _from_connection_string(
            settings.connection_string, "option connection_string", named, endpoint, url
        )
    if settings.account_key:
        return _with_key(account, settings.account_key, "option account_key", account_url, url)
    if settings.sas_token:
        return AzureCredentials(
            account_url(account), settings.sas_token.lstrip("?"), "SAS token (option sas_token)"
        )
    if env.get("AZURE_STORAGE_CONNECTION_STRING"):
        return _from_connection_string(
            env["AZURE_STORAGE_CONNECTION_STRING"], "AZURE_STORAGE_CONNECTION_STRING", named, endpoint, url
        )
    if env.get("AZURE_STORAGE_ACCOUNT_KEY"):
        return _with_key(
            account, env["AZURE_STORAGE_ACCOUNT_KEY"], "AZURE_STORAGE_ACCOUNT_KEY", account_url, url
        )
    if env.get("AZURE_STORAGE_SAS_TOKEN"):
        return AzureCredentials(
            account_url(account),
            env["AZURE_STORAGE_SAS_TOKEN"].lstrip("?"),
            "SAS token (AZURE_STORAGE_SAS_TOKEN)",
        )
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise BlobStoreError(
            f"no Azure credentials for {redact(url)}: set AZURE_STORAGE_CONNECTION_STRING, or"
            " AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN (or the"
            " options connection_string, account_key, sas_token), or pip install azure-identity to use"
            " DefaultAzureCredential (managed identity, az login)"
        ) from None
    return AzureCredentials(account_url(account), DefaultAzureCredential(), "DefaultAzureCredential")


def _with_key(account: str | None, key: str, origin: str, account_url: Any, url: str) -> AzureCredentials:
    if not account:
        raise AzureOptionError(
            f"{redact(url)}: an account key ({origin}) needs the account's name: give it in the URL"
            " (az://container@ACCOUNT.blob.core.windows.net/prefix), as account_name or as"
            " AZURE_STORAGE_ACCOUNT_NAME"
        )
    credential = {"account_name": account, "account_key": key}
    return AzureCredentials(account_url(account), credential, f"account key ({origin})")


def _from_connection_string(
    text: str, origin: str, account: str | None, endpoint: str | None, url: str
) -> AzureCredentials:
    pairs = parse_connection_string(text)
    if pairs.get("UseDevelopmentStorage", "").lower() == "true":
        pairs = {
            "AccountName": AZURITE_ACCOUNT,
            "AccountKey": AZURITE_KEY,
            "BlobEndpoint": pairs.get("DevelopmentStorageProxyUri", "http://127.0.0.1:10000")
            + "/"
            + AZURITE_ACCOUNT,
        }
    named = pairs.get("AccountName")
    if account and named and named != account:
        raise AzureOptionError(
            f"{redact(url)} is in storage account {account!r} but the connection string ({origin}) is for"
            f" {named!r}: use that account's connection string"
        )
    account = account or named
    blob_endpoint = endpoint or pairs.get("BlobEndpoint")
    if not blob_endpoint:
        if not account:
            raise AzureOptionError(
                f"the connection string ({origin}) names neither AccountName nor BlobEndpoint"
            )
        protocol = pairs.get("DefaultEndpointsProtocol", "https")
        blob_endpoint = f"{protocol}://{account}.blob.{pairs.get('EndpointSuffix', 'core.windows.net')}"
    if pairs.get("AccountKey"):
        if not account:
            raise AzureOptionError(f"the connection string ({origin}) has an AccountKey but no AccountName")
        credential: Any = {"account_name": account, "account_key": pairs["AccountKey"]}
    elif pairs.get("SharedAccessSignature"):
        credential = pairs["SharedAccessSignature"].lstrip("?")
    else:
        raise AzureOptionError(
            f"the connection string ({origin}) has neither AccountKey nor SharedAccessSignature"
        )
    return AzureCredentials(blob_endpoint.rstrip("/"), credential, f"connection string ({origin})")


class AzureBlobStore(BlobStore):
    """Objects under ``az://container/prefix``; TTLs as the ``blobstate-pending`` blob index tag."""

    def __init__(self, url: str, **options: Any) -> None:
        """Open the store at ``url``; options as keywords or URL query (see :class:`AzureSettings`)."""
        location, settings = AzureSettings.resolve(url, options)
        super().__init__(
            location,
            io_threads=settings.io_threads,
            max_attempts=settings.max_attempts,
            backoff_seconds=settings.backoff_seconds,
        )
        self.settings = settings
        parsed = parse_azure_url(location)
        self.container, self.prefix = parsed.container, parsed.prefix
        self.credentials = resolve_credentials(location, settings)
        # Pool threads call Azure directly and each may move one object in up to _CHUNK_CONCURRENCY
        # parallel ranges: size the connection pool for that, so connections are reused, not discarded.
        session = requests.Session()
        pool = settings.io_threads * (_CHUNK_CONCURRENCY + 1)
        for scheme in ("http://", "https://"):
            session.mount(scheme, requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=pool))
        transport = _FramedTransport(
            session=session,
            session_owner=True,
            connection_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
        )
        self._service = BlobServiceClient(
            self.credentials.account_url,
            credential=self.credentials.credential,
            transport=transport,
            retry_total=0,  # the base class retries; the SDK's retries would multiply them
            connection_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            max_single_put_size=settings.max_single_put_size,
        )
        self._container: ContainerClient = self._service.get_container_client(self.container)

    @property
    def endpoint(self) -> str:
        """The Blob endpoint this store sends its requests to, as messages show it: credentials in it
        (``user:password@``, a SAS in its query) are masked (:func:`~blobstate.blobstore.redact.redact`)."""
        return redact(self.credentials.account_url)

    # ----------------------------------------------------------------- helpers
    def _blob(self, name: str) -> Any:
        return self._container.get_blob_client(self.prefix + name)

    def _where(self, name: str) -> str:
        return f"blob {self.prefix + name!r} in container {self.container!r} at {self.endpoint}"

    @contextlib.contextmanager
    def _errors(self, name: str) -> Iterator[None]:
        """Translate Azure SDK errors about ``name`` into blob store errors naming container and blob."""
        try:
            yield
        except ClientAuthenticationError as error:  # raised by credentials before any request
            raise self._refused(error, name) from error
        except DecodeError as error:  # a body cut short or garbled in transit (IncompleteReadError)
            raise TransientBlobError(f"{self._where(name)}: {_first_line(error)}") from error
        except MalformedAnswerError as error:
            raise MalformedAnswerError(f"{self._where(name)}: {error}") from error
        except _BrokenBodyError as error:
            raise TransientBlobError(f"{self._where(name)}: {error}") from error
        except BlobStoreError:
            raise
        except (DeserializationError, ValueError, IndexError, KeyError, TypeError, AttributeError) as error:
            # A header cut inside its value ("x-ms-blob-type: BlockBlo", half a date, checksum or
            # range), or a listing page whose body did not parse (the pager then reads None), which
            # the SDK fails on in one of these ways.
            raise MalformedAnswerError(
                f"{self._where(name)}: malformed answer: {_first_line(error)}"
            ) from error
        except HttpResponseError as error:
            if getattr(error, "response", None) is None:  # no answer arrived whole ("ended prematurely")
                raise TransientBlobError(f"{self._where(name)}: {_first_line(error)}") from error
            raise self._http_error(error, name) from error
        except (ServiceRequestError, ServiceResponseError, ConnectionError, TimeoutError) as error:
            raise TransientBlobError(f"{self._where(name)}: {_first_line(error)}") from error

    def _http_error(self, error: HttpResponseError, name: str) -> BlobStoreError:
        code = str(getattr(error, "error_code", None) or "")
        status = int(error.status_code or 0)
        if code == "ContainerNotFound":
            return self._no_container(name)
        if code == "BlobNotFound" or status == 404:
            return BlobNotFoundError(name, self.url)
        if status in (401, 403):
            return self._refused(error, name)
        if code in _TRANSIENT_CODES or status in (408, 429) or status >= 500:
            return TransientBlobError(f"{self._where(name)}: {code or status} {_first_line(error)}")
        return BlobStoreError(
            f"Azure error on {self._where(name)} (store {self.url}): {code or status} {_first_line(error)}"
        )

    def _refused(self, error: BaseException, name: str) -> BlobStoreError:
        code = getattr(error, "error_code", None)
        return BlobStoreError(
            f"Azure refused the credentials ({self.credentials.source}) for {self._where(name)}"
            f" (store {self.url}): {f'{code} ' if code else ''}{_first_line(error)}. Check the account key,"
            " the SAS token (its expiry and permissions: read, add, create, write, delete, list, tag) or the"
            " identity's role (Storage Blob Data Owner, or Contributor plus tag permissions)"
        )

    def _no_container(self, name: str) -> BucketNotFoundError:
        return BucketNotFoundError(
            f"container {self.container!r} does not exist at {self.endpoint} (store {self.url}, while"
            f" accessing {name!r}): check the container and account in the URL and the endpoint, or create"
            " the container"
        )

    def _gave_up(
        self, op: str, name: str, attempts: int, seconds: float, error: TransientBlobError
    ) -> BlobStoreError:
        s = self.settings
        return BlobStoreError(
            f"{op} {name!r} in {self.url} failed after {attempts} attempts in {seconds:.1f} s"
            f" (endpoint {self.endpoint}, container {self.container!r}, blob {self.prefix + name!r}):"
            f" {redact(str(error.__cause__ or error))}. Check that the endpoint is reachable (the"
            f" endpoint_url option or {ENDPOINT_ENV}, network and proxy); to allow more time raise"
            f" connect_timeout, read_timeout or max_attempts (now {s.connect_timeout:g} s,"
            f" {s.read_timeout:g} s, {s.max_attempts})"
        )

    @staticmethod
    def _tags(ttl: float | None) -> dict[str, Any]:
        return {"tags": dict(_PENDING_TAGS)} if ttl is not None else {}

    # ----------------------------------------------------------------- primitives
    def _put_bytes(self, name: str, data: bytes | memoryview, ttl: float | None) -> None:
        body = data.tobytes() if isinstance(data, memoryview) else data
        with self._errors(name):
            self._blob(name).upload_blob(
                body, overwrite=True, max_concurrency=_CHUNK_CONCURRENCY, **self._tags(ttl)
            )

    def _put_file(self, name: str, path: Path, ttl: float | None) -> None:
        # The file is opened afresh on every try, so a retry never resumes a half-read stream.
        size = path.stat().st_size
        with self._errors(name), path.open("rb") as body:
            self._blob(name).upload_blob(
                body, length=size, overwrite=True, max_concurrency=_CHUNK_CONCURRENCY, **self._tags(ttl)
            )

    def _put_if_absent(self, name: str, data: bytes, ttl: float | None) -> bool:
        with self._errors(name):
            try:
                # overwrite=False sends If-None-Match: * (on the Put Blob or the final Put Block List).
                self._blob(name).upload_blob(data, overwrite=False, **self._tags(ttl))
            except (ResourceExistsError, HttpResponseError) as error:
                if isinstance(error, DecodeError) or getattr(error, "response", None) is None:
                    raise  # no whole answer: retried, never read as a lost race
                if (
                    str(getattr(error, "error_code", None) or "") in _CREATE_LOST_CODES
                    or error.status_code == 412
                ):
                    return False
                raise
        return True

    def _get_bytes(self, name: str, limit: int | None = None) -> bytes:
        span = {} if limit is None else {"offset": 0, "length": limit}
        with self._errors(name):
            downloader = self._blob(name).download_blob(max_concurrency=_CHUNK_CONCURRENCY, **span)
            data = bytes(downloader.readall())
            body_length(downloader.size, len(data), f"download of blob {self.prefix + name!r}")
            return data

    def _get_prefix(self, name: str, limit: int) -> bytes:
        try:
            return self._get_bytes(name, limit)
        except BlobStoreError as error:
            cause = error.__cause__
            if isinstance(cause, HttpResponseError) and int(cause.status_code or 0) == 416:
                return self._get_bytes(name)[:limit]  # an empty blob has no byte 0 to start a range at
            raise

    def _get_file(self, name: str, path: Path) -> int:
        part = path.with_name(f"{path.name}.{uuid.uuid4().hex}.part")
        try:
            with self._errors(name):
                downloader = self._blob(name).download_blob(max_concurrency=_CHUNK_CONCURRENCY)
                with part.open("wb") as out:
                    downloader.readinto(out)
                body_length(downloader.size, part.stat().st_size, f"download of blob {self.prefix + name!r}")
            os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)
        return path.stat().st_size

    def _properties(self, name: str) -> Any | None:
        """The blob's properties, None if it does not exist (a missing container is an error)."""
        with self._errors(name):
            try:
                return self._blob(name).get_blob_properties()
            except HttpResponseError as error:
                whole = getattr(error, "response", None) is not None
                if (
                    whole
                    and error.status_code == 404
                    and getattr(error, "error_code", None) != "ContainerNotFound"
                ):
                    return None
                raise

    def _exists(self, name: str) -> bool:
        properties = self._properties(name)
        return properties is not None and not _is_directory(properties)

    def _delete(self, name: str) -> None:
        with self._errors(name):
            self._blob(name).delete_blob()

    def _blob_tags(self, name: str) -> dict[str, str]:
        with self._errors(name):
            tags = self._blob(name).get_blob_tags()
        if not isinstance(tags, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
        ):
            raise MalformedAnswerError(f"{self._where(name)}: malformed answer to the tags request: {tags!r}")
        return dict(tags)

    def _remove_ttl(self, name: str) -> None:
        # Reading the tags first names a missing object clearly and makes a repeated call one request.
        tags = self._blob_tags(name)
        if PENDING_TAG_KEY in tags:
            del tags[PENDING_TAG_KEY]
            with self._errors(name):
                self._blob(name).set_blob_tags(tags)

    def _has_ttl(self, name: str) -> bool:
        return self._blob_tags(name).get(PENDING_TAG_KEY) == PENDING_TAG_VALUE

    def _list(self, prefix: str) -> list[str]:
        return list(self._list_sizes(prefix))

    def holds_nothing(self) -> bool:
        """One listing page of at most one blob under the store's prefix."""
        with self._errors("<all objects>"):
            pages = self._container.list_blobs(name_starts_with=self.prefix, results_per_page=1).by_page()
            return not any(True for _ in next(iter(pages), []))

    def _list_sizes(self, prefix: str) -> dict[str, int]:
        sizes: dict[str, int] = {}
        with self._errors(prefix or "<all objects>"):
            blobs = self._container.list_blobs(
                name_starts_with=self.prefix + prefix,
                include=["metadata"],
                results_per_page=self.settings.list_page_size,
            )
            for item in blobs:
                if not isinstance(item.name, str) or not isinstance(item.size, int):
                    raise MalformedAnswerError(
                        f"listing of blobs under {self.prefix + prefix!r} in container {self.container!r}"
                        f" at {self.endpoint}: malformed answer: blob {item.name!r} of size {item.size!r}"
                    )
                name = item.name[len(self.prefix) :]
                if not _is_directory(item) and _is_valid_name(name):
                    sizes[name] = item.size
        return sizes

    # ----------------------------------------------------------------- lifecycle
    def lifecycle_policy(self, days: int = DEFAULT_LIFECYCLE_DAYS) -> dict[str, Any]:
        """The lifecycle management policy deleting this store's pending blobs ``days`` after creation."""
        return lifecycle_policy(self.container, self.prefix, days)

    def install_expiry_rule(self) -> None:
        """Refuse, saying how to install the policy: Azure sets lifecycle policies in the management plane."""
        raise BlobStoreError(
            f"blobstate cannot install a lifecycle policy on Azure with a data-plane credential ({self.url}):"
            f" run `python -m blobstate.blobstore.azure_lifecycle {self.url} > policy.json` and"
            " `az storage account management-policy create --account-name ACCOUNT --resource-group GROUP"
            " --policy @policy.json` (merge it into an existing policy instead of replacing that)"
        )

    def expiry_problem(self) -> str | None:
        """None: the lifecycle policy lives in the management plane, which a data-plane credential cannot
        read, so it is not checked here (the README and :meth:`install_expiry_rule` say how to install it)."""
        return None

    def check_expiry(self) -> ExpiryCheck:
        """Unknown: the lifecycle policy lives in the management plane, which a data-plane credential
        cannot read."""
        return ExpiryCheck(
            unknown=f"Azure lifecycle management policies of the account of {self.url} cannot be read with a"
            " data-plane credential"
        )

    def close(self) -> None:
        """Shut down the I/O pool and the HTTP connections."""
        super().close()
        self._service.close()


def _is_directory(properties: Any) -> bool:
    """Whether a listed blob is a directory entry of a hierarchical-namespace (ADLS Gen2) account."""
    metadata = getattr(properties, "metadata", None) or {}
    return str(metadata.get("hdi_isfolder", "")).lower() == "true"


def _first_line(error: BaseException) -> str:
    text = redact(str(getattr(error, "message", None) or error)).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _is_valid_name(name: str) -> bool:
    try:
        validate_blob_name(name)
    except ValueError:
        return False
    return True
