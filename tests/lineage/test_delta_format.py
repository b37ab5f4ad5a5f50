"""The delta object format: round trips, size, and detection of every kind of damage."""

from __future__ import annotations

import os
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blobstate.ids import InvalidIdError
from blobstate.lineage.delta import (
    FORMAT_VERSION,
    MAGIC,
    ChangeOp,
    DeltaFormatError,
    decode_delta,
    encode_delta,
    read_delta_lineage,
)

NAME = "state/0/3/7_0123abcd.delta"
UIDS = ["d8e2ca47", "f4d05ac9" * 4, "4489578d"]

# The documented layout (docs/FORMATS.md), written out independently of delta.py so that tests can
# build deltas that are well-sealed yet wrong inside.
PREFIX = struct.Struct("<8sHHIQI")
TRAILER = struct.Struct("<QQI")


def seal(raw_body: bytes, lineage: list[str], count: int, *, uid_bytes: list[bytes] | None = None) -> bytes:
    """A delta with an uncompressed record section, built from the documented layout."""
    uids = uid_bytes if uid_bytes is not None else [u.encode() for u in lineage]
    lineage_bytes = b"".join(bytes([len(u)]) + u for u in uids)
    header_len = PREFIX.size + len(lineage_bytes) + 4
    total = header_len + len(raw_body) + TRAILER.size
    header = PREFIX.pack(MAGIC, FORMAT_VERSION, 0, header_len, total, len(uids)) + lineage_bytes
    header += struct.pack("<I", zlib.crc32(header))
    body_and_counts = header + raw_body + struct.pack("<QQ", count, len(raw_body))
    return body_and_counts + struct.pack("<I", zlib.crc32(body_and_counts))


def raw_body(
    records: list[tuple[int, int, bytes, bytes | None]], cfs: list[str], *, widths=(1, 1, 1)
) -> bytes:
    """The documented record section for records given as (op code, cf id, key, value)."""
    cf_width, key_width, value_width = widths
    fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}
    out = struct.pack("<I", len(cfs))
    for cf in cfs:
        out += struct.pack("<H", len(cf.encode())) + cf.encode()
    out += struct.pack("<QBBBB", len(records), cf_width, key_width, value_width, 0)
    out += bytes(op for op, _, _, _ in records)
    if cf_width:
        out += b"".join(struct.pack("<" + fmt[cf_width], cf) for _, cf, _, _ in records)
    out += b"".join(struct.pack("<" + fmt[key_width], len(k)) for _, _, k, _ in records)
    out += b"".join(struct.pack("<" + fmt[value_width], len(v)) for op, _, _, v in records if op == 1)
    out += b"".join(k for _, _, k, _ in records)
    out += b"".join(v for op, _, _, v in records if op == 1)
    return out


def patched(data: bytes, position: int, value: int) -> bytes:
    """``data`` with one byte replaced (offset 16 of a one-cf record section is the key-length width)."""
    return data[:position] + bytes([value]) + data[position + 1 :]


def sample_records() -> list[tuple]:
    return [
        (ChangeOp.PUT, "default", b"user-1", b"clicks=3"),
        (ChangeOp.PUT, "sessions", b"user-1", b""),
        (ChangeOp.DELETE, "default", b"user-2", None),
        (ChangeOp.CLEAR, "timers", b"", None),
        (ChangeOp.PUT, "timers", b"\x00\x01\x02", b"\xff" * 3),
        (ChangeOp.PUT, "default", b"", b"empty key is a key"),
    ]


def small_delta(*, compressible: bool) -> bytes:
    if compressible:
        records = [(ChangeOp.PUT, "default", b"key-%04d" % i, b"value " * 8) for i in range(20)]
    else:
        records = [(ChangeOp.PUT, "default", os.urandom(12), os.urandom(20)) for _ in range(3)]
        records.append((ChangeOp.DELETE, "other", os.urandom(12), None))
    data = encode_delta(records, UIDS[:2])
    flags = struct.unpack_from("<H", data, 10)[0]
    assert bool(flags & 1) == compressible, "the test needs one compressed and one plain delta"
    return data


# ---------------------------------------------------------------------------------------------- round trips
def test_round_trip_keeps_records_in_order_and_lineage() -> None:
    records = sample_records()
    data = encode_delta(records, UIDS)
    delta = decode_delta(data, name=NAME)
    assert delta.format_version == FORMAT_VERSION
    assert delta.lineage == UIDS
    assert delta.records == records
    assert all(isinstance(r[0], ChangeOp) for r in delta.records)
    # b"" and None stay distinct: a PUT of an empty value is not a delete.
    assert delta.records[1][3] == b"" and delta.records[2][3] is None


def test_empty_delta_and_empty_lineage_round_trip() -> None:
    delta = decode_delta(encode_delta([], []), name=NAME)
    assert delta.lineage == [] and delta.records == []


