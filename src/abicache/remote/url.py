"""Remote store URLs: s3://BUCKET/PREFIX?endpoint=...&region=... and
redis://[USER:PASSWORD@]HOST:PORT/DB?prefix=P, or rediss://... (TLS; ca=FILE
names the CA bundle that signed the server's certificate, else the system's);
file:///FOLDER (a folder: a shared mount, or what a web server serves) and
http(s)://HOST/PATH (such a folder served by any static server: read-only).

Parsing is pure and fast; nothing here imports a client library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ..errors import ConfigError

#: scheme -> the query options it understands
OPTIONS: dict[str, frozenset[str]] = {
    "s3": frozenset({"endpoint", "region"}),
    "redis": frozenset({"prefix"}),
    "rediss": frozenset({"prefix", "ca"}),
    "file": frozenset(),
    "http": frozenset(),
    "https": frozenset({"ca"}),
}
#: remotes that are places to publish or read, not a fleet's meeting point: no build leases
STATIC = frozenset({"file", "http", "https"})
#: remotes that can only be read
READ_ONLY = frozenset({"http", "https"})
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PREFIX = re.compile(r"^[A-Za-z0-9._/-]*$")


@dataclass(frozen=True)
class RemoteURL:
    scheme: str
    location: str  # bucket (s3) or host:port (redis)
    path: str  # key prefix (s3) or database number (redis)
    options: tuple[tuple[str, str], ...]
    text: str  # as given; may hold a password, so never print it: use redacted()

    def option(self, name: str, default: str = "") -> str:
        return dict(self.options).get(name, default)

    def redacted(self) -> str:
        """The URL without a password, for messages and logs."""
        parts = urlsplit(self.text)
        if parts.password is None:
            return self.text
        netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))

    def __str__(self) -> str:
        return self.redacted()


def parse(text: str) -> RemoteURL:
    """A validated RemoteURL, or a ConfigError that shows the accepted forms."""
    parts = urlsplit(text.strip())
    scheme = parts.scheme.lower()
    if scheme not in OPTIONS:
        raise ConfigError(
            f"remote {text!r}: unknown scheme {parts.scheme!r}; use "
            "s3://BUCKET/PREFIX?endpoint=URL&region=R, redis://HOST:PORT/DB, file:///FOLDER "
            "or https://HOST/PATH (read-only)"
        )
    options = tuple(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted({k for k, _ in options} - OPTIONS[scheme])
    if unknown:
        raise ConfigError(
            f"remote {text!r}: unknown option {', '.join(unknown)}; {scheme}:// understands "
            + ", ".join(sorted(OPTIONS[scheme]))
        )
    path = parts.path.strip("/")
    if scheme == "s3":
        _check_s3(text, parts.netloc, path)
        location = parts.netloc
    elif scheme == "file":
        if parts.netloc not in ("", "localhost") or not path:
            raise ConfigError(f"remote {text!r}: write a folder as file:///absolute/path")
        location = ""
    elif scheme in ("http", "https"):
        if not parts.hostname:
            raise ConfigError(f"remote {text!r}: write it as {scheme}://HOST[:PORT]/PATH")
        location = parts.netloc
    else:
        location = f"{parts.hostname or 'localhost'}:{parts.port or 6379}"
        if path and not path.isdigit():
            raise ConfigError(f"remote {text!r}: the path must be a database number, like redis://host:6379/0")
    return RemoteURL(scheme, location, path, options, text.strip())


def _check_s3(text: str, bucket: str, prefix: str) -> None:
    if not _BUCKET.match(bucket):
        raise ConfigError(f"remote {text!r}: {bucket!r} is not an S3 bucket name")
    if not _PREFIX.match(prefix) or ".." in prefix.split("/"):
        raise ConfigError(f"remote {text!r}: the prefix {prefix!r} may use letters, digits, '.', '_', '-', '/'")
