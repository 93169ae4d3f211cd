"""Requirements: the conditions under which a built artifact may be loaded.

A requirement is one line, `NAME OP VALUE`, over a named environment fact::

    python.abi == cp311          exact string
    torch.version >= 2.10        minimum version (PEP 440 order)
    platform.machine in aarch64,x86_64
                                 membership
    gpu.arch ~= compute_80,sm_90a
                                 every GPU present can run one of the targets
                                 (a machine with none, gpu.arch = none, meets it:
                                 GPU code is a requirement on running it, not on
                                 loading the file that holds it)

`str()` gives the canonical form and `parse()` reads it back; a set of
requirements is written sorted and joined by "; ". Checking never raises: it
returns, for every unmet requirement, a sentence saying why.
"""

from __future__ import annotations

import re

from . import versions
from ..errors import RequirementSyntaxError
from .records import named_tuple

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Iterable, Iterator, Protocol

OPERATORS = ("==", ">=", "in", "~=")
_NAME = r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*"
_TOKEN = r"[A-Za-z0-9_.+\-:/=@]+"
_LINE = rf"^\s*({_NAME})\s*(==|>=|~=|\s+in\s+)\s*(\S.*?)\s*$"  # compiled where a line is not canonical
SEPARATOR = "; "
# The characters of _NAME and _TOKEN, checked without a pattern: a fresh process's first hit
# parses a few canonical lines, and compiling the patterns would cost more than that.
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_LOWER_DIGITS = _LOWER + "0123456789_"
_TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+-:/=@"


def _is_name(text: str) -> bool:
    """re.fullmatch(_NAME, text)."""
    return bool(text) and text[0] in _LOWER and all(part and not part.lstrip(_LOWER_DIGITS)
                                                    for part in text.split("."))


def _is_token(text: str) -> bool:
    """re.fullmatch(_TOKEN, text)."""
    return bool(text) and not text.lstrip(_TOKEN_CHARS)


def _split_line(text: str) -> tuple[str, str, str] | None:
    """(name, operator, value) as _LINE reads them; the canonical form (`str()`) without
    the pattern, anything else with it."""
    name, space, rest = text.partition(" ")
    op, space2, value = rest.partition(" ")
    if (space and space2 and op in OPERATORS and _is_name(name) and value and "\n" not in value
            and not value[0].isspace() and not value[-1].isspace()):
        return name, op, value
    match = re.match(_LINE, text)  # re keeps what it compiled
    return None if match is None else (match[1], match[2].strip(), match[3])


if TYPE_CHECKING:
    class FactSource(Protocol):
        def get(self, name: str) -> str | None: ...


def _canonical_value(op: str, value: str) -> str:
    if op in ("==", ">="):
        if not _is_token(value):
            raise RequirementSyntaxError(f"value {value!r} has characters outside {_TOKEN}")
        if op == ">=" and not versions.is_version(value):
            raise RequirementSyntaxError(f"'>=' needs a version, got {value!r}")
        return value
    items = [v.strip() for v in value.split(",")]
    if not all(map(_is_token, items)):
        raise RequirementSyntaxError(f"{value!r} is not a comma-separated list of values")
    if op == "~=":
        from . import archs

        try:
            return ",".join(sorted({str(archs.parse_target(v)) for v in items}))
        except ValueError as exc:
            raise RequirementSyntaxError(str(exc)) from None
    return ",".join(sorted(set(items)))


# Values on the hit path are NamedTuples, not dataclasses: on Python 3.11 each
# frozen dataclass costs ~1.5 ms to create at import (and `dataclasses` pulls in
# `inspect`, ~8 ms), which alone would break the first-hit budget (bench/).
@named_tuple
class _RequirementFields:
    name: str
    op: str
    value: str


class Requirement(_RequirementFields):
    """One condition; immutable, hashable, ordered by (name, op, value)."""

    __slots__ = ()

    def __new__(cls, name: str, op: str, value: str) -> Requirement:
        if not (isinstance(name, str) and _is_name(name)):
            raise RequirementSyntaxError(f"{name!r} is not a fact name (lower-case words joined by dots)")
        if op not in OPERATORS:
            raise RequirementSyntaxError(f"unknown operator {op!r}; use one of {', '.join(OPERATORS)}")
        return super().__new__(cls, name, op, _canonical_value(op, value))

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.value}"

    @classmethod
    def parse(cls, text: str) -> Requirement:
        known = _PARSED.get(text)
        if known is not None and type(known) is cls:
            return known  # a manifest lists each requirement twice (requirements, and declared or detected)
        split = _split_line(text)
        if split is None:
            raise RequirementSyntaxError(
                f"cannot parse requirement {text!r}; expected 'NAME OP VALUE' with OP one of "
                + ", ".join(OPERATORS)
            )
        name, op, value = split  # the name and the operator are checked
        parsed = _RequirementFields.__new__(cls, name, op, _canonical_value(op, value))
        if len(_PARSED) < 4096:
            _PARSED[text] = parsed
        return parsed

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(self.value.split(",")) if self.op in ("in", "~=") else (self.value,)

    def check(self, facts: FactSource) -> str | None:
        """None when the facts satisfy this requirement, else the reason why not."""
        have = facts.get(self.name)
        if have is None:
            return f"{self}: {self.name} is not available in this environment"
        if self.op == "==":
            ok = have == self.value
        elif self.op == "in":
            ok = have in self.values
        elif self.op == ">=":
            ok = _at_least(have, self.value)
        else:
            from .archs import NO_GPU

            if have == NO_GPU:
                # Nothing here runs GPU code: a host library loads and its CPU paths run, and
                # bare GPU code is the file a build machine makes (a GPU-less process cannot
                # put it on a device). Unknown (None) is not none: a driver that failed.
                return None
            bad = _not_devices(have)
            if bad:
                return f"{self}: {self.name} = {have} does not name GPU devices ({bad})"
            ok = _gpu_compatible(have, self.values)
        return None if ok else f"{self}: this environment has {self.name} = {have}"


