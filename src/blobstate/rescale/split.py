"""Splitting one old partition's store by the new partition of each record's grouping key.

Every column family the processor keeps (``blobstate.encoding.layout``) holds the encoded grouping key
``kb`` at a fixed place in each record's key: at the start (value, list and map state, ``$timersByKey``,
a partitioned adjunct store's ``$adjunct:<name>``) or after an 8-byte timestamp (``$ttl:<name>``,
``$timers``). A record goes where its grouping key goes: ``pmod(hash(key columns), N)`` as Spark
computes it (:mod:`blobstate.rescale.murmur3`). ``$meta`` (declarations, time mode) goes to every new
partition. Only the grouping key is decoded; values are copied as they are.

Each old partition also proves the hash: with M > 1 old partitions, every key it holds must hash to it
under M (Spark put it there), so a hash that differs from Spark's for the stored key types stops the
rescale before anything is committed.

Records travel in chunks: the body of a delta object (:mod:`blobstate.lineage.delta`, CRC-checked, no
pickle) with an empty lineage, at most :data:`CHUNK_RECORDS` records or about :data:`CHUNK_BYTES` bytes
each, so neither side holds more than a chunk per target in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pyspark.sql.types import BinaryType, ByteType, IntegerType, LongType, ShortType, StringType, StructType

from blobstate.encoding.codec import decode_key
from blobstate.encoding.layout import META_CF, TIMERS_BY_KEY_CF, TIMERS_CF, TTL_CF_PREFIX
from blobstate.errors import StateError
from blobstate.lineage.changelog import ChangeOp, PutBlock
from blobstate.lineage.delta import decode_delta, encode_delta
from blobstate.rescale.keys import KeyForm
from blobstate.rescale.murmur3 import (
    hash_bytes_column,
    hash_int32_column,
    hash_int64_column,
    pmod,
    spark_hash,
)

CHUNK_RECORDS = 20_000
"""Records per chunk sent to one new partition."""
CHUNK_BYTES = 4 * 1024 * 1024
"""About the most key and value bytes per chunk."""

ADJUNCT_CF_PREFIX = "$adjunct:"
DEFERRED_CF = "$adjunct-deferred"
_OFFSET = np.uint64(1 << 63)
_TERM = b"\x00\x00"
_TAG_INT, _TAG_STR, _TAG_BYTES = 0x03, 0x06, 0x07
"""Tags of a key component (:mod:`blobstate.encoding.codec`) that :meth:`KeyRouter.grouping_keys` and
:meth:`KeyRouter.hashes` read without decoding: a 64-bit int, and escaped, terminated text or bytes."""


class RescaleError(StateError, RuntimeError):
    """A rescale that cannot proceed; the message names the checkpoint, partition or object at fault."""


def key_offset(cf: str) -> int | None:
    """Where the grouping key starts in the keys of column family ``cf`` (None: ``$meta``, copied whole).

    Raises :class:`RescaleError` for a column family the rescale does not know how to split."""
    if cf == META_CF:
        return None
    if cf == TIMERS_CF or cf.startswith(TTL_CF_PREFIX):
        return 8
    if cf == TIMERS_BY_KEY_CF or cf.startswith(ADJUNCT_CF_PREFIX) or not cf.startswith("$"):
        return 0
    raise RescaleError(f"column family {cf!r} is not one a rescale can split by key")


@dataclass
class SplitStats:
    """What splitting one old partition did."""

    records: int = 0
    keys_checked: int = 0
    chunks: int = 0
    by_target: dict[int, int] = field(default_factory=dict)


class KeyRouter:
    """The new partition of encoded grouping keys, checked against the old partition they came from."""

    def __init__(
        self, key_schema: StructType, new_partitions: int, old_partitions: int, old_partition: int, where: str
    ) -> None:
        self.schema = key_schema
        self.arity = len(key_schema.fields)
        self.n = new_partitions
        self.m = old_partitions
        self.p = old_partition
        self.where = where
        only = key_schema.fields[0].dataType if self.arity == 1 else None
        self._fast64 = isinstance(only, LongType)
        self._fast32 = isinstance(only, (IntegerType, ShortType, ByteType))
        self._text_tag = (
            _TAG_STR if isinstance(only, StringType) else _TAG_BYTES if isinstance(only, BinaryType) else None
        )
        self.checked = 0

    def hashes(self, kbs: list[bytes]) -> np.ndarray:
        """Spark's hash of each encoded grouping key."""
        if (self._fast64 or self._fast32) and kbs and all(len(k) == 9 and k[0] == 3 for k in kbs):
            raw = np.frombuffer(b"".join(kbs), dtype=np.uint8).reshape(len(kbs), 9)[:, 1:]
            ints = (raw.copy().view(">u8").reshape(-1) ^ _OFFSET).view(np.int64)
            return hash_int64_column(ints) if self._fast64 else hash_int32_column(ints.astype(np.int32))
        if self._text_tag is not None and kbs:
            bodies = self._text_bodies(kbs, self._text_tag)
            if bodies is not None:
                return hash_bytes_column(bodies)
        memo: dict[bytes, int] = {}
        out = np.empty(len(kbs), dtype=np.int32)
        for i, kb in enumerate(kbs):
            h = memo.get(kb)
            if h is None:
                key, end = decode_key(kb, self.arity)
                if end != len(kb):
                    raise RescaleError(f"{self.where}: a stored grouping key has {len(kb) - end} extra bytes")
                try:
                    h = memo[kb] = spark_hash(key, self.schema)
                except (TypeError, ValueError, AttributeError, ArithmeticError) as error:
                    raise RescaleError(
                        f"{self.where}: the grouping key {key!r} does not fit the key schema "
                        f"{self.schema.simpleString()} ({error}): the key schema recorded in metadata.json "
                        "does not match the stored keys; nothing was committed"
                    ) from None
            out[i] = h
        return out

    @staticmethod
    def _text_bodies(kbs: list[bytes], tag: int) -> list[bytes] | None:
        """The unescaped bytes of each key if every one is a single text component of ``tag`` (what Spark
        hashes: a string's UTF-8 bytes); None if one is not (a null key, say)."""
        bodies = []
        for kb in kbs:
            if kb[0] != tag or kb.find(_TERM, 1) != len(kb) - 2:
                return None
            bodies.append(kb[1:-2].replace(b"\x00\x01", b"\x00"))
        return bodies

    def targets(self, kbs: list[bytes]) -> np.ndarray:
        """``pmod(hash, N)`` of each key, after checking ``pmod(hash, M)`` is the old partition."""
        hashes = self.hashes(kbs)
        if self.m > 1:
            old = pmod(hashes, self.m)
            wrong = np.flatnonzero(old != self.p)
            if len(wrong):
                i = int(wrong[0])
                key, _ = decode_key(kbs[i], self.arity)
                raise RescaleError(
                    f"{self.where}: the grouping key {key!r} is stored in partition {self.p}, but "
                    f"Spark's hash of it as {self.schema.simpleString()} puts it in partition "
                    f"{int(old[i])} of {self.m}: the key schema recorded in metadata.json does not "
                    "match the stored keys; nothing was committed"
                )
        self.checked += len(kbs)
        return pmod(hashes, self.n)


