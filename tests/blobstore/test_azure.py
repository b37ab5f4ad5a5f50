"""Azure store specifics against a real Azure Blob server (azurite): tags, conditional writes, errors."""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, generate_container_sas

from blobstate.blobstore import (
    BlobNotFoundError,
    BlobStoreError,
    BucketNotFoundError,
    TransientBlobError,
    open_blob_store,
)
from blobstate.blobstore.azure import AZURITE_ACCOUNT, AZURITE_KEY, AzureBlobStore
from blobstate.blobstore.azure_lifecycle import lifecycle_policy, main

KiB = 1024


@pytest.fixture
def service(azurite_endpoint: str) -> Iterator[BlobServiceClient]:
    """A plain SDK client on the test server, to look at what the store wrote."""
    with BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]) as client:
        yield client


@pytest.fixture
def store(azure_url: str) -> Iterator[AzureBlobStore]:
    s = open_blob_store(azure_url)
    assert isinstance(s, AzureBlobStore)
    yield s
    s.close()


def _tags(service: BlobServiceClient, store: AzureBlobStore, name: str) -> dict[str, str]:
    return dict(service.get_blob_client(store.container, store.prefix + name).get_blob_tags())


# --------------------------------------------------------------------------- TTL as a blob index tag
def test_pending_objects_carry_the_index_tag_and_remove_ttl_keeps_other_tags(
    store: AzureBlobStore, service: BlobServiceClient, tmp_path: Any
) -> None:
    source = tmp_path / "src"
    source.write_bytes(b"file")
    store.put("state/0/0/1_a.delta", b"d", ttl=60)
    store.put("blobs/0/0/x", source, ttl=60)
    store.put_if_absent("state/0/0/1_a.snapshot", b"s", ttl=60)
    store.put("commits/1.json", b"c")
    for name in ("state/0/0/1_a.delta", "blobs/0/0/x", "state/0/0/1_a.snapshot"):
        assert _tags(service, store, name) == {"blobstate-pending": "true"}
    assert _tags(service, store, "commits/1.json") == {}
    # Under the prefix of the URL, in the container of the URL.
    assert service.get_blob_client(store.container, "root/commits/1.json").download_blob().readall() == b"c"

    service.get_blob_client(store.container, "root/blobs/0/0/x").set_blob_tags(
        {"blobstate-pending": "true", "owner": "team-a"}
    )
    store.remove_ttl("blobs/0/0/x")
    assert _tags(service, store, "blobs/0/0/x") == {"owner": "team-a"}
    store.remove_ttl("state/0/0/1_a.delta")
    assert _tags(service, store, "state/0/0/1_a.delta") == {}


def test_large_objects_in_blocks_keep_the_tag_and_stay_create_only(azure_url: str) -> None:
    # Above max_single_put_size the SDK writes blocks and one Put Block List, which carries both the
    # tags and If-None-Match: *.
    with open_blob_store(azure_url, max_single_put_size=4 * KiB) as store:
        first, second = os.urandom(20 * KiB), os.urandom(20 * KiB)
        assert store.put_if_absent("commits/7.json", first, ttl=60) is True
        assert store.put_if_absent("commits/7.json", second) is False
        assert store.get("commits/7.json") == first
        assert store.has_ttl("commits/7.json")
        store.put("big", second, ttl=60)
        assert store.get("big") == second and store.has_ttl("big")


def test_lifecycle_policy_deletes_only_tagged_blobs_under_the_prefix(store: AzureBlobStore) -> None:
    (rule,) = store.lifecycle_policy(days=7)["rules"]
    assert rule["enabled"] is True and rule["type"] == "Lifecycle"
    assert rule["definition"] == {
        "actions": {"baseBlob": {"delete": {"daysAfterCreationGreaterThan": 7}}},
        "filters": {
            "blobTypes": ["blockBlob"],
            "prefixMatch": [f"{store.container}/root/"],
            "blobIndexMatch": [{"name": "blobstate-pending", "op": "==", "value": "true"}],
        },
    }
    with pytest.raises(ValueError, match="at least 1 day"):
        lifecycle_policy("c", "", 0)
    with pytest.raises(BlobStoreError, match="az storage account management-policy create"):
        store.install_expiry_rule()
    # a query's start cannot read the policy: it says so (at debug level), and warns of nothing
    check = store.check_expiry()
    assert check.problem is None and "data-plane credential" in (check.unknown or "")