def test_one_column_family_and_wide_lengths_round_trip() -> None:
    records = [
        (ChangeOp.PUT, "big", b"k" * 300, os.urandom(70_000)),
        (ChangeOp.PUT, "big", b"", b"x"),
        (ChangeOp.DELETE, "big", b"k" * 70_000, None),
    ]
    assert decode_delta(encode_delta(records, []), name=NAME).records == records


def test_many_column_families_round_trip() -> None:
    records = [(ChangeOp.PUT, f"cf-{i % 300}-é", b"%d" % i, b"v") for i in range(1000)]
    assert decode_delta(encode_delta(records, UIDS), name=NAME).records == records


def test_equal_length_keys_keep_trailing_zero_bytes() -> None:
    records = [(ChangeOp.PUT, "default", b"k\x00\x00", b"\x00") for _ in range(5)]
    records += [(ChangeOp.PUT, "default", b"\x00\x00\x00", b"\x00\x00\x00\x00")]
    assert decode_delta(encode_delta(records, []), name=NAME).records == records


def test_read_lineage_needs_only_the_header() -> None:
    data = encode_delta(sample_records(), UIDS)
    header_len = struct.unpack_from("<I", data, 12)[0]
    assert read_delta_lineage(data, name=NAME) == UIDS
    assert read_delta_lineage(data[:header_len], name=NAME) == UIDS
    with pytest.raises(DeltaFormatError, match="truncated"):
        read_delta_lineage(data[: header_len - 1], name=NAME)


def test_independent_writer_matches_the_documented_layout() -> None:
    records = [(1, 0, b"a", b"1"), (2, 1, b"bb", None), (3, 1, b"", None)]
    data = seal(raw_body(records, ["x", "y"]), UIDS, 3)
    assert decode_delta(data, name=NAME).records == [
        (ChangeOp.PUT, "x", b"a", b"1"),
        (ChangeOp.DELETE, "y", b"bb", None),
        (ChangeOp.CLEAR, "y", b"", None),
    ]


@settings(max_examples=150, deadline=None)
@given(
    records=st.lists(
        st.one_of(
            st.tuples(
                st.just(ChangeOp.PUT), st.sampled_from(["default", "a", "ß"]), st.binary(), st.binary()
            ),
            st.tuples(st.just(ChangeOp.DELETE), st.sampled_from(["default", "b"]), st.binary(), st.none()),
            st.tuples(st.just(ChangeOp.CLEAR), st.sampled_from(["default", "c"]), st.just(b""), st.none()),
        ),
        max_size=40,
    ),
    lineage=st.lists(st.text("0123456789abcdef", min_size=8, max_size=64), max_size=5),
)
def test_property_round_trip(records: list[tuple], lineage: list[str]) -> None:
    data = encode_delta(records, lineage)
    delta = decode_delta(data, name=NAME)
    assert delta.records == records
    assert delta.lineage == lineage
    assert read_delta_lineage(data, name=NAME) == lineage


# ---------------------------------------------------------------------------------------------- size
def test_incompressible_changelog_costs_at_most_1_2x_its_bytes() -> None:
    records = [(ChangeOp.PUT, "default", os.urandom(20), os.urandom(30)) for _ in range(2000)]
    changelog = sum(len(cf) + len(k) + len(v) for _, cf, k, v in records)
    assert len(encode_delta(records, UIDS)) <= 1.2 * changelog


def test_compressible_changelog_is_compressed() -> None:
    records = [(ChangeOp.PUT, "default", b"user-%08d" % i, b'{"count": 1}') for i in range(2000)]
    changelog = sum(len(cf) + len(k) + len(v) for _, cf, k, v in records)
    assert len(encode_delta(records, UIDS)) < 0.5 * changelog


