"""The S3 blob store (``s3://bucket/prefix``), for AWS S3 and S3-protocol servers.

Pending objects carry the tag ``blobstate-pending=true`` (set at put); ``remove_ttl`` deletes the
object's tag set, and a bucket lifecycle rule installed by :meth:`S3BlobStore.install_lifecycle_rule`
expires tagged objects under the prefix, so S3 does the expiry itself (the TTL's length is the rule's, in
days; the seconds given to ``put`` only mark the object pending). ``put_if_absent`` is a conditional write
(``If-None-Match: *``). Throttling, 5xx answers and connection failures become
:class:`TransientBlobError`, which the base class retries; botocore's own retries are turned off so the
base class's are the ones that count.
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
import urllib3.exceptions
from botocore.config import Config
from s3transfer.manager import TransferConfig, TransferManager

from blobstate.blobstore.base import BlobNotFoundError, BlobStore, BlobStoreError, TransientBlobError
from blobstate.blobstore.names import validate_blob_name

ENDPOINT_ENV = "BLOBSTATE_S3_ENDPOINT"
"""Environment variable naming a non-AWS endpoint (used when no ``endpoint_url`` option is given)."""

PENDING_TAG_KEY = "blobstate-pending"
PENDING_TAG_VALUE = "true"
PENDING_TAGGING = f"{PENDING_TAG_KEY}={PENDING_TAG_VALUE}"

DEFAULT_REGION = "us-east-1"
DEFAULT_MULTIPART_THRESHOLD = 64 * 1024 * 1024
DEFAULT_MULTIPART_CHUNKSIZE = 16 * 1024 * 1024
_STREAM_CHUNK = 1024 * 1024

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
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


_SESSION: boto3.session.Session | None = None
_SESSION_LOCK = threading.Lock()


def _new_client(**kwargs: Any) -> Any:
    """An S3 client from one process-wide session: a fresh session reloads the service model (~0.4 s)."""
    global _SESSION
    with _SESSION_LOCK:  # sessions are not thread-safe; clients are
        if _SESSION is None:
            _SESSION = boto3.session.Session()
        return _SESSION.client("s3", **kwargs)


def parse_s3_url(url: str) -> tuple[str, str]:
    """``(bucket, key prefix)`` of ``s3://bucket/prefix``; the prefix is empty or ends with ``/``."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an S3 URL {url!r}: expected s3://bucket/prefix")
    if parsed.query or parsed.fragment:
        raise ValueError(f"S3 URL {url!r} must not have a query or fragment")
    prefix = parsed.path.strip("/")
    if prefix:
        validate_blob_name(prefix)
        prefix += "/"
    return parsed.netloc, prefix