def test_lifecycle_policy_is_printed_for_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["abfss://state@acct.dfs.core.windows.net/q/1", "3"]) == 0
    (rule,) = json.loads(capsys.readouterr().out)["rules"]
    assert rule["name"] == "blobstate-pending-state-q-1"
    assert rule["definition"]["filters"]["prefixMatch"] == ["state/q/1/"]
    assert rule["definition"]["actions"]["baseBlob"]["delete"] == {"daysAfterCreationGreaterThan": 3}


# --------------------------------------------------------------------------- credentials against the server
def test_account_key_and_sas_token_options_reach_the_server(
    azure_url: str, azurite_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    with open_blob_store(
        azure_url, endpoint_url=azurite_endpoint, account_name=AZURITE_ACCOUNT, account_key=AZURITE_KEY
    ) as store:
        store.put("x", b"by key")
        assert store.credentials.source == "account key (option account_key)"
    container = azure_url.split("/")[2]
    sas = generate_container_sas(
        AZURITE_ACCOUNT,
        container,
        account_key=AZURITE_KEY,
        permission=ContainerSasPermissions(read=True, write=True, list=True, tag=True, delete=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    with open_blob_store(azure_url, endpoint_url=azurite_endpoint, sas_token=sas) as store:
        assert store.get("x") == b"by key"
        assert store.list() == ["x"]


def test_a_wrong_key_is_one_error_naming_the_credential_container_and_endpoint(
    azure_url: str, azurite_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    wrong = "d3Jvbmcga2V5" * 4
    with (
        open_blob_store(
            azure_url, endpoint_url=azurite_endpoint, account_name=AZURITE_ACCOUNT, account_key=wrong
        ) as store,
        pytest.raises(BlobStoreError) as info,
    ):
        store.get("state/0/0/1_a.delta")
    message = str(info.value)
    assert not isinstance(info.value, TransientBlobError | BlobNotFoundError)
    for part in (
        "account key (option account_key)",
        store.container,
        "root/state/0/0/1_a.delta",
        azurite_endpoint,
    ):
        assert part in message
    assert wrong not in message


# --------------------------------------------------------------------------- errors
def test_a_missing_container_is_never_a_missing_object(azurite_endpoint: str, tmp_path: Any) -> None:
    with open_blob_store(f"az://missing-{uuid.uuid4().hex[:8]}/root") as store:
        operations = [
            lambda: store.get("x"),
            lambda: store.get_file("x", tmp_path / "out"),
            lambda: store.put("x", b"1"),
            lambda: store.put_if_absent("x", b"1"),
            lambda: store.exists("x"),
            lambda: store.delete("x"),
            lambda: store.has_ttl("x"),
            lambda: store.remove_ttl("x"),
            lambda: store.list(),
        ]
        for operation in operations:
            with pytest.raises(BucketNotFoundError) as info:
                operation()
            assert f"container {store.container!r} does not exist at {azurite_endpoint}" in str(info.value)


def test_a_missing_object_names_it(store: AzureBlobStore) -> None:
    with pytest.raises(BlobNotFoundError, match=r"'state/0/0/9_x.delta' in az://test-.*/root"):
        store.get("state/0/0/9_x.delta")


def test_directory_entries_of_a_hierarchical_namespace_are_not_objects(
    store: AzureBlobStore, service: BlobServiceClient
) -> None:
    # ADLS Gen2 accounts list directories as empty blobs marked hdi_isfolder=true.
    service.get_blob_client(store.container, "root/state/0").upload_blob(
        b"", metadata={"hdi_isfolder": "true"}
    )
    store.put("state/0/0/1_a.delta", b"d")
    assert store.list() == ["state/0/0/1_a.delta"]
    assert not store.exists("state/0")


class _Busy(BaseHTTPRequestHandler):
    """Answers every request as a throttled Azure account does."""

    def _busy(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        # Counted before answering: once the last answer is sent, the client may give up and the test
        # read the count before this handler's thread runs again.
        self.server.requests += 1  # type: ignore[attr-defined]
        body = b"<?xml version='1.0'?><Error><Code>ServerBusy</Code><Message>slow down</Message></Error>"
        self.send_response(503)
        self.send_header("x-ms-error-code", "ServerBusy")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_DELETE = _busy

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def busy_endpoint() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    server.requests = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_throttling_is_retried_then_named(busy_endpoint: ThreadingHTTPServer) -> None:
    endpoint = f"http://127.0.0.1:{busy_endpoint.server_address[1]}/{AZURITE_ACCOUNT}"
    with (
        open_blob_store(
            "az://state/root",
            endpoint_url=endpoint,
            account_name=AZURITE_ACCOUNT,
            account_key=AZURITE_KEY,
            max_attempts=3,
            backoff_seconds=0.001,
        ) as store,
        pytest.raises(BlobStoreError) as info,
    ):
        store.put("commits/3.json", b"c")
    assert busy_endpoint.requests == 3  # type: ignore[attr-defined]  # the SDK's own retries are off
    assert isinstance(info.value.__cause__, TransientBlobError)
    message = str(info.value)
    for part in ("3 attempts", endpoint, "container 'state'", "blob 'root/commits/3.json'", "ServerBusy"):
        assert part in message


def test_an_endpoint_that_never_answers_fails_within_the_timeouts(silent_endpoint: Any) -> None:
    with (
        open_blob_store(
            "az://state/root",
            endpoint_url=f"{silent_endpoint.url}/{AZURITE_ACCOUNT}",
            account_name=AZURITE_ACCOUNT,
            account_key=AZURITE_KEY,
            read_timeout=0.3,
            max_attempts=2,
            backoff_seconds=0.001,
        ) as store,
        pytest.raises(BlobStoreError, match=r"get 'x' .* failed after 2 attempts .*read_timeout"),
    ):
        store.get("x")
    assert silent_endpoint.connections >= 1


def test_parallel_block_uploads_reuse_their_connections(
    azure_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Eight pool threads each uploading blocks four at a time need more than requests' default pool of
    # ten connections; a pool too small discards connections (a warning each) and reconnects.
    payload = os.urandom(12 * 1024 * KiB)
    with open_blob_store(azure_url, max_single_put_size=1024 * KiB) as store:
        with caplog.at_level("WARNING", logger="urllib3.connectionpool"):
            store.run_parallel(lambda i: store.put(f"blobs/{i}", payload), range(store.io_threads))
        assert store.get("blobs/3") == payload
    assert not [r for r in caplog.records if "Connection pool is full" in r.getMessage()]


def test_errors_of_a_sas_store_never_show_the_signature() -> None:
    with socket.socket() as probe:  # a port nothing listens on: every request is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with open_blob_store(
        "az://state/root",
        endpoint_url=f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}",
        sas_token="sv=2025-11-05&sp=rwdlact&sig=SECRETSIGNATURE%2Babc%3D",
        max_attempts=2,
        backoff_seconds=0.001,
        connect_timeout=1,
    ) as store:
        for operation in (lambda: store.get("x"), lambda: store.list(), lambda: store.has_ttl("x")):
            with pytest.raises(BlobStoreError) as raised:
                operation()
            message = str(raised.value)
            assert "SECRETSIGNATURE" not in message and "sig=***" in message, message
            assert f"127.0.0.1:{port}" in message and "'state'" in message