# ---------------------------------------------------------------------------------------------- damage
@pytest.mark.parametrize("compressible", [True, False], ids=["zstd", "plain"])
def test_any_corrupt_byte_is_detected_and_names_the_object(compressible: bool) -> None:
    data = small_delta(compressible=compressible)
    for position in range(len(data)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[position] ^= flip
            with pytest.raises(DeltaFormatError) as caught:
                decode_delta(bytes(damaged), name=NAME)
            assert NAME in str(caught.value), (position, str(caught.value))


@pytest.mark.parametrize("compressible", [True, False], ids=["zstd", "plain"])
def test_truncation_at_every_length_is_detected(compressible: bool) -> None:
    data = small_delta(compressible=compressible)
    for length in range(len(data)):
        with pytest.raises(DeltaFormatError) as caught:
            decode_delta(data[:length], name=NAME)
        assert NAME in str(caught.value)
    header_len = struct.unpack_from("<I", data, 12)[0]
    with pytest.raises(DeltaFormatError, match=r"truncated: \d+ of \d+ bytes"):
        decode_delta(data[:-1], name=NAME)
    assert len(decode_delta(data, name=NAME).records) > 0
    assert header_len < len(data)


def test_trailing_bytes_are_rejected() -> None:
    data = encode_delta(sample_records(), UIDS)
    with pytest.raises(DeltaFormatError, match="unexpected bytes after the end"):
        decode_delta(data + b"\x00", name=NAME)


def test_bad_magic_is_named() -> None:
    data = encode_delta(sample_records(), [])
    with pytest.raises(DeltaFormatError, match="bad magic") as caught:
        decode_delta(b"PK\x03\x04" + data[4:], name=NAME)
    assert NAME in str(caught.value)
    with pytest.raises(DeltaFormatError, match="bad magic"):
        read_delta_lineage(b'{"json": true}', name=NAME)


def test_unknown_format_version_is_named() -> None:
    data = bytearray(encode_delta(sample_records(), UIDS))
    struct.pack_into("<H", data, 8, FORMAT_VERSION + 1)
    for read in (decode_delta, read_delta_lineage):
        with pytest.raises(DeltaFormatError, match=f"unknown format version {FORMAT_VERSION + 1}"):
            read(bytes(data), name=NAME)


@pytest.mark.parametrize("bad_uid", [b"../../xx", b"ABCDEF12", b"abc", b"\xff" * 9])
def test_bad_uid_in_lineage_is_rejected_even_when_well_sealed(bad_uid: bytes) -> None:
    data = seal(raw_body([], []), [], 0, uid_bytes=[b"0123abcd", bad_uid])
    for read in (decode_delta, read_delta_lineage):
        with pytest.raises(DeltaFormatError, match="bad uid in lineage: uid #1") as caught:
            read(data, name=NAME)
        assert NAME in str(caught.value)


def test_writing_a_bad_lineage_uid_is_refused() -> None:
    with pytest.raises(InvalidIdError, match="lineage uid #1"):
        encode_delta([], ["0123abcd", "../../x"])


def test_record_count_mismatch_is_named() -> None:
    records = [(1, 0, b"a", b"1"), (2, 0, b"b", None)]
    with pytest.raises(DeltaFormatError, match="record count mismatch"):
        decode_delta(seal(raw_body(records, ["x"], widths=(0, 1, 1)), [], 3), name=NAME)


def test_bad_op_is_named() -> None:
    records = [(1, 0, b"a", b"1"), (9, 0, b"b", None)]
    with pytest.raises(DeltaFormatError, match="bad op 9 in record #1"):
        decode_delta(seal(raw_body(records, ["x"], widths=(0, 1, 1)), [], 2), name=NAME)


@pytest.mark.parametrize(
    ("body", "count", "problem"),
    [
        (raw_body([(1, 5, b"a", b"1"), (1, 0, b"a", b"1")], ["x", "y"]), 2, "names column family #5 of 2"),
        (raw_body([(3, 0, b"k", None)], ["x"], widths=(0, 1, 1)), 1, "CLEAR with a non-empty key"),
        (raw_body([(1, 0, b"a", b"1")], ["x"], widths=(0, 1, 1)) + b"!", 1, "unexpected bytes at the end"),
        (raw_body([(1, 0, b"a", b"1")], ["x"], widths=(0, 1, 1))[:-1], 1, "runs past its end"),
        (
            patched(raw_body([(1, 0, b"a", b"1")], ["x"], widths=(0, 1, 1)), 16, 3),
            1,
            "key length column width 3",
        ),
        (raw_body([(1, 0, b"a", b"1")], ["x", "y"], widths=(0, 1, 1)), 1, "2 column families, no id column"),
    ],
)
def test_malformed_record_section_is_named(body: bytes, count: int, problem: str) -> None:
    with pytest.raises(DeltaFormatError, match=problem) as caught:
        decode_delta(seal(body, [], count), name=NAME)
    assert NAME in str(caught.value)


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ((7, "default", b"k", b"v"), "bad op 7"),
        (("PUT", "default", b"k", b"v"), "bad op 'PUT'"),
        ((ChangeOp.PUT, "default", b"k", None), "PUT with value None"),
        ((ChangeOp.DELETE, "default", b"k", b"v"), "DELETE with a value"),
        ((ChangeOp.CLEAR, "default", b"k", None), "CLEAR with a non-empty key"),
        ((ChangeOp.PUT, "default", "k", b"v"), "key of type str"),
        ((ChangeOp.PUT, "default", b"k", "v"), "value of type str"),
        ((ChangeOp.PUT, b"default", b"k", b"v"), "bad column family"),
        ((ChangeOp.PUT, "", b"k", b"v"), "bad column family"),
        ((ChangeOp.PUT, "default", b"k"), "has 3 fields"),
    ],
)
def test_malformed_records_are_refused_naming_the_record(record: tuple, problem: str) -> None:
    records = [(ChangeOp.PUT, "default", b"ok", b"ok"), (ChangeOp.DELETE, "default", b"ok", None), record]
    with pytest.raises((TypeError, ValueError), match=f"record #2 .*{problem}|{problem}") as caught:
        encode_delta(records, [])
    assert "#2" in str(caught.value)
