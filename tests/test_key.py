from __future__ import annotations

import pytest

from abicache.env import Facts
from abicache.core.key import Inputs, compute, normalize_flags

FACTS = Facts.from_dict({"compiler.cxx": "gcc 12.2.0", "python.abi": "cp311"})


def key(kind: str = "k", name: str = "n", **inputs: object) -> str:
    return compute(kind, name, Inputs.make(**inputs).describe(FACTS))


def test_same_inputs_same_key_in_any_order() -> None:
    a = key(sources={"a.c": "int a;", "b.c": "int b;"}, tools=["compiler.cxx", "python.abi"], extra={"x": 1, "y": 2})
    b = key(sources={"b.c": "int b;", "a.c": "int a;"}, tools=["python.abi", "compiler.cxx"], extra={"y": 2, "x": 1})
    assert a == b and len(a) == 64


def test_each_input_changes_the_key() -> None:
    base = dict(sources={"a.c": "int a;"}, flags=["-O2"], tools=["compiler.cxx"], extra={"lang": "c"})
    k0 = key(**base)
    assert key(**{**base, "sources": {"a.c": "int a; "}}) != k0
    assert key(**{**base, "sources": {"b.c": "int a;"}}) != k0
    assert key(**{**base, "flags": ["-O3"]}) != k0
    assert key(**{**base, "flags": ["-O2", "-g"]}) != k0
    assert key(**{**base, "extra": {"lang": "c++"}}) != k0
    assert key(**{**base, "tools": []}) != k0
    assert key(kind="other", **base) != k0
    assert key(name="other", **base) != k0


def test_tool_identity_not_path_shapes_the_key() -> None:
    inputs = Inputs.make(sources={"a.c": "x"}, tools=["compiler.cxx"])
    one = compute("k", "n", inputs.describe(Facts.from_dict({"compiler.cxx": "gcc 12.2.0"})))
    two = compute("k", "n", inputs.describe(Facts.from_dict({"compiler.cxx": "gcc 13.1.0"})))
    assert one != two


def test_flags_are_normalized_but_keep_order() -> None:
    assert normalize_flags([" -O2", "", "  ", "-g "]) == ("-O2", "-g")
    assert key(flags=["-O2", "-g"]) != key(flags=["-g", "-O2"])
    assert key(flags=[" -O2 "]) == key(flags=["-O2"])


@pytest.mark.parametrize("size", [0, 3, 1 << 18, (1 << 18) + 1])
def test_the_short_text_digest_is_sha256_by_whichever_module(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """values/digest.py hashes with CPython's own sha256 or OpenSSL's (whichever the process has
    or the size pays for): the same digest either way, and blake2b as hashlib's; an interpreter
    without CPython's module (False: asked once, none) falls back to OpenSSL's."""
    import hashlib

    from abicache.values import digest

    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert digest.sha256_hex(data) == hashlib.sha256(data).hexdigest()
    assert digest.blake2b(data, digest_size=20).hexdigest() == hashlib.blake2b(data, digest_size=20).hexdigest()
    monkeypatch.setattr(digest, "_small_sha256", False)
    assert digest._small() is None and digest.sha256_hex(data) == hashlib.sha256(data).hexdigest()
