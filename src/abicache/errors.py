"""Every error abicache raises on purpose derives from AbicacheError.

Messages name the thing that is wrong and how to fix it, so the CLI can print
them as they are instead of a traceback.
"""

from __future__ import annotations


class AbicacheError(Exception):
    """Base class: a failure abicache understands and can explain."""


class ConfigError(AbicacheError):
    """A setting (environment variable or argument) has a value we cannot use."""


class RequirementSyntaxError(AbicacheError, ValueError):
    """A requirement string does not follow the grammar."""


class UsageError(AbicacheError, ValueError):
    """An argument abicache cannot use (an unusable artifact name, say)."""


class ManifestError(AbicacheError):
    """A manifest is malformed, hostile, or from an unknown schema."""


class UntrustedRootError(AbicacheError):
    """The cache root is owned by someone else or writable by others."""


class BuildError(AbicacheError, RuntimeError):
    """A builder failed; carries the command and its output when there was one.
    A RuntimeError too, as torch.utils.cpp_extension's build errors are, so a
    caller's `except RuntimeError:` fallback keeps working with abicache."""

    def __init__(self, message: str, *, command: tuple[str, ...] = (), output: str = "") -> None:
        super().__init__(message)
        self.command = command
        self.output = output

    def __str__(self) -> str:
        parts = [super().__str__()]
        if self.command:
            parts.append("command: " + " ".join(self.command))
        if self.output:
            parts.append(self.output.rstrip())
        return "\n".join(parts)


class LockTimeout(AbicacheError):
    """Waiting for another process's build took longer than the lock timeout."""


class NotFound(AbicacheError):
    """A named entry, key or file is not in the cache."""


class RemoteError(AbicacheError):
    """The remote store could not be reached or answered wrongly (transport,
    timeout, credentials). The cache catches it and goes on without the remote."""


class RefusedError(AbicacheError):
    """Something fetched from the remote failed verification (signature, hash,
    hostile manifest). It never enters the local store."""


class AbicacheWarning(UserWarning):
    """Something was skipped or repaired (bad manifest, quarantined entry)."""


def _format_warnings() -> None:
    """Print AbicacheWarning as abicache's own one line ('abicache: ...'), not Python's
    'file:line: Category: message' and the source line below it; other warnings as before.
    Filters (python -W, warnings.simplefilter) work on it as on any warning."""
    import warnings

    original = warnings.formatwarning
    if getattr(original, "_abicache", False):
        return

    def formatwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
        if issubclass(category, AbicacheWarning):
            text = str(message)
            return (text if text.startswith("abicache: ") else f"abicache: {text}") + "\n"
        return original(message, category, filename, lineno, line)

    formatwarning._abicache = True  # type: ignore[attr-defined]
    warnings.formatwarning = formatwarning


_format_warnings()
