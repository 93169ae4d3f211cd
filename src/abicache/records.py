"""Immutable records: typing.NamedTuple's classes, made without its cost at import.

typing.NamedTuple checks each field's annotation as a type; with
`from __future__ import annotations` (every module here) each is text, which it
compiles into a ForwardRef: the 20 records a fresh process's torch-extension hit
imports spent 4 ms on that, a fifth of its imports. `named_tuple` builds the same
class (a subclass of collections.namedtuple, as NamedTuple's are) from a plain
class body: the annotated names in order are the fields, the trailing ones with
a value their defaults; methods, properties and the docstring stay.
"""

from __future__ import annotations

import collections
from typing import Any, TypeVar

T = TypeVar("T")
_NOT_COPIED = ("__dict__", "__weakref__")


def named_tuple(cls: type[T]) -> type[T]:
    names = list(cls.__dict__.get("__annotations__", {}))
    defaults = [cls.__dict__[name] for name in names if name in cls.__dict__]
    if any(name in cls.__dict__ for name in names[:len(names) - len(defaults)]):
        raise TypeError(f"{cls.__name__}: a field without a default follows one with a default")
    base: Any = collections.namedtuple(cls.__name__, names, defaults=defaults or None,  # type: ignore[misc]
                                       module=cls.__module__)
    body = {k: v for k, v in cls.__dict__.items() if k not in names and k not in _NOT_COPIED}
    body["__slots__"] = ()
    return type(cls.__name__, (base,), body)  # type: ignore[return-value]
