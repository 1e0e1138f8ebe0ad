"""A status line matched by a learned shape reads to the same fields as `_TOKEN_RE.findall`
(what `launcher.verify.parse._Shapes` promises): on lines of that shape, on lines cut off inside
a list or a string, and on lines of any other shape."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.verify.parse import _TOKEN_RE, _fields, _Shapes

KEYS = st.sampled_from(["step", "loss", "q_pre", "q_hs", "lr", "x.y", "a/b"])
VALUES = st.sampled_from(
    ["12", "1.5e-3", "---", "[8, 7, 6]", "[4", "[]", '"ab c"', '"ab', "0.30b/s", "]", "", "("]
)
GAPS = st.sampled_from([" ", "  ", " | ", "|", "\t"])
RATES = st.sampled_from(["(1.9Ktok/s)", "(12tok/s)", "( 3 Ktok/s )"])


@st.composite
def same_keys(draw: st.DrawFn) -> list[str]:
    """Lines with the same keys in the same order (as a trainer prints them), values varying."""
    skeleton = [
        (draw(GAPS), draw(RATES) if draw(st.integers(0, 5)) == 0 else draw(KEYS) + "=")
        for _ in range(draw(st.integers(min_value=1, max_value=6)))
    ]
    found = []
    for _ in range(draw(st.integers(min_value=2, max_value=5))):
        parts = ["[3m]"]
        for gap, field in skeleton:
            parts += [gap, field, draw(VALUES) if field.endswith("=") else ""]
        parts.append(draw(st.sampled_from(["", " ", " |", "!"])))
        found.append("".join(parts))
    return found


def by_findall(line: str) -> dict[str, str | None]:
    fields = _fields(dict(_TOKEN_RE.findall(line, 4)))
    return {key: fields.raw(key) for key in fields}


def test_an_unclosed_list_is_not_read_as_a_shorter_one() -> None:
    shapes = _Shapes()
    learned = "[3m] q=[1, 2] b=3"
    shapes.fields(learned, 4)  # learns `q=[…] b=…`
    cut = "[3m] q=[1, 2 b=3"  # the list never closes: findall takes it to the line's end
    fields = shapes.fields(cut, 4)
    assert {key: fields.raw(key) for key in fields} == by_findall(cut) == {"q": "[1, 2 b=3"}


@settings(max_examples=500, deadline=None)
@given(first=same_keys(), then=same_keys())
def test_a_shape_reads_what_findall_reads(first: list[str], then: list[str]) -> None:
    shapes = _Shapes()
    for line in [*first, *then]:  # a shape learned from the first lines, then others'
        fields = shapes.fields(line, 4)
        assert {key: fields.raw(key) for key in fields} == by_findall(line), line
