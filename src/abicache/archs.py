"""GPU targets and which devices can run them (NVIDIA's compatibility rules).

A *target* is what a binary was compiled for: `sm_90` (cubin, runs on 9.x with
x >= 0), `sm_90a` (arch-specific: exactly 9.0), `sm_100f` (family: 10.x with
x >= 0), `compute_80` (PTX: any device >= 8.0, JIT-compiled by the driver),
`compute_90a` (arch-specific PTX does not JIT forward: exactly 9.0).
A *device* is what the machine has: `sm_90`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TARGET = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")


@dataclass(frozen=True, order=True)
class Target:
    kind: str  # "sm" (binary) or "compute" (PTX)
    major: int
    minor: int
    suffix: str = ""  # "", "a" (arch-specific) or "f" (family)

    def __str__(self) -> str:
        return f"{self.kind}_{self.major}{self.minor}{self.suffix}"

    def runs_on(self, device: Target) -> bool:
        """Whether code for this target can run on a device of the given arch."""
        if self.suffix == "a":
            return (device.major, device.minor) == (self.major, self.minor)
        if self.kind == "sm" or self.suffix == "f":
            return device.major == self.major and device.minor >= self.minor
        return (device.major, device.minor) >= (self.major, self.minor)


def parse_target(text: str) -> Target:
    match = _TARGET.match(text.strip().lower())
    if match is None:
        raise ValueError(
            f"{text!r} is not a GPU target; expected sm_XY, sm_XYa, sm_XYf or compute_XY"
        )
    kind, major, minor, suffix = match.groups()
    return Target(kind, int(major), int(minor), suffix)


def parse_device(text: str) -> Target:
    target = parse_target(text)
    if target.kind != "sm" or target.suffix:
        raise ValueError(f"{text!r} is not a device arch; expected sm_XY, e.g. sm_90")
    return target
