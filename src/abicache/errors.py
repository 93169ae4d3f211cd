"""Every error abicache raises on purpose derives from AbicacheError.

Messages name the thing that is wrong and how to fix it, so the CLI can print
them as they are instead of a traceback.
"""

from __future__ import annotations

import errno


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

    def __init__(self, message: str, *, command: tuple[str, ...] = (), output: str = "",
                 missing_tool: str | None = None) -> None:
        super().__init__(message)
        self.command = command
        self.output = output
        self.missing_tool = missing_tool  # the compiler that is not installed, where that was the failure
        self.hint = ""  # what else the cache knows: the prebuilt variants that did not fit here

    def __str__(self) -> str:
        """What failed, then the compiler's own words, then its command (last: it is long)."""
        parts = [super().__str__(), *([self.hint] if self.hint else [])]
        if self.output:
            parts.append(self.output.rstrip())
        if self.command:
            parts.append("command: " + " ".join(self.command))
        return "\n".join(parts)


class BuildForbiddenError(BuildError):
    """A miss where ABICACHE_BUILD=never: no store served it, and building is not allowed here."""


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


class MissingExtraError(ConfigError):
    """An optional part of abicache was asked for whose libraries are not installed."""


#: top-level module -> the extra (pyproject's optional-dependencies) that installs it
EXTRAS = {"cryptography": "remote", "obstore": "remote", "redis": "remote", "pycparser": "cuda",
          "cuda": "cuda", "zstandard": "cuda-tools", "tvm_ffi": "tvm-ffi"}


def missing_extra(exc: ImportError, what: str = "") -> MissingExtraError | None:
    """The error to raise for an optional library that is not installed, naming the
    pip command that installs it; None when exc is not about one."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    needs = f"{what} needs" if what else "this needs"
    return MissingExtraError(f"{needs} {top}, which is not installed; install it with: "
                             f"pip install 'abicache[{extra}]'")


class StoreUnwritableError(AbicacheError, OSError):
    """The store's filesystem refused a write: full (ENOSPC, EDQUOT), read-only (EROFS),
    or no longer ours to write (EACCES, EPERM). Hits from it still work."""


_FULL = ("the disk is full: free space, cap the store (ABICACHE_MAX_SIZE=10G, or `abicache gc --max-size 10G`), "
         "or point ABICACHE_DIR at another disk")
_NOT_YOURS = "you may not write there: fix its permissions, or point ABICACHE_DIR at a folder of your own"
_FIXES = {
    errno.ENOSPC: _FULL,
    errno.EDQUOT: _FULL.replace("the disk is full", "the disk quota is used up"),
    errno.EROFS: "the filesystem is read-only: point ABICACHE_DIR at a writable folder (hits from this one still load)",
    errno.EACCES: _NOT_YOURS,
    errno.EPERM: _NOT_YOURS,
}


def unwritable_store(exc: BaseException, root: object) -> StoreUnwritableError | None:
    """The one-line error for a write the store's filesystem refused (exc about a path in
    the store at root, or about no path: a write to an open file); None for anything else."""
    import os

    if isinstance(exc, StoreUnwritableError):
        return exc  # said already, by the build of a unit's object further in
    if not isinstance(exc, OSError) or exc.errno not in _FIXES:
        return None
    top = os.fspath(root).rstrip(os.sep) + os.sep  # type: ignore[call-overload]
    names = [os.fspath(n) for n in (exc.filename, exc.filename2) if isinstance(n, (str, os.PathLike))]
    if names and not any((n + os.sep).startswith(top) for n in names):
        return None
    where = f" ({names[0]})" if names else ""
    error = StoreUnwritableError(f"cannot write the cache store {os.fspath(root)}: "  # type: ignore[call-overload]
                                 f"{exc.strerror or os.strerror(exc.errno)}{where}; {_FIXES[exc.errno]}")
    error.errno = exc.errno
    return error


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """An AbicacheWarning, once per process for each message."""
    import warnings

    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, AbicacheWarning, stacklevel=4)
