"""GPU targets and which devices can run them (NVIDIA's and AMD's compatibility rules).

NVIDIA: a *target* is what a binary was compiled for: `sm_90` (cubin, runs on
9.x with x >= 0), `sm_90a` (arch-specific: exactly 9.0), `sm_100f` (family:
10.x with x >= 0), `compute_80` (PTX: any device >= 8.0, JIT-compiled by the
driver), `compute_90a` (arch-specific PTX does not JIT forward: exactly 9.0).
A *device* is what the machine has: `sm_90`.

AMD (LLVM's target IDs): `gfx942` runs on a gfx942 only (code objects do not
run on another processor); a feature spelled in the target must match the
device's mode (`gfx90a:xnack-` does not load where XNACK is on), an absent one
means "any"; a generic target (`gfx9-4-generic`) runs on each of its members.
A device is `gfx942`, or `gfx90a:sramecc+:xnack-` where its modes are known.
NVIDIA code never runs on an AMD device, nor the other way round.

A machine known to have no GPU (no driver, or a driver that finds no device) has
the devices `none` (NO_GPU): there is nothing there to run GPU code on.
"""

from __future__ import annotations

import re

_TARGET = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")
#: the devices of a machine known to have no GPU (the fact gpu.arch = none)
NO_GPU = "none"


class _Value:
    """A small immutable value, equal, hashed and ordered by its fields (as a frozen, ordered
    dataclass, whose generated methods cost ~2 ms each class at import: a lookup's time)."""

    __slots__ = ()

    def _fields(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._fields() == other._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._fields()))

    def __lt__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() < other._fields()  # type: ignore[attr-defined]

    def __le__(self, other: object) -> bool:
        return self == other or self < other

    def __gt__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() > other._fields()  # type: ignore[attr-defined]

    def __ge__(self, other: object) -> bool:
        return self == other or self > other

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"

    def __reduce__(self) -> tuple:  # copy and pickle call the constructor, never setattr
        return (type(self), self._fields())


class Target(_Value):
    __slots__ = ("kind", "major", "minor", "suffix")
    kind: str  # "sm" (binary) or "compute" (PTX)
    major: int
    minor: int
    suffix: str  # "", "a" (arch-specific) or "f" (family)

    def __init__(self, kind: str, major: int, minor: int, suffix: str = "") -> None:
        for name, value in (("kind", kind), ("major", major), ("minor", minor), ("suffix", suffix)):
            object.__setattr__(self, name, value)

    def __str__(self) -> str:
        return f"{self.kind}_{self.major}{self.minor}{self.suffix}"

    def runs_on(self, device: Target | AmdTarget) -> bool:
        """Whether code for this target can run on a device of the given arch."""
        if not isinstance(device, Target):
            return False
        if self.suffix == "a":
            return (device.major, device.minor) == (self.major, self.minor)
        if self.kind == "sm" or self.suffix == "f":
            return device.major == self.major and device.minor >= self.minor
        return (device.major, device.minor) >= (self.major, self.minor)


#: LLVM's generic processors and the processors each runs on (AMDGPUUsage, "Generic Processors")
GENERIC = {
    "gfx9-generic": ("gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"),
    "gfx9-4-generic": ("gfx940", "gfx941", "gfx942", "gfx950"),
    "gfx10-1-generic": ("gfx1010", "gfx1011", "gfx1012", "gfx1013"),
    "gfx10-3-generic": ("gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036"),
    "gfx11-generic": ("gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"),
    "gfx12-generic": ("gfx1200", "gfx1201"),
}
_AMD = re.compile(r"^(gfx[0-9a-f]+|gfx\d+(?:-\d+)?-generic)((?::(?:sramecc|xnack)[+-])*)$")
FEATURES = ("sramecc", "xnack")  # in LLVM's canonical order


class AmdTarget(_Value):
    __slots__ = ("processor", "sramecc", "xnack")
    processor: str  # "gfx942", "gfx9-4-generic"
    sramecc: str  # "+" on, "-" off, "" any (a target) or unknown (a device)
    xnack: str

    def __init__(self, processor: str, sramecc: str = "", xnack: str = "") -> None:
        for name, value in (("processor", processor), ("sramecc", sramecc), ("xnack", xnack)):
            object.__setattr__(self, name, value)

    def __str__(self) -> str:
        modes = "".join(f":{name}{getattr(self, name)}" for name in FEATURES if getattr(self, name))
        return self.processor + modes

    def runs_on(self, device: Target | AmdTarget) -> bool:
        if not isinstance(device, AmdTarget):
            return False
        if self.processor != device.processor and device.processor not in GENERIC.get(self.processor, ()):
            return False
        # a mode the device does not report cannot be told apart: the loader has the last word
        return all(not want or not have or want == have
                   for want, have in ((self.sramecc, device.sramecc), (self.xnack, device.xnack)))


def _parse_amd(text: str) -> AmdTarget | None:
    match = _AMD.match(text)
    if match is None:
        return None
    modes = {m.group(1): m.group(2) for m in re.finditer(r":(sramecc|xnack)([+-])", match.group(2))}
    return AmdTarget(match.group(1), modes.get("sramecc", ""), modes.get("xnack", ""))


def parse_target(text: str) -> Target | AmdTarget:
    clean = text.strip().lower()
    if clean.startswith("gfx"):
        amd = _parse_amd(clean)
        if amd is None:
            raise ValueError(f"{text!r} is not an AMD GPU target; expected gfxNNN with optional "
                             ":sramecc+/- and :xnack+/-, or a generic target such as gfx9-4-generic")
        return amd
    match = _TARGET.match(clean)
    if match is None:
        raise ValueError(
            f"{text!r} is not a GPU target; expected sm_XY, sm_XYa, sm_XYf or compute_XY (NVIDIA), "
            "or gfxNNN (AMD)"
        )
    kind, major, minor, suffix = match.groups()
    return Target(kind, int(major), int(minor), suffix)


def parse_device(text: str) -> Target | AmdTarget:
    target = parse_target(text)
    if isinstance(target, AmdTarget):
        if target.processor in GENERIC:
            raise ValueError(f"{text!r} is a generic target, not a device; expected e.g. gfx942")
        return target
    if target.kind != "sm" or target.suffix:
        raise ValueError(f"{text!r} is not a device arch; expected sm_XY, e.g. sm_90")
    return target


def fit_rank(target: Target | AmdTarget, device: Target | AmdTarget) -> int:
    """How well code for target suits a device, 0 where it cannot run there. The better code
    is preferred among variants that all run: machine code made for exactly this arch (an
    arch-specific `a` build first: it may use that arch's own instructions), then machine
    code of its family or an older minor of its major, then PTX, which the driver must
    JIT-compile first and which cannot use arch-specific features."""
    if not target.runs_on(device):
        return 0
    if isinstance(target, AmdTarget):
        return 4 if target.processor == device.processor else 3  # type: ignore[union-attr]
    assert isinstance(device, Target)
    if target.kind == "compute":
        return 1
    exact = (target.major, target.minor) == (device.major, device.minor)
    return 5 if exact and target.suffix == "a" else 4 if exact else 3


def devices_rank(devices: str, targets: tuple[str, ...]) -> int:
    """fit_rank of the best target for the worst-served device (every device must be served)."""
    try:
        present = [parse_device(d) for d in devices.split(",") if d]
        built = [parse_target(t) for t in targets]
    except ValueError:
        return 0
    return min((max((fit_rank(t, d) for t in built), default=0) for d in present), default=0)
