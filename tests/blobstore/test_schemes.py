"""The scheme registry: one place that knows what each kind of blob store location means."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from blobstate.blobstore import open_blob_store
from blobstate.blobstore.local import LocalBlobStore
from blobstate.blobstore.memory import MemoryBlobStore
from blobstate.blobstore.s3_options import S3OptionError
from blobstate.blobstore.schemes import (
    AZURE,
    LOCAL,
    MEMORY,
    S3,
    SCHEMES,
    NoHadoopLocationError,
    UnsupportedSchemeError,
    hadoop_location,
    location_without_options,
    normalize_location,
    scheme_of,
    url_forms,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "blobstate"


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("/data/ckpt", LOCAL),
        ("relative/ckpt", LOCAL),
        ("file:///data/ckpt", LOCAL),
        ("memory://tests", MEMORY),
        ("s3://bucket/ckpt?read_timeout=5", S3),
        ("s3a://bucket/ckpt", S3),
        ("az://box/ckpt", AZURE),
        ("abfs://box@acct.dfs.core.windows.net/ckpt", AZURE),
        ("abfss://box@acct.dfs.core.windows.net/ckpt", AZURE),
    ],
)
def test_every_url_form_has_one_scheme(url: str, scheme: object) -> None:
    assert scheme_of(url) is scheme


def test_an_unknown_scheme_is_one_line_naming_the_url_and_the_known_schemes() -> None:
    with pytest.raises(UnsupportedSchemeError) as caught:
        scheme_of("gs://bucket/ckpt?token=x")
    message = str(caught.value)
    assert "'gs://bucket/ckpt'" in message and "token" not in message and "\n" not in message
    for name in ("file://", "s3://", "s3a://", "az://", "abfss://", "memory://"):
        assert name in message


def test_hadoop_locations_are_where_spark_writes_beside_the_store(tmp_path: Path) -> None:
    assert hadoop_location("s3://bucket/ckpt/") == "s3a://bucket/ckpt"
    assert hadoop_location("s3://bucket/ckpt?max_attempts=2") == "s3a://bucket/ckpt"
    assert hadoop_location("s3a://bucket/ckpt") == "s3a://bucket/ckpt"
    account = "abfss://box@acct.dfs.core.windows.net/ckpt"
    assert hadoop_location(account) == account
    assert hadoop_location("az://box@acct.blob.core.windows.net/ckpt") == account
    assert hadoop_location(f"file://{tmp_path}") == str(tmp_path)
    with pytest.raises(NoHadoopLocationError, match="az://box/ckpt names no storage account"):
        hadoop_location("az://box/ckpt")
    with pytest.raises(NoHadoopLocationError, match="memory://x is a memory location, which Spark cannot"):
        hadoop_location("memory://x")


def test_options_travel_in_the_url_and_come_off_again() -> None:
    url = S3.url_with_options("s3://bucket/ckpt", {"read_timeout": 7.5})
    assert url == "s3://bucket/ckpt?read_timeout=7.5"
    assert location_without_options(url) == "s3://bucket/ckpt"
    with pytest.raises(S3OptionError, match=r"read_timeout is 9\.0 in the URL"):
        S3.url_with_options("s3://bucket/ckpt?read_timeout=9", {"read_timeout": 7.5})
    assert AZURE.url_with_options("az://box/ckpt", {"max_attempts": 3}) == "az://box/ckpt?max_attempts=3"
    assert location_without_options("az://box/ckpt/?max_attempts=3") == "az://box/ckpt"
    assert location_without_options("/data/ckpt") == "/data/ckpt"
    assert LOCAL.url_with_options("/data/ckpt", {}) == "/data/ckpt"
    with pytest.raises(UnsupportedSchemeError, match="'/data/ckpt' takes no options, got read_timeout"):
        LOCAL.url_with_options("/data/ckpt", {"read_timeout": 5})


def test_locations_are_normalized_to_one_spelling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert normalize_location("ckpt") == str(tmp_path / "ckpt")
    assert normalize_location("file:///data/ckpt") == "/data/ckpt"
    assert normalize_location("s3://bucket/ckpt/") == "s3://bucket/ckpt"


def test_a_file_url_is_spelled_as_the_local_store_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the spelling cut ``file://`` off and took the rest for a path below the working directory:
    ``file://localhost/data`` became ``<cwd>/localhost/data``, and a URL naming another host (or carrying
    a user and password) a directory of that name, its password in every message that named it."""
    from blobstate.blobstore.local import LocalPathError

    monkeypatch.chdir(tmp_path)
    assert normalize_location("file://localhost/data/ckpt") == "/data/ckpt"
    assert normalize_location("file:///data/a%20b") == "/data/a b"
    with pytest.raises(LocalPathError, match="names host") as refused:
        normalize_location("file://user:Secret0001@host/tmp/ckpt")
    assert "Secret0001" not in str(refused.value)


def test_each_scheme_opens_its_store(tmp_path: Path) -> None:
    with open_blob_store(str(tmp_path)) as local, open_blob_store("memory://schemes") as memory:
        assert isinstance(local, LocalBlobStore) and isinstance(memory, MemoryBlobStore)
    # s3a:// is Hadoop's name for S3: the same bucket and prefix as s3:// (opening makes no request)
    with open_blob_store("s3a://bucket/ckpt", endpoint_url="http://127.0.0.1:1") as store:
        assert (store.url, type(store).__name__) == ("s3://bucket/ckpt", "S3BlobStore")


def test_the_command_line_help_names_every_scheme() -> None:
    forms = url_forms()
    for scheme in SCHEMES:
        assert scheme.forms in forms
    assert forms.endswith(", or memory:// (tests)")


URL_PREFIX = re.compile(r"^(file|memory|s3a?|s3n|az|abfss?|wasbs?|gs|hdfs)://")


def _prefix_tests(path: Path, root: Path = SRC.parent) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr not in ("startswith", "removeprefix", "partition", "split"):
                continue
            for arg in node.args:
                texts = arg.elts if isinstance(arg, ast.Tuple) else [arg]
                for text in texts:
                    is_text = isinstance(text, ast.Constant) and isinstance(text.value, str)
                    if is_text and URL_PREFIX.match(text.value):
                        found.append(f"{path.relative_to(root)}:{node.lineno} {text.value!r}")
    return found


def test_no_module_outside_the_blob_store_layer_tests_a_url_prefix() -> None:
    offending = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if "blobstore" not in path.relative_to(SRC).parts
        for hit in _prefix_tests(path)
    ]
    assert not offending, "ask blobstate.blobstore.schemes instead of testing URL prefixes:\n" + "\n".join(
        offending
    )


def test_the_prefix_check_finds_a_prefix_test(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text('def f(url: str) -> bool:\n    return url.startswith(("az://", "x"))\n')
    assert _prefix_tests(module, tmp_path) == ["probe.py:2 'az://'"]
