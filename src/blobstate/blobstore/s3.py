"""The S3 blob store (``s3://bucket/prefix``), for AWS S3 and S3-protocol servers.

Pending objects carry the tag ``blobstate-pending=true`` (set at put); ``remove_ttl`` deletes the
object's tag set, and a bucket lifecycle rule installed by :meth:`S3BlobStore.install_lifecycle_rule`
expires tagged objects under the prefix, so S3 does the expiry itself (the TTL's length is the rule's, in
days; the seconds given to ``put`` only mark the object pending). ``put_if_absent`` is a conditional write
(``If-None-Match: *``). Throttling, 5xx answers, timeouts and connection failures become
:class:`TransientBlobError`, which the base class retries; botocore's own retries are turned off so the
base class's are the ones that count. Timeouts and the retry budget are options (keywords, URL query or
Spark conf; see :mod:`blobstate.blobstore.s3_options`): by default an endpoint that never answers fails
an operation within about a minute, with an error naming the endpoint, bucket and object.

A missing bucket is :class:`BucketNotFoundError` for every operation, never "object not found".
:meth:`S3BlobStore.expiry_problem` checks the bucket's lifecycle rules.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
import botocore.exceptions as bx
import botocore.parsers
import urllib3.exceptions
from botocore.config import Config
from s3transfer.manager import TransferConfig, TransferManager

from blobstate.blobstore.answers import MalformedAnswerError, body_length, field, records
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
from blobstate.blobstore.s3_lifecycle import (
    PENDING_TAG_KEY,
    PENDING_TAG_VALUE,
    PENDING_TAGGING,
    pending_rule,
    rule_id,
)
from blobstate.blobstore.s3_lifecycle import expiry_problem as lifecycle_expiry_problem
from blobstate.blobstore.s3_options import S3OptionError, S3Settings, check_endpoint, split_s3_url
from blobstate.errors import BlobStoreError

ENDPOINT_ENV = "BLOBSTATE_S3_ENDPOINT"
"""Environment variable naming a non-AWS endpoint (used when no ``endpoint_url`` option is given)."""

ENDPOINT_ENVS = (ENDPOINT_ENV, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""Where the endpoint comes from without an ``endpoint_url`` option, first set wins (the AWS ones are the
names boto3 and the AWS CLI read)."""

DEFAULT_REGION = "us-east-1"
DEFAULT_LIFECYCLE_DAYS = round(DEFAULT_PENDING_TTL_SECONDS / 86400)
_STREAM_CHUNK = 1024 * 1024

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_LIFECYCLE = "<lifecycle configuration>"
_REJECTED_CREDENTIAL_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "TokenRefreshRequired"}
)
_CREDENTIAL_ERRORS: tuple[type[BaseException], ...] = (
    bx.NoCredentialsError,
    bx.PartialCredentialsError,
    bx.CredentialRetrievalError,
)
_PRECONDITION_CODES = frozenset({"PreconditionFailed", "412"})
# ConditionalRequestConflict (409) means another conditional write on the key is in flight: S3 asks
# for a retry, which then either wins or gets 412. Answering False at once could leave no winner at all.
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequests",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
        "ConditionalRequestConflict",
    }
)
_TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    bx.ConnectionError,  # endpoint unreachable, connect timeout, SSL, proxy
    bx.HTTPClientError,  # connection closed, read timeout, response stream broken
    bx.IncompleteReadError,
    bx.ChecksumError,
    bx.FlexibleChecksumError,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
)


_SESSIONS: dict[tuple[str | None, ...], boto3.session.Session] = {}
_SESSION_LOCK = threading.Lock()
_CONFIG_ENVS = ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def _new_client(profile: str | None, **kwargs: Any) -> Any:
    """An S3 client from a process-wide session per profile and AWS config files: a fresh session reloads
    the service model (~0.4 s). The session resolves credentials by boto3's chain; keys passed in
    ``kwargs`` win over it."""
    key = (profile, *(os.environ.get(name) for name in _CONFIG_ENVS))
    with _SESSION_LOCK:  # sessions are not thread-safe; clients are
        session = _SESSIONS.get(key)
        if session is None:
            session = _SESSIONS[key] = boto3.session.Session(profile_name=profile)
        return session.client("s3", **kwargs)


