"""abicache.values.records.named_tuple: typing.NamedTuple's classes without compiling annotations."""

from __future__ import annotations

import pickle

import pytest

from abicache.values.records import named_tuple


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
    assert Point.__match_args__ == Point._fields and Point._field_defaults == {"y": 0, "label": "p"}
    with pytest.raises(ValueError, match="unexpected field names"):
        p._replace(z=1)
    with pytest.raises(TypeError, match="Expected 3 arguments"):
        Point._make([1])


def test_each_class_has_its_own_signature_though_they_share_new_s_code() -> None:
    """__new__ is compiled once per number of fields and renamed: two classes of three
    fields take their own keywords, refuse the other's, and say so as namedtuple's do."""
    import inspect

    @named_tuple
    class Other:
        a: int
        b: int
        c: int = 9

    @named_tuple
    class Empty:
        pass

    @named_tuple
    class One:
        v: str

    assert str(inspect.signature(Point)) == "(x, y=0, label='p')" and str(inspect.signature(Other)) == "(a, b, c=9)"
    assert Other(b=2, a=1) == (1, 2, 9) and Point(label="q", x=1) == (1, 0, "q")
    assert Empty() == () and One("s") == ("s",) and One(v="t").v == "t"
    with pytest.raises(TypeError, match="unexpected keyword argument 'x'"):
        Other(x=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
        Point()  # type: ignore[call-arg]
    match Other(1, 2):
        case Other(first, second, third):
            assert (first, second, third) == (1, 2, 9)
    with pytest.raises(TypeError, match="must be distinct and not start with '_'"):

        @named_tuple
        class Private:
            _hidden: int


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


@pytest.mark.parametrize("count", [1, 2, 24, 25, 40])
def test_records_of_any_size_are_built_with_their_fields_in_order(count: int) -> None:
    """__new__ of 1 to 24 fields comes written out (values/record_new.py: no exec at import);
    larger records still compile theirs. Positional, keyword and default arguments alike."""
    names = [f"f{i}" for i in range(count)]
    namespace = {"__annotations__": dict.fromkeys(names, "int"), names[-1]: -1}
    made = named_tuple(type(f"R{count}", (), namespace))
    values = list(range(count))
    assert tuple(made(*values)) == tuple(values)
    assert tuple(made(**dict(zip(names, values)))) == tuple(values)
    assert made(*values[:-1])[-1] == -1
    assert made.__new__.__name__ == "__new__"
    with pytest.raises(TypeError):
        made(*values, 99)