def grouping_keys(cf: str, keys: list[bytes], offset: int, arity: int, where: str) -> list[bytes]:
    """The encoded grouping key inside each of ``keys`` (of column family ``cf``) at ``offset``."""
    out = []
    for k in keys:
        tag = k[offset] if arity == 1 and len(k) > offset else None
        if tag in (_TAG_STR, _TAG_BYTES):  # one text component: up to its terminator
            end = k.find(_TERM, offset + 1)
            if end >= 0:
                out.append(k[offset : end + 2])
                continue
        elif tag == _TAG_INT and len(k) >= offset + 9:
            out.append(k[offset : offset + 9])
            continue
        try:
            _, end = decode_key(k, arity, offset)
        except (ValueError, IndexError) as error:
            raise RescaleError(
                f"{where}: a key of column family {cf!r} is not a grouping key: {error}"
            ) from None
        out.append(k[offset:end])
    return out


@dataclass
class RecordBlock:
    """Records of one column family in the order stored, keyed as this release stores them."""

    cf: str
    keys: list[bytes]
    values: list[bytes]
    grouping: list[bytes] | None
    """Each record's encoded grouping key (None: ``$meta``, which every new partition gets)."""


def record_blocks(store: Any, form: KeyForm, where: str) -> Iterator[RecordBlock]:
    """Every record of ``store`` (a RocksStateStore) in blocks of at most :data:`CHUNK_RECORDS` records
    or about :data:`CHUNK_BYTES` bytes, each record's grouping key converted by ``form``."""
    for cf in sorted(store.column_families()):
        if cf == DEFERRED_CF:
            if next(iter(store.items(cf)), None) is not None:
                raise RescaleError(
                    f"{where}: main rows are held back while an adjunct store bootstraps "
                    f"({DEFERRED_CF}); run the query until the bootstrap finished, then rescale"
                )
            continue
        offset = key_offset(cf)
        if offset is None:
            items = list(store.items(cf))
            yield RecordBlock(cf, [k for k, _ in items], [v for _, v in items], None)
            continue
        keys: list[bytes] = []
        values: list[bytes] = []
        size = 0
        for k, v in store.items(cf):
            keys.append(k)
            values.append(v)
            size += len(k) + len(v)
            if len(keys) >= CHUNK_RECORDS or size >= CHUNK_BYTES:
                yield _keyed_block(cf, keys, values, offset, form, where)
                keys, values, size = [], [], 0
        if keys:
            yield _keyed_block(cf, keys, values, offset, form, where)


