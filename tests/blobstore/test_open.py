"""Opening a blob store by URL when an optional backend's dependency is missing."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["boto3"] = None  # as if blobstate were installed without its [s3] extra
from blobstate.blobstore import open_blob_store
try:
    open_blob_store("s3://bucket/prefix")
except ImportError as error:
    print(type(error).__name__, error)
"""


def test_an_s3_url_without_boto3_says_which_extra_to_install() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    assert out.strip() == (
        "BackendNotInstalledError s3://bucket/prefix is an S3 checkpoint, which needs boto3 (not installed):"
        " pip install 'blobstate[s3]'"
    )
