"""abicache.records.named_tuple: typing.NamedTuple's classes without compiling annotations."""

from __future__ import annotations

import pickle

import pytest

from abicache.records import named_tuple


@named_tuple
class Point:
    """A point."""

    x: int
    y: int = 0
    label: str = "p"

    @property
    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)

    def moved(self, dx: int) -> Point:
        return self._replace(x=self.x + dx)


def test_a_record_is_a_named_tuple_with_its_methods_defaults_and_docstring() -> None:
    p = Point(3, -4)
    assert p == (3, -4, "p") and isinstance(p, tuple) and p._fields == ("x", "y", "label")
    assert (p.x, p.y, p.label, p.norm1) == (3, -4, "p", 7)
    assert type(p.moved(1)) is Point and p.moved(1).x == 4
    assert Point._make([1, 2, "q"]) == Point(1, 2, "q") and Point(1)._asdict() == {"x": 1, "y": 0, "label": "p"}
    assert Point.__doc__ == "A point." and Point.__name__ == "Point" and Point.__module__ == __name__
    assert repr(p) == "Point(x=3, y=-4, label='p')"
    again = pickle.loads(pickle.dumps(p))
    assert again == p and type(again) is Point
    with pytest.raises(AttributeError):
        p.z = 1  # type: ignore[attr-defined]  # no __dict__: as small as a tuple


def test_annotations_are_not_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """typing.NamedTuple makes a ForwardRef of each annotation's text and compiles it (the
    cost this module removes); named_tuple makes none."""
    import typing

    def refused(self: object, *args: object, **kwargs: object) -> None:
        raise AssertionError("a ForwardRef was made")

    monkeypatch.setattr(typing.ForwardRef, "__init__", refused)
    with pytest.raises(AssertionError, match="ForwardRef"):

        class Typed(typing.NamedTuple):
            a: int

    @named_tuple
    class Plain:
        a: int

    assert Plain(1).a == 1


def test_a_field_without_a_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="without a default follows"):

        @named_tuple
        class Bad:
            a: int = 0
            b: int
