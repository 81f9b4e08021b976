"""docs/protocol.md and the protocol's dataclasses must agree: a plugin is written from the doc."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openjarvis.daemon.handlers import METHODS
from openjarvis.daemon.protocol import ErrorCode, Notification, Request, Response, decode, encode

DOC = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()


def section(method: str) -> str:
    match = re.search(rf"^### {re.escape(method)}\n(.*?)(?=^### |\Z)", DOC, re.M | re.S)
    assert match, f"docs/protocol.md has no '### {method}' section"
    return match.group(1)


def result_type(method: str) -> type:
    hints = typing.get_type_hints(METHODS[method].handler)
    return hints["return"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_is_documented_with_its_fields_and_an_example(method: str) -> None:
    text = section(method)
    for f in dataclasses.fields(METHODS[method].params):
        assert f"`{f.name}`" in text, f"{method}: parameter {f.name} is not documented"
    for f in dataclasses.fields(result_type(method)):
        assert f"`{f.name}`" in text, f"{method}: result field {f.name} is not documented"
    assert f'"method":"{method}"' in text, f"{method}: no example exchange"


def test_every_error_code_is_in_the_table() -> None:
    for code in ErrorCode:
        assert f"| {int(code)} | {code.name} |" in DOC


json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text()
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=4))
ids = st.integers(0, 2**31) | st.text(min_size=1)
methods = st.text(min_size=1)
params = st.dictionaries(st.text(), json_values, max_size=5)


@given(
    st.one_of(
        st.builds(Request, ids, methods, params),
        st.builds(Notification, methods, params),
        st.builds(Response, ids, json_values),
    )
)
def test_codec_round_trips_and_frames_one_line(msg: Request | Notification | Response) -> None:
    line = encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line) == msg