def default_endpoint() -> str | None:
    """The endpoint named by the environment (:data:`ENDPOINT_ENVS`, first set wins), else None (AWS).

    Checked as the ``endpoint_url`` option is: :class:`S3OptionError` (showing it redacted) for one that is
    not http(s) or carries credentials."""
    for name in ENDPOINT_ENVS:
        value = os.environ.get(name)
        if value:
            try:
                return check_endpoint(value)
            except ValueError as error:
                raise S3OptionError(f"environment variable {name}: {error}") from None
    return None


def parse_s3_url(url: str) -> tuple[str, str]:
    """``(bucket, key prefix)`` of ``s3://bucket/prefix[?options]``; the prefix is empty or ends in ``/``."""
    parsed = urlparse(split_s3_url(url)[0])
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an S3 URL {redact(url)!r}: expected s3://bucket/prefix")
    prefix = parsed.path.strip("/")
    if prefix:
        validate_blob_name(prefix)
        prefix += "/"
    return parsed.netloc, prefix


class S3BlobStore(BlobStore):
    """Objects under ``s3://bucket/prefix``; TTLs as the ``blobstate-pending`` tag."""

    def __init__(self, url: str, **options: Any) -> None:
        """Open ``s3://bucket/prefix``, with options as keywords or as the URL's query.

        The options are the fields of :class:`~blobstate.blobstore.s3_options.S3Settings`:
        ``endpoint_url`` (else ``BLOBSTATE_S3_ENDPOINT``) points at a non-AWS server; ``region`` defaults
        to ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else us-east-1; ``connect_timeout``, ``read_timeout``,
        ``max_attempts`` and ``backoff_seconds`` bound how long an operation may take: with the defaults
        (5 s, 10 s, 4, 0.2 s) an endpoint that accepts connections and never answers fails an operation
        after at most 42.1 s, and a one-request operation takes at most 62.1 s in the worst case
        (``settings.worst_case_seconds``). Files of ``multipart_threshold`` bytes or more are uploaded in
        parallel parts. Credentials: ``profile``, or ``access_key_id`` and ``secret_access_key`` (and
        ``session_token``), else boto3's usual chain (environment keys, ``AWS_PROFILE``, the AWS config
        files, container and instance roles). ``endpoint_url`` falls back to ``BLOBSTATE_S3_ENDPOINT``,
        ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``; ``addressing_style`` / ``path_style`` choose
        virtual-hosted or path-style requests (default: path style with a custom endpoint).
        """
        location, settings = S3Settings.resolve(url, options)
        super().__init__(
            location,
            io_threads=settings.io_threads,
            max_attempts=settings.max_attempts,
            backoff_seconds=settings.backoff_seconds,
        )
        self.settings = settings
        self.bucket, self.prefix = parse_s3_url(location)
        self.endpoint_url = settings.endpoint_url or default_endpoint()
        self.region = (
            settings.region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or DEFAULT_REGION
        )
        self.multipart_threshold = settings.multipart_threshold
        self.list_page_size = settings.list_page_size
        config = Config(
            region_name=self.region,
            # The I/O pool's threads call S3 directly; multipart transfers add up to io_threads more.
            max_pool_connections=2 * self.io_threads,
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            s3={"addressing_style": settings.resolved_addressing_style(self.endpoint_url is not None)},
        )
        keys = (
            {
                "aws_access_key_id": settings.access_key_id,
                "aws_secret_access_key": settings.secret_access_key,
                "aws_session_token": settings.session_token,
            }
            if settings.access_key_id is not None
            else {}
        )
        try:
            self._client = _new_client(
                settings.profile,
                endpoint_url=self.endpoint_url,
                region_name=self.region,
                config=config,
                **keys,
            )
        except bx.ProfileNotFound as error:
            where = "the profile option" if settings.profile else "AWS_PROFILE"
            raise BlobStoreError(
                f"cannot open {self.url}: {_text(error)} (named by {where}); name a profile of the AWS config"
                " files (AWS_CONFIG_FILE, default ~/.aws/config, and AWS_SHARED_CREDENTIALS_FILE, default"
                " ~/.aws/credentials) or drop it to use the environment's credentials"
            ) from error
        except ValueError as error:  # an endpoint botocore cannot use
            raise S3OptionError(
                f"cannot open {self.url} (endpoint {redact(str(self.endpoint_url))}): {_text(error)}"
            ) from error
        except bx.BotoCoreError as error:
            raise BlobStoreError(f"cannot open {self.url}: {_text(error)}") from error
        self._transfer_config = TransferConfig(
            multipart_threshold=settings.multipart_threshold,
            multipart_chunksize=settings.multipart_chunksize,
            max_request_concurrency=self.io_threads,
        )
        self._transfer: TransferManager | None = None

    @property
    def endpoint(self) -> str:
        """The endpoint this store sends its requests to (an AWS regional endpoint unless overridden), as
        messages show it: credentials in it are masked (:func:`~blobstate.blobstore.redact.redact`)."""
        return redact(str(self._client.meta.endpoint_url))

    # ----------------------------------------------------------------- helpers
    def _key(self, name: str) -> str:
        return self.prefix + name

    @contextlib.contextmanager
    def _errors(self, name: str) -> Iterator[None]:
        """Translate botocore errors about ``name`` into blob store errors."""
        try:
            yield
        except BlobStoreError:  # ours already (a malformed answer names its request)
            raise
        except bx.ClientError as error:
            raise self._client_error(error, name) from error
        except _CREDENTIAL_ERRORS as error:
            raise BlobStoreError(
                f"no usable AWS credentials for {self.url} (bucket {self.bucket!r} at {self.endpoint}:"
                f" {_text(error)}): give the options access_key_id and secret_access_key (and"
                " session_token) or profile (keywords, URL query or Spark conf"
                " spark.blobstate.s3.<option>), or set"
                " AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or AWS_PROFILE"
                " naming a profile in ~/.aws/credentials, or run where an instance profile or IAM role"
                " provides them"
            ) from error
        except _TRANSIENT_EXCEPTIONS as error:
            raise TransientBlobError(f"{name!r} in {self.url}: {_text(error)}") from error
        except (botocore.parsers.ResponseParserError, ValueError) as error:
            # An answer cut inside a header or the XML body: botocore cannot parse what arrived.
            raise MalformedAnswerError(f"{name!r} in {self.url}: malformed answer: {_text(error)}") from error
        except bx.BotoCoreError as error:  # a request botocore refused to send (ParamValidationError ...)
            raise BlobStoreError(f"S3 request on {name!r} in {self.url} failed: {_text(error)}") from error

    def _client_error(self, error: bx.ClientError, name: str) -> BlobStoreError:
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code == "NoSuchBucket":
            return self._no_bucket(name)
        if code in _NOT_FOUND_CODES:
            return BlobNotFoundError(name, self.url)
        if code in _TRANSIENT_CODES or status == 429 or status >= 500:
            return TransientBlobError(f"{name!r} in {self.url}: {_text(error)}")
        if code in _REJECTED_CREDENTIAL_CODES:
            return self._rejected_credentials(name, code)
        return BlobStoreError(f"S3 error on {name!r} in {self.url}: {_text(error)}")

    def _rejected_credentials(self, name: str, code: str) -> BlobStoreError:
        """S3 refused the credentials: name bucket, endpoint and where they came from (never the secret)."""
        return BlobStoreError(
            f"S3 at {self.endpoint} rejected the credentials for bucket {self.bucket!r} ({code}, store"
            f" {self.url}, while accessing {name!r}); they came from {self.settings.credentials_source}:"
            " check the access key id and secret (options access_key_id/secret_access_key, the profile"
            " option, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and that they belong to"
            " this endpoint"
        )

    def _no_bucket(self, name: str) -> BucketNotFoundError:
        return BucketNotFoundError(
            f"bucket {self.bucket!r} does not exist at {self.endpoint} (store {self.url}, while accessing"
            f" {name!r}): check the bucket name in the URL and the endpoint and region, or create the bucket"
        )

    def _check_bucket(self, name: str) -> None:
        """Raise :class:`BucketNotFoundError` if the bucket is missing (a HEAD's 404 cannot tell)."""
        with self._errors(name):
            try:
                self._client.head_bucket(Bucket=self.bucket)
            except bx.ClientError as error:
                code = str(error.response.get("Error", {}).get("Code", ""))
                if code in _NOT_FOUND_CODES or code == "NoSuchBucket":
                    raise self._no_bucket(name) from error
                if code in _REJECTED_CREDENTIAL_CODES:
                    raise self._rejected_credentials(name, code) from error
                if code in ("403", "AccessDenied", "Forbidden"):
                    return  # S3 answers 403, not 404, for a bucket that exists but is not ours to list
                raise

    def _gave_up(
        self, op: str, name: str, attempts: int, seconds: float, error: TransientBlobError
    ) -> BlobStoreError:
        """Name the endpoint, bucket and object, and say what to check and which options give more time."""
        if op == "list":
            target = f"keys under {self._key(name)!r}"
        elif op.startswith("lifecycle"):
            target = "its lifecycle configuration"
        else:
            target = f"key {self._key(name)!r}"
        s = self.settings
        return BlobStoreError(
            f"{op} {name!r} in {self.url} failed after {attempts} attempts in {seconds:.1f} s"
            f" (endpoint {self.endpoint}, bucket {self.bucket!r}, {target}):"
            f" {_text(error.__cause__ or error)}."
            f" Check that the endpoint is reachable and answers S3 requests (the endpoint_url option or"
            f" {ENDPOINT_ENV}, the region, network and proxy); to allow more time raise connect_timeout,"
            f" read_timeout or max_attempts (now {s.connect_timeout:g} s, {s.read_timeout:g} s,"
            f" {s.max_attempts}) in the URL query (s3://bucket/prefix?read_timeout=30), as options, or as"
            " Spark conf spark.blobstate.s3.<option>"
        )

    def _transfer_manager(self) -> TransferManager:
        with self._pool_lock:
            if self._transfer is None:
                self._transfer = TransferManager(self._client, self._transfer_config)
            return self._transfer

    @staticmethod
    def _tagging(ttl: float | None) -> dict[str, str]:
        return {"Tagging": PENDING_TAGGING} if ttl is not None else {}

    # ----------------------------------------------------------------- primitives
    def _put_bytes(self, name: str, data: bytes | memoryview, ttl: float | None) -> None:
        body = data.tobytes() if isinstance(data, memoryview) else data
        with self._errors(name):
            self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=body, **self._tagging(ttl))

    def _put_file(self, name: str, path: Path, ttl: float | None) -> None:
        # The file is opened afresh on every try, so a retry never resumes a half-read stream.
        size = path.stat().st_size
        with self._errors(name):
            if size < self.multipart_threshold:
                with path.open("rb") as body:
                    self._client.put_object(
                        Bucket=self.bucket, Key=self._key(name), Body=body, **self._tagging(ttl)
                    )
            else:
                future = self._transfer_manager().upload(
                    str(path), self.bucket, self._key(name), extra_args=self._tagging(ttl)
                )
                future.result()

    def _put_if_absent(self, name: str, data: bytes, ttl: float | None) -> bool:
        with self._errors(name):
            try:
                self._client.put_object(
                    Bucket=self.bucket, Key=self._key(name), Body=data, IfNoneMatch="*", **self._tagging(ttl)
                )
            except bx.ClientError as error:
                if str(error.response.get("Error", {}).get("Code", "")) in _PRECONDITION_CODES:
                    return False
                raise
        return True

    def _get_object(self, name: str, limit: int | None = None) -> tuple[Any, int]:
        """The body stream of ``name`` (its first ``limit`` bytes at most) and the length the answer
        announced (checked to be there)."""
        what = f"get of key {self._key(name)!r}"
        extra = {} if limit is None else {"Range": f"bytes=0-{limit - 1}"}
        response = self._client.get_object(Bucket=self.bucket, Key=self._key(name), **extra)
        body: Any = field(response, "Body", object, what)
        length = response.get("ContentLength")
        if not isinstance(length, int) or isinstance(length, bool):
            body.close()
            body_length(length, 0, what)  # raises: an answer without a length may be cut anywhere
        return body, length

    def _get_bytes(self, name: str, limit: int | None = None) -> bytes:
        with self._errors(name):
            stream, length = self._get_object(name, limit)
            with contextlib.closing(stream) as body:
                data: bytes = body.read()
            body_length(length, len(data), f"get of key {self._key(name)!r}")
            return data

    def _get_prefix(self, name: str, limit: int) -> bytes:
        try:
            return self._get_bytes(name, limit)
        except BlobStoreError as error:
            if _invalid_range(error):  # an empty object has no byte 0 to start a range at
                return self._get_bytes(name)[:limit]
            raise

    def _get_file(self, name: str, path: Path) -> int:
        part = path.with_name(f"{path.name}.{uuid.uuid4().hex}.part")
        try:
            with self._errors(name):
                stream, length = self._get_object(name)
                with contextlib.closing(stream) as body, part.open("wb") as out:
                    shutil.copyfileobj(body, out, _STREAM_CHUNK)
                body_length(length, part.stat().st_size, f"get of key {self._key(name)!r}")
            os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)
        return path.stat().st_size

    def _head(self, name: str) -> bool:
        with self._errors(name):
            try:
                self._client.head_object(Bucket=self.bucket, Key=self._key(name))
            except bx.ClientError as error:
                if str(error.response.get("Error", {}).get("Code", "")) not in _NOT_FOUND_CODES:
                    raise
            else:
                return True
        # A HEAD answer has no body, so a missing key and a missing bucket are both a bare 404.
        self._check_bucket(name)
        return False

    def _exists(self, name: str) -> bool:
        return self._head(name)

    def _delete(self, name: str) -> None:
        # S3 deletes are idempotent; the contract says deleting a missing object is an error.
        if not self._head(name):
            raise BlobNotFoundError(name, self.url)
        with self._errors(name):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(name))

    def _remove_ttl(self, name: str) -> None:
        # Reading the tags first names a missing object clearly and makes a repeated call one request.
        if self._tags(name):
            with self._errors(name):
                self._client.delete_object_tagging(Bucket=self.bucket, Key=self._key(name))

    def _tags(self, name: str) -> list[dict[str, str]]:
        with self._errors(name):
            answer = self._client.get_object_tagging(Bucket=self.bucket, Key=self._key(name))
            what = f"tagging of key {self._key(name)!r}"
            return list(records(answer, "TagSet", {"Key": str, "Value": str}, what))

    def _has_ttl(self, name: str) -> bool:
        return any(t["Key"] == PENDING_TAG_KEY and t["Value"] == PENDING_TAG_VALUE for t in self._tags(name))

    def _list(self, prefix: str) -> list[str]:
        return list(self._list_sizes(prefix))

    def holds_nothing(self) -> bool:
        """One listing request of at most one key under the store's prefix."""
        with self._errors("<all objects>"):
            page = self._client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        return not page.get("Contents")

    def _list_sizes(self, prefix: str) -> dict[str, int]:
        sizes: dict[str, int] = {}
        what = f"listing of keys under {self.prefix + prefix!r}"
        token: dict[str, str] = {}
        with self._errors(prefix or "<all objects>"):
            while True:
                # Paged by hand: a page cut short parses as an empty, final one unless checked.
                page = self._client.list_objects_v2(
                    Bucket=self.bucket, Prefix=self.prefix + prefix, MaxKeys=self.list_page_size, **token
                )
                truncated = field(page, "IsTruncated", bool, what)
                items = records(page, "Contents", {"Key": str, "Size": int}, what, optional=True)
                count = page.get("KeyCount")
                if count is not None and count != len(items):
                    raise MalformedAnswerError(
                        f"malformed answer to the {what} request: KeyCount {count}, {len(items)} keys"
                    )
                for item in items:
                    name = item["Key"][len(self.prefix) :]
                    if item["Key"].startswith(self.prefix) and _is_valid_name(name):
                        # skips "folder/" markers and keys no blob name can reach
                        sizes[name] = item["Size"]
                if not truncated:
                    return sizes
                token = {"ContinuationToken": field(page, "NextContinuationToken", str, what)}

    # ----------------------------------------------------------------- lifecycle
    @property
    def lifecycle_rule_id(self) -> str:
        """The id of the rule :meth:`install_lifecycle_rule` manages for this prefix."""
        return rule_id(self.prefix)

    def install_lifecycle_rule(self, days: int = DEFAULT_LIFECYCLE_DAYS) -> None:
        """Install (or replace) the bucket lifecycle rule expiring pending objects under the prefix.

        Objects tagged ``blobstate-pending=true`` under the prefix expire ``days`` after creation. Other
        rules of the bucket are kept. Needs the ``s3:PutLifecycleConfiguration`` permission.
        """
        rule = pending_rule(self.prefix, days)

        def install() -> None:
            with self._errors(_LIFECYCLE):
                rules = [r for r in self._lifecycle_rules() if r.get("ID") != rule["ID"]]
                self._client.put_bucket_lifecycle_configuration(
                    Bucket=self.bucket, LifecycleConfiguration={"Rules": [*rules, rule]}
                )

        self._retry("lifecycle install", _LIFECYCLE, install)

    def install_expiry_rule(self) -> None:
        """Install the lifecycle rule expiring pending objects (after 30 days) under this prefix."""
        self.install_lifecycle_rule()

    def lifecycle_rules(self) -> list[dict[str, Any]]:
        """The bucket's lifecycle rules as S3 reports them (empty when it has none)."""

        def read() -> list[dict[str, Any]]:
            with self._errors(_LIFECYCLE):
                return self._lifecycle_rules()

        return self._retry("lifecycle read", _LIFECYCLE, read)

    def expiry_problem(self) -> str | None:
        """None when an enabled lifecycle rule expires pending objects under this prefix, else the fix.

        Also a problem: a rule that expires untagged objects under the prefix (it would delete committed
        state), and a lifecycle configuration this identity may not read.
        """
        try:
            rules = self.lifecycle_rules()
        except BlobStoreError as error:
            cause = error.__cause__
            if isinstance(cause, bx.ClientError) and cause.response.get("Error", {}).get("Code") in (
                "AccessDenied",
                "403",
            ):
                return (
                    f"cannot read the lifecycle configuration of bucket {self.bucket!r} ({_text(cause)}), so"
                    " cannot tell whether pending objects expire: grant s3:GetLifecycleConfiguration, or"
                    f" check by hand that a rule expires objects tagged {PENDING_TAGGING} under"
                    f" {self.prefix or 'the bucket'}"
                )
            raise
        return lifecycle_expiry_problem(rules, self.bucket, self.prefix, self.url, DEFAULT_LIFECYCLE_DAYS)

    def check_expiry(self) -> ExpiryCheck:
        """:meth:`expiry_problem` for a query's start: a problem when the bucket's rules do not expire
        pending objects under the prefix (or would delete committed state); unknown, never an error,
        when the lifecycle configuration cannot be read (permissions, an endpoint without lifecycle
        support, a failing request)."""
        try:
            rules = self.lifecycle_rules()
        except BlobStoreError as error:
            return ExpiryCheck(
                unknown=f"cannot read the lifecycle configuration of bucket {self.bucket!r}: {error}"
            )
        return ExpiryCheck(
            problem=lifecycle_expiry_problem(
                rules, self.bucket, self.prefix, self.url, DEFAULT_LIFECYCLE_DAYS
            )
        )

    def _lifecycle_rules(self) -> list[dict[str, Any]]:
        try:
            answer = self._client.get_bucket_lifecycle_configuration(Bucket=self.bucket)
            return list(records(answer, "Rules", {}, f"lifecycle configuration of bucket {self.bucket!r}"))
        except bx.ClientError as error:
            if error.response.get("Error", {}).get("Code") == "NoSuchLifecycleConfiguration":
                return []
            raise

    def close(self) -> None:
        """Shut down transfers, the I/O pool and the HTTP connections."""
        with self._pool_lock:
            transfer, self._transfer = self._transfer, None
        if transfer is not None:
            transfer.shutdown()
        super().close()
        self._client.close()


def _text(error: BaseException) -> str:
    """A library's error as text for a message, with any credentials its URLs carry masked."""
    return redact(str(error))


def _is_valid_name(name: str) -> bool:
    try:
        validate_blob_name(name)
    except ValueError:
        return False
    return True


def _invalid_range(error: BaseException) -> bool:
    """Whether ``error`` was S3's answer to a range that starts past the object's end (416)."""
    cause = error.__cause__
    if not isinstance(cause, bx.ClientError):
        return False
    code = str(cause.response.get("Error", {}).get("Code", ""))
    status = int(cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code == "InvalidRange" or status == 416
