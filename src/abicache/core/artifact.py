"""What the cache hands back and what a builder may return: small immutable values.

Builder: build(out_dir) writes the artifact's files; it may return requirements it
learned while building (e.g. the torch version a stable op resolved to) as a
Requirements or a list/tuple of requirement strings, or a BuildResult with
requirements and the dependencies the compiler read. Any other return value
(a lambda's write_text() count, say) is ignored.
"""

from __future__ import annotations

from pathlib import Path

from . import key as keys
from ..errors import AbicacheError
from ..values.records import named_tuple
from ..values.requirements import Requirements
from ..store import Manifest
from ..store.manifest import Absent, Dependency, System

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

    Builder = Callable[[Path], Any]


@named_tuple
class BuildResult:
    """What a builder learned: requirements, and the files it read that the
    key does not cover (checked on every lookup, see store/deps.py)."""

    requirements: Requirements | Sequence[str] = ()
    deps: Sequence[Dependency] = ()
    absent: Sequence[Absent] = ()  # paths looked for and not found, which must stay missing
    env: Sequence[tuple[str, str]] = ()  # (variable read, sha256 of its value or "unset")
    system: Sequence[System] = ()  # files read in system folders, a group a folder
# (stage, files, declared, facts) -> (detected requirements, audit summary)
if TYPE_CHECKING:
    Auditor = Callable[[Path, Sequence[str], Requirements, Any], "tuple[Requirements, dict[str, Any]]"]


@named_tuple
class Artifact:
    key: str
    variant: str
    kind: str
    name: str
    path: Path  # the variant directory
    files: tuple[str, ...]
    requirements: Requirements
    manifest: Manifest
    hit: bool
    origin: str = "local"  # "local" (a hit here), "tier" (a read-only store's), "remote" (fetched), "built"
    bases: Mapping[str, str] = {}  # where its dependencies were found current
    watch: Any = None  # store.deps.Current over them

    def current(self) -> bool:
        """Whether the files it was compiled from (its dependencies) still hold
        the bytes it was built from; microseconds once asked (store/watch.py)."""
        return not self.manifest.recorded or (self.watch is not None and self.watch())

    def unasked(self) -> bool:
        """Whether its dependencies' watch was never asked (hits/record.py recorded: the second call
        of a process whose first took the full lookup)."""
        return self.watch is not None and not self.watch.asked

    def file(self, name: str | None = None) -> Path:
        """The path of one file; without a name, the only file (or an error)."""
        if name is None:
            if len(self.files) != 1:
                raise AbicacheError(f"{self.name} has {len(self.files)} files; name the one you want")
            name = self.files[0]
        if name not in self.files:
            raise AbicacheError(f"{self.name} has no file {name!r}; it has {', '.join(self.files)}")
        return self.path / name


def artifact_of(vdir: Path, manifest: Manifest, origin: str) -> Artifact:
    return Artifact(
        key=manifest.key,
        variant=manifest.variant,
        kind=manifest.kind,
        name=manifest.name,
        path=vdir,
        files=tuple(f.path for f in manifest.files),
        requirements=manifest.requirements,
        manifest=manifest,
        hit=origin != "built",
        origin=origin,
    )


def as_inputs(inputs: keys.Inputs | Mapping[str, Any]) -> keys.Inputs:
    if isinstance(inputs, keys.Inputs):
        return inputs
    return keys.Inputs.make(**inputs)
