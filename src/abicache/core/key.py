"""Cache keys: a hash of what was built, never of where or when.

The key covers the artifact kind and name, the bytes of every source, the
normalized flags, extra builder settings, and the identity of each tool named
by fact (compiler version, nvcc version, torch build...). Paths, mtimes and
unrelated environment variables never enter it.
"""

from __future__ import annotations

import json

from ..values.digest import sha256_hex
from ..values.records import named_tuple

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

    from ..values.requirements import FactSource


KEY_SCHEME = "abicache-key-v1"


def _digest(data: str | bytes) -> str:
    # surrogateescape: a source file's non-UTF-8 bytes come back as they were read (tree.read_source)
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)
    return sha256_hex(raw)


@named_tuple
class Inputs:
    """The build inputs of one artifact (immutable, hashable).

    sources: (name, sha256 of the content) pairs; the name is how the builder refers to it.
    flags:   compiler/linker flags, in order (order can change the output).
    tools:   fact names whose values identify the tools (e.g. "compiler.cxx").
    extra:   (name, value) pairs of other settings that shape the output.
    """

    sources: tuple[tuple[str, str], ...] = ()
    flags: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    extra: tuple[tuple[str, str], ...] = ()

    @classmethod
    def make(
        cls,
        sources: Mapping[str, str | bytes] | None = None,
        flags: Sequence[str] = (),
        tools: Sequence[str] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> Inputs:
        return cls(
            sources=tuple(sorted((n, _digest(c)) for n, c in (sources or {}).items())),
            flags=normalize_flags(flags),
            tools=tuple(sorted(set(tools))),
            extra=tuple(sorted((str(k), str(v)) for k, v in (extra or {}).items())),
        )

    def describe(self, facts: FactSource) -> dict[str, Any]:
        """The canonical document that is hashed and stored in the manifest."""
        tools = {name: facts.get(name) for name in self.tools}
        for name, value in tools.items():
            if value is None:
                _known_tool(name)
        return {
            "sources": dict(self.sources),
            "flags": list(self.flags),
            "tools": tools,
            "extra": dict(self.extra),
        }


def _known_tool(name: str) -> None:
    """A tool name no fact answers to is a typo: stored as None in the key, it would
    key every build on nothing. (A known fact may be None: the tool is absent here.)"""
    from ..env.facts import FACT_NAMES
    from ..errors import UsageError

    if name not in FACT_NAMES:
        raise UsageError(f"tools: no fact is named {name!r}; tools are fact names, one of: "
                         + ", ".join(FACT_NAMES))


def normalize_flags(flags: Sequence[str]) -> tuple[str, ...]:
    """Strip white space and drop empty flags; keep order, which can matter."""
    return tuple(f.strip() for f in flags if f and f.strip())


def canonical_json(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def compute(kind: str, name: str, described: Mapping[str, Any]) -> str:
    """The key: sha256 over the scheme, kind, name and the described inputs."""
    text = canonical_json({"scheme": KEY_SCHEME, "kind": kind, "name": name, **described})
    return sha256_hex(text.encode("utf-8", "surrogatepass"))  # a file name may be any bytes
