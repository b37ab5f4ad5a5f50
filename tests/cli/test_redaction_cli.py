"""Every command that takes a location keeps the secrets a URL carries out of its output: stdout, the
``error: ...`` line and the ``--debug`` traceback. URLs with planted secrets (an S3 key and session token
in the query, keys before the bucket, an endpoint with a password, Azure SAS tokens, account keys and
connection strings) point at a port nothing listens on, so each command fails fast; then the S3 query
form against the test server, on an empty location, a backup repository and a query checkpoint, so the
commands also print what they print when they work."""

from __future__ import annotations

import base64
import socket
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reader"))
from checkpoints import build_checkpoint
from reader_jobs import batches

AKID = "AKIAPLANTEDCLIKEY0101"
S3_SECRET = "PlantedCliSecretKey0102"
S3_TOKEN = "PlantedCliSessionToken0103"
USERINFO_KEY = "AKIAPLANTEDCLIUSER0104"
USERINFO_SECRET = "PlantedCliUserinfo0105"
SLASH_SECRET = "PlantedCli/Slash+Secret0106"
ENDPOINT_USER = "plantedcliuser0107"
ENDPOINT_PASS = "PlantedCliEndpointPass0108"
SAS_SIG = "PlantedCliSasSig0109"
ACCOUNT_KEY = base64.b64encode(b"planted-cli-account-key-0110").decode()
CONNECTION_KEY = base64.b64encode(b"planted-cli-connection-key-0111").decode()
ENV_ACCOUNT_KEY = base64.b64encode(b"planted-cli-environment-key-0112").decode()

PLANTED = (
    AKID,
    S3_SECRET,
    S3_TOKEN,
    USERINFO_KEY,
    USERINFO_SECRET,
    SLASH_SECRET,
    *SLASH_SECRET.split("/"),
    ENDPOINT_USER,
    ENDPOINT_PASS,
    SAS_SIG,
    ACCOUNT_KEY,
    CONNECTION_KEY,
    ENV_ACCOUNT_KEY,
)
FAST = "connect_timeout=1&max_attempts=1"


def _closed_port() -> int:
    with socket.socket() as probe:  # bound, then closed: a connection to it is refused
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def unreachable_urls(port: int) -> list[str]:
    """Every form of a URL carrying a secret, pointed at ``port``."""
    endpoint = f"http://127.0.0.1:{port}"
    azure = f"{endpoint}/devstoreaccount1"
    sas = f"sv=2025-11-05&sp=rwdlact&sig={SAS_SIG}"
    connection = f"AccountName=devstoreaccount1;AccountKey={CONNECTION_KEY};BlobEndpoint={azure}"
    keys = f"access_key_id={AKID}&secret_access_key={S3_SECRET}&session_token={S3_TOKEN}"
    return [
        f"s3://bucket/prefix?{keys}&endpoint_url={endpoint}&{FAST}",
        f"s3://{USERINFO_KEY}:{USERINFO_SECRET}@bucket/prefix?endpoint_url={endpoint}&{FAST}",
        f"s3a://{USERINFO_KEY}:{SLASH_SECRET}@bucket/prefix?endpoint_url={endpoint}&{FAST}",
        f"s3://bucket/prefix?{keys}&endpoint_url=http://{ENDPOINT_USER}:{ENDPOINT_PASS}@127.0.0.1:{port}&{FAST}",
        f"az://container/p?endpoint_url=http://{ENDPOINT_USER}:{ENDPOINT_PASS}@127.0.0.1:{port}/x&{FAST}",
        f"az://container/p?endpoint_url={quote(f'{azure}?{sas}', safe='')}&{FAST}",
        f"az://container@devstoreaccount1.blob.core.windows.net/p?sas_token={quote(sas, safe='')}",
        f"az://container/p?account_key={quote(ACCOUNT_KEY, safe='')}&endpoint_url={azure}",
        f"az://container/p?connection_string={quote(connection, safe='')}",
        f"abfss://{ENDPOINT_USER}:{ENDPOINT_PASS}@devstoreaccount1.dfs.core.windows.net/p",
        f"gs://{USERINFO_KEY}:{USERINFO_SECRET}@bucket/p?secret={S3_SECRET}",
    ]


