"""The changelog's bulk blocks encode exactly as the same records one by one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blobstate.lineage.changelog import Changelog, ChangeOp, PutBlock
from blobstate.lineage.delta import decode_delta, encode_delta

NAME = "state/0/0/1_0123abcd.delta"

single = st.one_of(
    st.tuples(st.just(ChangeOp.PUT), st.sampled_from(["a", "b", "ß"]), st.binary(max_size=6), st.binary()),
    st.tuples(st.just(ChangeOp.DELETE), st.sampled_from(["a", "c"]), st.binary(max_size=6), st.none()),
    st.tuples(st.just(ChangeOp.CLEAR), st.sampled_from(["b", "c"]), st.just(b""), st.none()),
)
block = st.tuples(
    st.sampled_from(["a", "b", "d"]),
    st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=9)), max_size=12),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(single.map(lambda r: ("one", r)), block.map(lambda b: ("block", b))), max_size=20))
def test_blocks_and_single_records_encode_as_the_same_records_one_by_one(steps: list) -> None:
    changelog = Changelog()
    model: list[tuple] = []
    for kind, step in steps:
        if kind == "one":
            changelog.append(step)
            model.append(step)
        else:
            cf, pairs = step
            changelog.add_puts(cf, [k for k, _ in pairs], [v for _, v in pairs])
            model.extend((ChangeOp.PUT, cf, k, v) for k, v in pairs)
        if len(model) % 3 == 0:  # the size is asked at any point, not only at the end
            assert changelog.nbytes == sum(len(cf) + len(k) + len(v or b"") for _, cf, k, v in model)
    assert list(changelog) == model
    assert len(changelog) == len(model)
    assert changelog.nbytes == sum(len(cf) + len(k) + len(v or b"") for _, cf, k, v in model)
    data = encode_delta(changelog, ["0123abcd"])
    assert data == encode_delta(model, ["0123abcd"])  # the same bytes as the records one by one
    assert decode_delta(data, name=NAME).records == model


def test_a_bad_value_in_a_block_is_named_by_its_record_number() -> None:
    changelog = Changelog()
    changelog.append((ChangeOp.DELETE, "a", b"x", None))
    changelog.add_puts("a", [b"k1", b"k2", b"k3"], [b"v1", "v2", b"v3"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"record #2 has a value of type str"):
        encode_delta(changelog, [])


def test_a_block_needs_a_value_per_key_and_an_empty_block_adds_nothing() -> None:
    changelog = Changelog()
    with pytest.raises(ValueError, match="as many values as keys"):
        changelog.add_puts("a", [b"k"], [])
    changelog.add_puts("a", [], [])
    assert len(changelog) == 0 and changelog.segments() == []
    changelog.add_puts("a", [b"k"], [b"v"])
    assert isinstance(changelog.segments()[0], PutBlock)