def _keyed_block(
    cf: str, keys: list[bytes], values: list[bytes], offset: int, form: KeyForm, where: str
) -> RecordBlock:
    kbs = grouping_keys(cf, keys, offset, form.arity, where)
    if not form.converts:
        return RecordBlock(cf, keys, values, kbs)
    memo: dict[bytes, bytes] = {}
    new_keys, new_kbs = [], []
    for k, kb in zip(keys, kbs, strict=True):
        new = memo.get(kb)
        if new is None:
            new = memo[kb] = form.convert(kb)[0]
        new_kbs.append(new)
        new_keys.append(k[:offset] + new + k[offset + len(kb) :])
    return RecordBlock(cf, new_keys, values, new_kbs)


def grouping_key(cf: str, key: bytes, arity: int) -> bytes:
    """The encoded grouping key inside ``key`` of column family ``cf``."""
    offset = key_offset(cf)
    assert offset is not None
    _, end = decode_key(key, arity, offset)
    return key[offset:end]


def split_store(
    store: Any, router: KeyRouter, stats: SplitStats, form: KeyForm | None = None
) -> Iterator[tuple[int, bytes]]:
    """``(new partition, chunk)`` pairs holding every record of ``store`` (a RocksStateStore), each
    record in the chunks of its key's new partition, ``$meta`` in every new partition's; keys converted
    by ``form`` (default: kept)."""
    n = router.n
    for block in record_blocks(store, form or KeyForm(router.arity), router.where):
        if block.grouping is None:
            meta = [(ChangeOp.PUT, block.cf, k, v) for k, v in zip(block.keys, block.values, strict=True)]
            for target in range(n):
                stats.chunks += 1
                yield target, encode_delta(meta, ())
            continue
        yield from _route(block.cf, block.keys, block.values, block.grouping, router, stats)


def _route(
    cf: str, keys: list[bytes], values: list[bytes], kbs: list[bytes], router: KeyRouter, stats: SplitStats
) -> Iterator[tuple[int, bytes]]:
    targets = router.targets(kbs)
    stats.records += len(keys)
    stats.keys_checked = router.checked
    order = np.argsort(targets, kind="stable")
    bounds = np.flatnonzero(np.diff(targets[order])) + 1
    key_array, value_array = np.empty(len(keys), dtype=object), np.empty(len(values), dtype=object)
    key_array[:], value_array[:] = keys, values
    for group in np.split(order, bounds):
        if not len(group):
            continue
        target = int(targets[group[0]])
        block = PutBlock(cf, key_array[group].tolist(), value_array[group].tolist())
        stats.by_target[target] = stats.by_target.get(target, 0) + len(block)
        stats.chunks += 1
        yield target, encode_delta(block, ())


def chunk_records(chunk: bytes, where: str) -> list[Any]:
    """The records of one chunk (checked: a chunk is a delta object with an empty lineage)."""
    delta = decode_delta(chunk, name=where)
    if delta.lineage:
        raise RescaleError(f"{where}: a rescale chunk names a lineage")
    return delta.records


__all__ = [
    "CHUNK_BYTES",
    "CHUNK_RECORDS",
    "KeyRouter",
    "RecordBlock",
    "RescaleError",
    "SplitStats",
    "chunk_records",
    "grouping_key",
    "grouping_keys",
    "key_offset",
    "record_blocks",
    "split_store",
]