def commands(
    url: str, tmp: Path, source: Path, *, variants: bool = True, rescale: bool = True
) -> list[list[str]]:
    """Every command that takes a location, on ``url``: with ``variants`` their options that show more
    (JSON, a version, a partition); ``rescale`` only where it is refused before a Spark session starts."""
    listed = [
        ["verify", url],
        ["lineage", url],
        ["inspect", url],
        ["inspect", url, "--partition", "0"],
        ["restore", url, str(tmp / "restored")],
        ["gc", url],
        ["report", url, "--out", str(tmp / "report")],
        ["backup", str(source), url],
        ["accept-loss", url, "--version", "1"],  # refused: nothing is lost
    ]
    if variants:
        listed += [
            ["verify", url, "--json", "--checksums"],
            ["lineage", url, "--json"],
            ["lineage", url, "--version", "1"],
            ["lineage", url, "--partition", "0"],
            ["restore", url, str(tmp / "restored-partition"), "--partition", "0"],
            ["gc", url, "--full", "--dry-run", "--json"],
        ]
    if rescale:
        listed.append(["rescale", url, "--partitions", "2"])
    return listed


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run ``blobstate args`` as the console script does; its exit status and everything it printed,
    checked to show no planted secret."""
    try:
        main(args)
        status = 0
    except SystemExit as exited:
        status = exited.code if isinstance(exited.code, int) else 1
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert "Usage:" not in printed, (args, printed)  # the command ran (not refused for its arguments)
    for secret in PLANTED:
        assert secret not in printed and quote(secret, safe="") not in printed, (secret, args, printed)
    return status, printed


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A small directory to back up."""
    directory = tmp_path / "source"
    (directory / "sub").mkdir(parents=True)
    (directory / "a.txt").write_text("a")
    (directory / "sub" / "b.bin").write_bytes(b"b" * 100)
    return directory


def test_no_command_shows_a_secret_of_an_unreachable_location(
    tmp_path: Path, source: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in (
        "BLOBSTATE_S3_ENDPOINT",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT_URL",
        "BLOBSTATE_AZURE_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", ENV_ACCOUNT_KEY)
    for url in unreachable_urls(_closed_port()):
        for args in commands(url, tmp_path, source, variants=False):
            status, printed = _run(args, capsys)
            assert status == 1 and printed.startswith("error: "), (args, printed)
            assert len(printed.strip().splitlines()) == 1, printed
            if args[0] in ("verify", "backup"):  # a read and a write: the traceback behind the line
                status, printed = _run([*args, "--debug"], capsys)
                assert status == 1 and "Traceback" in printed, (args, printed)


def test_no_command_shows_the_s3_keys_of_its_url(
    s3_url: str, s3_endpoint: str, tmp_path: Path, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = f"access_key_id={AKID}&secret_access_key={S3_SECRET}&session_token={S3_TOKEN}"

    def at(prefix: str) -> str:
        return f"{s3_url}/{prefix}?{keys}&endpoint_url={quote(s3_endpoint, safe='')}&max_attempts=1"

    # An empty location: every command refuses it, naming it.
    for args in commands(at("empty"), tmp_path / "empty", source, variants=False):
        assert _run(args, capsys)[0] != 0 or args[0] == "backup", args
    # A backup repository: backup, inspect, restore, verify and gc print what they did.
    repository = at("repository")
    assert _run(["backup", str(source), repository], capsys)[0] == 0
    for args in commands(repository, tmp_path / "repository", source):
        _run(args, capsys)
    # A query checkpoint, then the same with a delta gone: verify lists problems naming the location.
    checkpoint = at("checkpoint")
    build_checkpoint(checkpoint, batches(2, rows=8), tmp_path / "local", num_partitions=1, retain=2)
    for args in commands(checkpoint, tmp_path / "checkpoint", source, rescale=False):
        _run(args, capsys)
    status, printed = _run(["gc", checkpoint], capsys)  # exit 1: no lifecycle rule on the test server
    assert f"checkpoint {s3_url}/checkpoint?access_key_id=***&secret_access_key=***" in printed, printed
    with open_blob_store(checkpoint) as store:
        for name in store.list("state/"):
            if name.endswith(".delta"):
                store.delete(name)
    status, printed = _run(["verify", checkpoint], capsys)
    assert status == 1 and f"problem(s) found in {s3_url}/checkpoint?" in printed, printed


def test_a_usage_error_quoting_a_url_hides_its_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://bucket/p?access_key_id={AKID}&secret_access_key={S3_SECRET}&session_token={S3_TOKEN}"
    with pytest.raises(SystemExit) as exited:
        main(["verify", str(tmp_path), url])  # one location too many: click quotes the extra argument
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unexpected extra argument" in err and "secret_access_key=***&session_token=***)" in err, err
    for secret in PLANTED:
        assert secret not in err
