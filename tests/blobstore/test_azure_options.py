"""Azure URLs, options and the choice of credentials (no server needed)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from blobstate.blobstore.azure import AZURITE_KEY, resolve_credentials
from blobstate.blobstore.azure_options import (
    AzureOptionError,
    AzureSettings,
    azure_options_from_spark_conf,
    azure_url_with_options,
    hadoop_url,
    parse_azure_url,
    parse_connection_string,
)
from blobstate.blobstore.base import BlobStoreError


# --------------------------------------------------------------------------- URLs
@pytest.mark.parametrize(
    ("url", "container", "prefix", "account", "host"),
    [
        ("az://state/checkpoints/q1", "state", "checkpoints/q1/", None, None),
        ("az://state", "state", "", None, None),
        ("az://state/", "state", "", None, None),
        ("az://state@acct.blob.core.windows.net/p", "state", "p/", "acct", "acct.blob.core.windows.net"),
        ("abfs://state@acct.dfs.core.windows.net/a/b", "state", "a/b/", "acct", "acct.blob.core.windows.net"),
        (
            "abfss://state@acct.dfs.core.chinacloudapi.cn/x",
            "state",
            "x/",
            "acct",
            "acct.blob.core.chinacloudapi.cn",
        ),
        ("az://state/p?read_timeout=3", "state", "p/", None, None),
    ],
)
def test_azure_urls_name_container_prefix_and_account(
    url: str, container: str, prefix: str, account: str | None, host: str | None
) -> None:
    location = parse_azure_url(url)
    assert (location.container, location.prefix, location.account, location.blob_host) == (
        container,
        prefix,
        account,
        host,
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("abfss://state/p", "names no account"),
        ("az://ab/p", "invalid container name 'ab'"),
        ("az://Upper/p", "invalid container name 'Upper'"),
        ("az://a--b/p", "invalid container name"),
        ("az://state/../x", "invalid prefix"),
        ("s3://state/p", "not an Azure URL"),
        ("az://state/p#frag", "fragment"),
    ],
)
def test_bad_azure_urls_are_refused_naming_the_fault(url: str, message: str) -> None:
    with pytest.raises(AzureOptionError, match=message):
        parse_azure_url(url)


def test_options_from_the_query_and_keywords_are_checked_and_merged() -> None:
    location, settings = AzureSettings.resolve(
        "az://state/p?read_timeout=3&max_attempts=2", {"connect_timeout": "1.5", "max_attempts": 2}
    )
    assert location == "az://state/p"
    assert (settings.read_timeout, settings.connect_timeout, settings.max_attempts) == (3.0, 1.5, 2)
    with pytest.raises(AzureOptionError, match=r"max_attempts is 2 in the URL .* but 3 as an option"):
        AzureSettings.resolve("az://state/p?max_attempts=2", {"max_attempts": 3})
    with pytest.raises(AzureOptionError, match=r"unknown Azure option.*: region"):
        AzureSettings.resolve("az://state/p", {"region": "x"})
    with pytest.raises(AzureOptionError, match=r"list_page_size .* between 1 and 5000"):
        AzureSettings.resolve("az://state/p?list_page_size=9000", {})
    with pytest.raises(AzureOptionError, match=r"endpoint_url .* http"):
        AzureSettings.resolve("az://state/p", {"endpoint_url": "127.0.0.1:10000"})


def test_secrets_never_travel_in_the_url() -> None:
    with pytest.raises(AzureOptionError, match=r"secret option.*account_key") as info:
        AzureSettings.resolve("az://state/p?account_key=s3cret", {})
    assert "s3cret" not in str(info.value)
    with pytest.raises(AzureOptionError, match="sas_token are secrets"):
        azure_url_with_options("az://state/p", {"sas_token": "sv=1&sig=x"})
    assert azure_url_with_options("az://state/p", {"read_timeout": 3}) == "az://state/p?read_timeout=3.0"
    assert azure_url_with_options("az://state/p", {}) == "az://state/p"


def test_connection_strings_parse_values_containing_equals_signs() -> None:
    assert parse_connection_string("AccountName=a;AccountKey=k==;BlobEndpoint=http://h:1/a;") == {
        "AccountName": "a",
        "AccountKey": "k==",
        "BlobEndpoint": "http://h:1/a",
    }
    with pytest.raises(AzureOptionError, match="malformed"):
        parse_connection_string("just-a-key")


# --------------------------------------------------------------------------- credentials
def _resolve(url: str, env: dict[str, str], **options: Any) -> Any:
    location, settings = AzureSettings.resolve(url, options)
    return resolve_credentials(location, settings, env)


FULL_ENV = {
    "AZURE_STORAGE_CONNECTION_STRING": "AccountName=envacct;AccountKey=ZW52a2V5",
    "AZURE_STORAGE_ACCOUNT_NAME": "envacct",
    "AZURE_STORAGE_ACCOUNT_KEY": "a2V5",
    "AZURE_STORAGE_SAS_TOKEN": "?sv=2024&sig=env",
}


def test_explicit_options_win_over_the_environment_in_the_documented_order() -> None:
    by_string = _resolve("az://state/p", FULL_ENV, connection_string="AccountName=opt;AccountKey=b3B0")
    assert by_string.source == "connection string (option connection_string)"
    assert by_string.account_url == "https://opt.blob.core.windows.net"
    assert by_string.credential == {"account_name": "opt", "account_key": "b3B0"}
    by_key = _resolve("az://state/p", FULL_ENV, account_name="mine", account_key="bWluZQ==")
    assert by_key.source == "account key (option account_key)"
    assert by_key.credential == {"account_name": "mine", "account_key": "bWluZQ=="}
    assert by_key.account_url == "https://mine.blob.core.windows.net"
    by_sas = _resolve("az://state/p", FULL_ENV, sas_token="?sv=1&sig=opt")
    assert (by_sas.source, by_sas.credential) == ("SAS token (option sas_token)", "sv=1&sig=opt")


def test_environment_order_connection_string_then_key_then_sas() -> None:
    env = dict(FULL_ENV)
    assert _resolve("az://state/p", env).source == "connection string (AZURE_STORAGE_CONNECTION_STRING)"
    del env["AZURE_STORAGE_CONNECTION_STRING"]
    assert _resolve("az://state/p", env).source == "account key (AZURE_STORAGE_ACCOUNT_KEY)"
    del env["AZURE_STORAGE_ACCOUNT_KEY"]
    sas = _resolve("az://state/p", env)
    assert (sas.source, sas.credential) == ("SAS token (AZURE_STORAGE_SAS_TOKEN)", "sv=2024&sig=env")
    assert sas.account_url == "https://envacct.blob.core.windows.net"


def test_abfs_url_uses_the_accounts_blob_endpoint_and_the_endpoint_option_wins() -> None:
    url = "abfss://state@acct.dfs.core.usgovcloudapi.net/p"
    assert _resolve(url, {"AZURE_STORAGE_ACCOUNT_KEY": "a2V5"}).account_url == (
        "https://acct.blob.core.usgovcloudapi.net"
    )
    assert _resolve(url, {"AZURE_STORAGE_ACCOUNT_KEY": "a2V5"}).credential["account_name"] == "acct"
    local = _resolve(url, {"AZURE_STORAGE_ACCOUNT_KEY": "a2V5"}, endpoint_url="http://127.0.0.1:1/acct/")
    assert local.account_url == "http://127.0.0.1:1/acct"
    env = {"AZURE_STORAGE_SAS_TOKEN": "sig=x", "BLOBSTATE_AZURE_ENDPOINT": "http://127.0.0.1:2/a"}
    assert _resolve("az://state/p", env).account_url == "http://127.0.0.1:2/a"


def test_development_storage_connection_string_means_azurite() -> None:
    creds = _resolve("az://state/p", {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"})
    assert creds.account_url == "http://127.0.0.1:10000/devstoreaccount1"
    assert creds.credential == {"account_name": "devstoreaccount1", "account_key": AZURITE_KEY}


def test_a_connection_string_for_another_account_is_refused_naming_both() -> None:
    with pytest.raises(AzureOptionError, match=r"account 'acct' but the connection string .* 'other'"):
        _resolve(
            "az://state@acct.blob.core.windows.net/p",
            {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=other;AccountKey=eA=="},
        )


def test_a_key_without_an_account_name_says_where_to_give_it() -> None:
    with pytest.raises(AzureOptionError, match=r"needs the account's name.*AZURE_STORAGE_ACCOUNT_NAME"):
        _resolve("az://state/p", {"AZURE_STORAGE_ACCOUNT_KEY": "a2V5"})


def test_without_credentials_or_azure_identity_the_error_lists_every_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "azure.identity", None)  # as if azure-identity were not installed
    with pytest.raises(BlobStoreError) as info:
        _resolve("az://state@acct.blob.core.windows.net/p", {})
    message = str(info.value)
    for hint in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY", "azure-identity"):
        assert hint in message


def test_default_azure_credential_is_used_when_azure_identity_is_installed() -> None:
    pytest.importorskip("azure.identity")
    creds = _resolve("az://state@acct.blob.core.windows.net/p", {})
    assert creds.source == "DefaultAzureCredential"
    assert type(creds.credential).__name__ == "DefaultAzureCredential"


# --------------------------------------------------------------------------- missing package
SCRIPT = """
import sys
sys.modules["azure.storage.blob"] = None  # as if blobstate were installed without its [azure] extra
from blobstate.blobstore import open_blob_store
try:
    open_blob_store("az://state/prefix")