class S3BlobStore(BlobStore):
    """Objects under ``s3://bucket/prefix``; TTLs as the ``blobstate-pending`` tag."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        multipart_chunksize: int = DEFAULT_MULTIPART_CHUNKSIZE,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        list_page_size: int = 1000,
        **options: Any,
    ) -> None:
        """Open ``s3://bucket/prefix``.

        ``endpoint_url`` (else ``BLOBSTATE_S3_ENDPOINT``) points at a non-AWS server; ``region`` defaults
        to ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else us-east-1. Files of ``multipart_threshold`` bytes
        or more are uploaded in parallel parts. Credentials come from boto3's usual chain.
        """
        options.setdefault("backoff_seconds", 0.2)
        super().__init__(url, **options)
        self.bucket, self.prefix = parse_s3_url(url)
        self.endpoint_url = endpoint_url or os.environ.get(ENDPOINT_ENV) or None
        self.region = (
            region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
        )
        self.multipart_threshold = multipart_threshold
        self.list_page_size = list_page_size
        config = Config(
            region_name=self.region,
            # The I/O pool's threads call S3 directly; multipart transfers add up to io_threads more.
            max_pool_connections=2 * self.io_threads,
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            s3={"addressing_style": "path"} if self.endpoint_url else None,
        )
        self._client = _new_client(endpoint_url=self.endpoint_url, region_name=self.region, config=config)
        self._transfer_config = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_request_concurrency=self.io_threads,
        )
        self._transfer: TransferManager | None = None

    # ----------------------------------------------------------------- helpers
    def _key(self, name: str) -> str:
        return self.prefix + name

    @contextlib.contextmanager
    def _errors(self, name: str) -> Iterator[None]:
        """Translate botocore errors about ``name`` into blob store errors."""
        try:
            yield
        except bx.ClientError as error:
            raise self._client_error(error, name) from error
        except _TRANSIENT_EXCEPTIONS as error:
            raise TransientBlobError(f"{name!r} in {self.url}: {error}") from error

    def _client_error(self, error: bx.ClientError, name: str) -> BlobStoreError:
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _NOT_FOUND_CODES:
            return BlobNotFoundError(name, self.url)
        if code in _TRANSIENT_CODES or status == 429 or status >= 500:
            return TransientBlobError(f"{name!r} in {self.url}: {error}")
        if code == "NoSuchBucket":
            return BlobStoreError(f"bucket {self.bucket!r} of {self.url} does not exist ({name!r})")
        return BlobStoreError(f"S3 error on {name!r} in {self.url}: {error}")

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

    def _get_bytes(self, name: str) -> bytes:
        with self._errors(name):
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(name))
            with contextlib.closing(response["Body"]) as body:
                return body.read()

    def _get_file(self, name: str, path: Path) -> int:
        part = path.with_name(f"{path.name}.{uuid.uuid4().hex}.part")
        try:
            with self._errors(name):
                response = self._client.get_object(Bucket=self.bucket, Key=self._key(name))
                with contextlib.closing(response["Body"]) as body, part.open("wb") as out:
                    shutil.copyfileobj(body, out, _STREAM_CHUNK)
            os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)
        return path.stat().st_size

    def _head(self, name: str) -> bool:
        with self._errors(name):
            try:
                self._client.head_object(Bucket=self.bucket, Key=self._key(name))
            except bx.ClientError as error:
                if str(error.response.get("Error", {}).get("Code", "")) in _NOT_FOUND_CODES:
                    return False
                raise
        return True

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
            return list(self._client.get_object_tagging(Bucket=self.bucket, Key=self._key(name))["TagSet"])

    def _has_ttl(self, name: str) -> bool:
        return any(t["Key"] == PENDING_TAG_KEY and t["Value"] == PENDING_TAG_VALUE for t in self._tags(name))

    def _list(self, prefix: str) -> list[str]:
        return list(self._list_sizes(prefix))

    def _list_sizes(self, prefix: str) -> dict[str, int]:
        sizes: dict[str, int] = {}
        with self._errors(prefix or "<all objects>"):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket,
                Prefix=self.prefix + prefix,
                PaginationConfig={"PageSize": self.list_page_size},
            )
            for page in pages:
                for item in page.get("Contents", []):
                    name = item["Key"][len(self.prefix) :]
                    if _is_valid_name(name):  # skips "folder/" markers and keys no blob name can reach
                        sizes[name] = int(item["Size"])
        return sizes

    # ----------------------------------------------------------------- lifecycle
    @property
    def lifecycle_rule_id(self) -> str:
        """The id of the rule :meth:`install_lifecycle_rule` manages for this prefix."""
        return f"blobstate-pending:{self.prefix}" if self.prefix else "blobstate-pending"

    def install_lifecycle_rule(self, days: int = 30) -> None:
        """Install (or replace) the bucket lifecycle rule expiring pending objects under the prefix.

        Objects tagged ``blobstate-pending=true`` under the prefix expire ``days`` after creation. Other
        rules of the bucket are kept. Needs the ``s3:PutLifecycleConfiguration`` permission.
        """
        if days < 1:
            raise ValueError(f"lifecycle expiry must be at least 1 day, got {days}")
        tag = {"Key": PENDING_TAG_KEY, "Value": PENDING_TAG_VALUE}
        filter_ = {"And": {"Prefix": self.prefix, "Tags": [tag]}} if self.prefix else {"Tag": tag}
        rule = {
            "ID": self.lifecycle_rule_id,
            "Filter": filter_,
            "Status": "Enabled",
            "Expiration": {"Days": days},
        }
        where = f"lifecycle configuration of bucket {self.bucket!r}"
        with self._errors(where):
            rules = [r for r in self._lifecycle_rules() if r.get("ID") != rule["ID"]]
            self._client.put_bucket_lifecycle_configuration(
                Bucket=self.bucket, LifecycleConfiguration={"Rules": [*rules, rule]}
            )

    def lifecycle_rules(self) -> list[dict[str, Any]]:
        """The bucket's lifecycle rules as S3 reports them (empty when it has none)."""
        with self._errors(f"lifecycle configuration of bucket {self.bucket!r}"):
            return self._lifecycle_rules()

    def _lifecycle_rules(self) -> list[dict[str, Any]]:
        try:
            return list(self._client.get_bucket_lifecycle_configuration(Bucket=self.bucket)["Rules"])
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


def _is_valid_name(name: str) -> bool:
    try:
        validate_blob_name(name)
    except ValueError:
        return False
    return True
