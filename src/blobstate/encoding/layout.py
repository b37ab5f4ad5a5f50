"""Column families the processor API keeps in a partition's store, and what their keys hold.

``kb`` is the encoded grouping key (:func:`blobstate.encoding.codec.encode_key`, prefix-free),
``ukb`` an encoded MapState user key, ``ts8`` a timestamp from :func:`codec.encode_ts` (sorts
numerically), ``v`` a value in the typed encoding of :mod:`blobstate.encoding.values` (format marker,
optional expiry, then the row(s) laid out by the state variable's schema; docs/FORMATS.md). Nothing
in these families is ever unpickled: keys are tagged, values schema-driven, ``$meta`` is JSON (read
as plain data, never turned into classes).

| column family        | key              | value                                   |
|----------------------|------------------|-----------------------------------------|
| ``<stateName>``      | ``kb``           | ValueState: ``v``                        |
|                      | ``kb``           | ListState head: ``be64(next chunk no.)`` |
|                      | ``kb + be64(n)`` | ListState chunk n: ``v`` of rows         |
|                      | ``kb + ukb``     | MapState entry: ``v``                    |
| ``$ttl:<stateName>`` | ``ts8 + kb[+ukb]`` | ``b""``: TTL index, swept at batch end |
| ``$timers``          | ``ts8 + kb``     | ``b""``: due timers are a range scan     |
| ``$timersByKey``     | ``kb + ts8``     | ``b""``: listTimers/deleteTimer per key  |
| ``$meta``            | ``var:<name>``   | JSON declaration of a state variable     |
|                      | ``timeMode``     | the operator's time mode                 |
| ``$adjunct:<name>``  | ``kb``           | a partitioned adjunct store's value ``v`` |
| ``$adjunct-deferred``| ``be64(version)``| main rows held during a bootstrap (Arrow IPC) |

User state names may not start with ``$`` (nor ``_``, reserved by Spark), so they never collide
with the internal families.
"""

from __future__ import annotations

from collections.abc import Mapping

META_CF = "$meta"
TIMERS_CF = "$timers"
TIMERS_BY_KEY_CF = "$timersByKey"
TTL_CF_PREFIX = "$ttl:"
ADJUNCT_CF_PREFIX = "$adjunct:"
"""The column family ``$adjunct:<name>`` of an adjunct store (a partitioned one in the partition's store,
a broadcast one in its own operator's)."""


def own_and_side_keys(keys_by_family: Mapping[str, int]) -> tuple[int, int]:
    """Key counts by column family split into the query's own state (every family but the side stores')
    and its partitioned side stores' (``$adjunct:<name>``), so that a side stream's rows never read as
    open state."""
    side = sum(n for cf, n in keys_by_family.items() if cf.startswith(ADJUNCT_CF_PREFIX))
    return sum(keys_by_family.values()) - side, side


TIME_MODE_KEY = b"timeMode"


def state_cf(state_name: str) -> str:
    """The column family of a user state variable."""
    return state_name


def ttl_cf(state_name: str) -> str:
    """The TTL index column family of a state variable."""
    return TTL_CF_PREFIX + state_name


def meta_key(state_name: str) -> bytes:
    """The ``$meta`` key of a state variable's declaration."""
    return b"var:" + state_name.encode("utf-8")
