"""Immutable records: typing.NamedTuple's classes, made without its cost at import.

typing.NamedTuple checks each field's annotation as a type; with
`from __future__ import annotations` (every module here) each is text, which it
compiles into a ForwardRef: the 20 records a fresh process's torch-extension hit
imports spent 4 ms on that, a fifth of its imports. collections.namedtuple, under
it, compiles a `__new__` for every class (60 us each) and makes a class that
NamedTuple then subclasses. `named_tuple` makes one tuple subclass from a plain
class body, with namedtuple's API (_fields, _field_defaults, _make, _replace,
_asdict, the repr, pickling, fields as fast descriptors): the annotated names in
order are the fields, the trailing ones with a value their defaults; methods,
properties and the docstring stay. `__new__` is compiled once per number of
fields and given each class's field names, so its keywords and signature are
the class's own.
"""

from __future__ import annotations

import collections
import operator
import types

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")

_NOT_COPIED = ("__dict__", "__weakref__")
_GETTER: Any = getattr(collections, "_tuplegetter", None)  # namedtuple's own field descriptor (C)
_NEW_CODE: dict[int, types.CodeType] = {}  # number of fields -> __new__'s code, args _0.._n-1


def named_tuple(cls: type[T]) -> type[T]:
    names = tuple(cls.__dict__.get("__annotations__", {}))
    defaults = tuple(cls.__dict__[name] for name in names if name in cls.__dict__)
    if any(name in cls.__dict__ for name in names[:len(names) - len(defaults)]):
        raise TypeError(f"{cls.__name__}: a field without a default follows one with a default")
    if any(name.startswith("_") for name in names) or len(set(names)) != len(names):
        raise TypeError(f"{cls.__name__}: field names must be distinct and not start with '_': {names}")
    namespace: dict[str, Any] = {
        "__doc__": cls.__doc__, "__slots__": (), "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "_fields": names, "_field_defaults": dict(zip(names[len(names) - len(defaults):], defaults)),
        "__match_args__": names, "__new__": _new(names, defaults, cls.__qualname__),
        "_make": classmethod(_make), "_replace": _replace, "__repr__": _repr, "_asdict": _asdict,
        "__getnewargs__": _getnewargs,
    }
    for index, name in enumerate(names):
        doc = f"Alias for field number {index}"
        namespace[name] = _GETTER(index, doc) if _GETTER else property(operator.itemgetter(index), doc=doc)
    namespace.update((k, v) for k, v in cls.__dict__.items() if k not in names and k not in _NOT_COPIED
                     and k != "__doc__")
    return type(cls.__name__, (tuple,), namespace)  # type: ignore[return-value]


def _new(names: tuple[str, ...], defaults: tuple[Any, ...], qualname: str) -> Any:
    """`def __new__(_cls, <names>): return tuple.__new__(_cls, (<names>,))`, from the code
    compiled for this many fields with its arguments renamed (locals are found by index)."""
    code = _NEW_CODE.get(len(names))
    if code is None and not _NEW_CODE:
        from .record_new import BY_FIELDS

        _NEW_CODE.update(BY_FIELDS)
        code = _NEW_CODE.get(len(names))
    if code is None:
        args = "".join(f"_{i}, " for i in range(len(names)))
        scope: dict[str, Any] = {}
        exec(f"def __new__(_cls, {args}):\n    return _tuple_new(_cls, ({args}))\n", {}, scope)
        code = _NEW_CODE[len(names)] = scope["__new__"].__code__
    renamed = code.replace(co_varnames=("_cls", *names), co_name="__new__")
    function = types.FunctionType(renamed, {"_tuple_new": tuple.__new__}, "__new__", defaults or None)
    function.__qualname__ = f"{qualname}.__new__"
    return function


def _make(cls: Any, iterable: Any) -> Any:
    made = tuple.__new__(cls, iterable)
    if len(made) != len(cls._fields):
        raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(made)}")
    return made


def _replace(self: Any, /, **changes: Any) -> Any:
    made = self._make(map(changes.pop, self._fields, self))
    if changes:
        raise ValueError(f"Got unexpected field names: {list(changes)!r}")
    return made


def _repr(self: Any) -> str:
    fields = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self))
    return f"{self.__class__.__name__}({fields})"


def _asdict(self: Any) -> dict[str, Any]:
    return dict(zip(self._fields, self))


def _getnewargs(self: Any) -> tuple[Any, ...]:
    return tuple(self)