except ImportError as error:
    print(type(error).__name__, error)
"""


def test_an_azure_url_without_the_sdk_says_which_extra_to_install() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    assert out.strip() == (
        "BackendNotInstalledError az://state/prefix is an Azure checkpoint, which needs azure.storage.blob"
        " (not installed): pip install 'blobstate[azure]'"
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("az://state@acct.blob.core.windows.net/q/1", "abfss://state@acct.dfs.core.windows.net/q/1"),
        ("abfs://state@acct.dfs.core.windows.net/q", "abfss://state@acct.dfs.core.windows.net/q"),
        ("abfss://state@acct.dfs.core.windows.net", "abfss://state@acct.dfs.core.windows.net"),
        ("az://state/q", None),
    ],
)
def test_hadoop_url_names_the_same_location_for_sparks_own_checkpoint(url: str, expected: str | None) -> None:
    assert hadoop_url(url) == expected


def test_spark_conf_sets_azure_options_and_never_secrets() -> None:
    conf = {
        "spark.blobstate.azure.read_timeout": "60",
        "spark.blobstate.azure.account_name": "acct",
        "spark.blobstate.s3.read_timeout": "5",
        "spark.blobstate.snapshot_every": "3",
    }
    options = azure_options_from_spark_conf(conf)
    assert options == {"read_timeout": 60.0, "account_name": "acct"}
    assert (
        azure_url_with_options("az://state/p", options) == "az://state/p?account_name=acct&read_timeout=60.0"
    )
    with pytest.raises(AzureOptionError, match=r"spark\.blobstate\.azure\.account_key would show a secret"):
        azure_options_from_spark_conf({"spark.blobstate.azure.account_key": "k"})
    with pytest.raises(
        AzureOptionError,
        match=r"unknown Azure option.* in Spark conf spark\.blobstate\.azure\.<option>: region",
    ):
        azure_options_from_spark_conf({"spark.blobstate.azure.region": "x"})
