"""Ed25519 keys and manifest signatures.

Builders (CI) hold a private key and sign the manifests they upload; every
other machine holds only public keys. A signature covers the manifest's
normalized form (parsed, then dumped again), so it survives the JSON round
trip through any store. Text forms:

    public key   ed25519:<base64 of the 32 raw bytes>
    signature    ed25519:<key id>:<base64 of the 64-byte signature>
    key id       the first 16 hex digits of sha256(raw public key)

`cryptography` is imported only to sign or verify.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError
from ..store import manifest as mf
from ..store.manifest import Manifest

PREFIX = "ed25519:"
_DOMAIN = b"abicache-manifest-v1\0"


@dataclass(frozen=True)
class PublicKey:
    raw: bytes

    @property
    def key_id(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()[:16]

    def __str__(self) -> str:
        return PREFIX + base64.b64encode(self.raw).decode()


def parse_public(text: str, where: str = "") -> PublicKey:
    text = text.strip()
    origin = f" (in {where})" if where else ""
    if not text.startswith(PREFIX):
        raise ConfigError(f"{text[:40]!r}{origin} is not a public key; it should look like ed25519:BASE64")
    try:
        raw = base64.b64decode(text[len(PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ConfigError(f"{text[:40]!r}{origin} is not a valid Ed25519 public key (32 bytes, base64)")
    return PublicKey(raw)


def parse_trusted(spec: str) -> tuple[PublicKey, ...]:
    """ABICACHE_TRUSTED_KEYS: comma-separated keys or files with one key per line."""
    found: list[PublicKey] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if item.startswith(PREFIX):
            found.append(parse_public(item))
            continue
        path = Path(item).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(
                f"ABICACHE_TRUSTED_KEYS names {item!r}, which is neither a key (ed25519:...) "
                f"nor a readable file ({exc.strerror})"
            ) from None
        found += [parse_public(line, str(path)) for line in lines if line.strip() and not line.startswith("#")]
    return tuple(found)


def signing_key_from_env() -> Path | None:
    from ..settings import config

    text = config.text("ABICACHE_SIGNING_KEY")
    return Path(text).expanduser() if text else None


def trusted_from_env() -> tuple[PublicKey, ...]:
    from ..settings import config

    return parse_trusted(config.text("ABICACHE_TRUSTED_KEYS"))


def generate() -> tuple[bytes, PublicKey]:
    """A new key pair: (private key as PKCS#8 PEM, public key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return pem, _public_of(key)


def write_pair(path: Path) -> PublicKey:
    """Write PATH (private, 0600) and PATH.pub; never overwrite."""
    pem, public = generate()
    pub_path = path.with_name(path.name + ".pub")
    for target in (path, pub_path):
        if target.exists():
            raise ConfigError(f"{target} already exists; choose another path or remove it first")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    pub_path.write_text(f"{public}\n")
    return public


@dataclass(frozen=True)
class Signer:
    path: Path
    public: PublicKey
    _key: Any

    def sign(self, manifest: Manifest) -> Manifest:
        signature = self._key.sign(payload(manifest))
        return manifest._replace(
            signature=f"{PREFIX}{self.public.key_id}:{base64.b64encode(signature).decode()}"
        )


def load_signer(path: Path) -> Signer:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise ConfigError(f"ABICACHE_SIGNING_KEY: cannot read {path} ({exc.strerror})") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"ABICACHE_SIGNING_KEY: {path} is not an unencrypted PEM private key ({exc}); "
                          "make one with 'abicache keys generate PATH'") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"ABICACHE_SIGNING_KEY: {path} is not an Ed25519 key; "
                          "make one with 'abicache keys generate PATH'")
    return Signer(path, _public_of(key), key)


def _public_of(key: Any) -> PublicKey:
    from cryptography.hazmat.primitives import serialization

    return PublicKey(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def payload(manifest: Manifest) -> bytes:
    """The signed bytes: the manifest without its signature, normalized by a parse round trip."""
    unsigned = mf.parse(manifest._replace(signature=None).dumps())
    return _DOMAIN + unsigned.dumps()


def check(manifest: Manifest, trusted: tuple[PublicKey, ...]) -> str | None:
    """None if a trusted key signed this manifest; otherwise what is wrong."""
    if not manifest.signature:
        return "the manifest is unsigned and ABICACHE_TRUSTED_KEYS requires a signature"
    return _verify(manifest.signature, lambda: payload(manifest), trusted, "the manifest's contents")


def _verify(signature: str, signed: Callable[[], bytes], trusted: tuple[PublicKey, ...], what: str) -> str | None:
    """None if signature ('ed25519:<key id>:<base64>') is a trusted key's over signed(); else why not."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    parts = signature.split(":")
    if len(parts) != 3 or parts[0] + ":" != PREFIX:
        return "the signature is malformed"
    key = next((k for k in trusted if k.key_id == parts[1]), None)
    if key is None:
        return f"signed by key {parts[1][:16]!r}, which is not in ABICACHE_TRUSTED_KEYS"
    try:
        Ed25519PublicKey.from_public_bytes(key.raw).verify(base64.b64decode(parts[2], validate=True), signed())
    except (InvalidSignature, binascii.Error, ValueError):
        return f"the signature by key {key.key_id} does not match {what} (tampered)"
    return None


# ---- small records (build leases, shared failures): JSON objects signed as a whole

_RECORD_DOMAIN = b"abicache-record-v1\0"


def record_payload(record: dict[str, Any]) -> bytes:
    """The signed bytes of a record: every field but the signature, canonical JSON."""
    import json

    body = {k: v for k, v in record.items() if k != "signature"}
    return _RECORD_DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign_record(signer: Signer, record: dict[str, Any]) -> dict[str, Any]:
    signature = signer._key.sign(record_payload(record))
    return {**record, "signature": f"{PREFIX}{signer.public.key_id}:{base64.b64encode(signature).decode()}"}


def check_record(record: dict[str, Any], trusted: tuple[PublicKey, ...]) -> str | None:
    """None if a trusted key signed this record; otherwise what is wrong."""
    signature = record.get("signature")
    if not isinstance(signature, str) or not signature:
        return "unsigned, and ABICACHE_TRUSTED_KEYS requires a signature"
    return _verify(signature, lambda: record_payload(record), trusted, "the record")