#: requirement text -> its parsed value (immutable), for the lookups of one process
_PARSED: dict[str, Requirement] = {}


def _at_least(have: str, want: str) -> bool:
    try:
        return versions.compare(have, want) >= 0
    except ValueError:
        return False


def _not_devices(devices: str) -> str | None:
    """Why a gpu.arch value is not a list of devices (sm_90a is a target; its device is sm_90)."""
    from . import archs

    for device in (d for d in devices.split(",") if d):
        try:
            archs.parse_device(device)
        except ValueError as exc:
            return str(exc)
    return None


def _gpu_compatible(devices: str, targets: tuple[str, ...]) -> bool:
    from . import archs

    try:
        present = [archs.parse_device(d) for d in devices.split(",") if d]
    except ValueError:
        return False
    built = [archs.parse_target(t) for t in targets]
    return bool(present) and all(any(t.runs_on(d) for t in built) for d in present)


@named_tuple
class Unmet:
    requirement: Requirement
    reason: str

    def __str__(self) -> str:
        return self.reason


def _normalize(items: Iterable[Requirement]) -> tuple[Requirement, ...]:
    """Sort, drop duplicates, and keep only the highest of several minimums."""
    highest: dict[str, Requirement] = {}
    rest: set[Requirement] = set()
    for req in items:
        if req.op != ">=":
            rest.add(req)
            continue
        old = highest.get(req.name)
        order = 1 if old is None else versions.compare(req.value, old.value)
        # Equal versions spelled differently (2.10 / 2.10.0): keep one spelling
        # whatever the input order, or the canonical form (and variant id) would vary.
        if order > 0 or (order == 0 and old is not None and req.value < old.value):
            highest[req.name] = req
    return tuple(sorted(rest | set(highest.values())))


class Requirements:
    """An immutable, normalized set of requirements (sorted, highest minimums)."""

    __slots__ = ("items",)
    items: tuple[Requirement, ...]

    def __init__(self, items: Iterable[Requirement] = ()) -> None:
        object.__setattr__(self, "items", _normalize(items))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Requirements is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Requirements) and self.items == other.items

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return f"Requirements({str(self)!r})"

    @classmethod
    def of(cls, items: Iterable[Requirement | str] = ()) -> Requirements:
        if isinstance(items, Requirements):
            return items
        if isinstance(items, str):
            return cls.parse(items)
        return cls(tuple(i if isinstance(i, Requirement) else Requirement.parse(i) for i in items))

    @classmethod
    def parse(cls, text: str) -> Requirements:
        return cls(tuple(Requirement.parse(p) for p in text.split(";") if p.strip()))

    def __str__(self) -> str:
        return SEPARATOR.join(str(r) for r in self.items)

    def __iter__(self) -> Iterator[Requirement]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __or__(self, other: Requirements) -> Requirements:
        return Requirements(self.items + tuple(other))

    def names(self) -> set[str]:
        return {r.name for r in self.items}

    def unmet(self, facts: FactSource) -> list[Unmet]:
        out = []
        for req in self.items:
            reason = req.check(facts)
            if reason is not None:
                out.append(Unmet(req, reason))
        return out

    def satisfied_by(self, facts: FactSource) -> bool:
        return all(req.check(facts) is None for req in self.items)

    def gpu_rank(self, facts: FactSource) -> int:
        """Among variants that all hold: how well their GPU code suits this machine's devices
        (archs.fit_rank; 0 without a GPU requirement), so exact machine code wins over PTX."""
        gpu = [r for r in self.items if r.name == "gpu.arch" and r.op == "~="]
        devices = facts.get("gpu.arch") if gpu else None  # the devices are asked only for GPU code
        if not devices:
            return 0
        from . import archs

        return max(archs.devices_rank(devices, r.values) for r in gpu)

    def to_list(self) -> list[str]:
        return [str(r) for r in self.items]
