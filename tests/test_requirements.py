from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from packaging.version import Version

from abicache.values import archs, versions
from abicache.errors import RequirementSyntaxError
from abicache.values.requirements import Requirement, Requirements

names = st.from_regex(r"[a-z][a-z0-9_]{0,8}(\.[a-z0-9_]{1,8}){0,2}", fullmatch=True)
tokens = st.from_regex(r"[A-Za-z0-9_.+\-:/=@]{1,12}", fullmatch=True)
version_text = st.builds(
    lambda rel, local: ".".join(map(str, rel)) + (f"+{local}" if local else ""),
    st.lists(st.integers(0, 30), min_size=1, max_size=4),
    st.one_of(st.none(), st.from_regex(r"[a-z0-9]{1,5}(\.[a-z0-9]{1,5}){0,2}", fullmatch=True)),
)
targets = st.builds(
    lambda kind, major, minor, suffix: f"{kind}_{major}{minor}{suffix}",
    st.sampled_from(["sm", "compute"]), st.integers(3, 12), st.integers(0, 9),
    st.sampled_from(["", "a", "f"]),
)
devices = st.builds(lambda major, minor: f"sm_{major}{minor}", st.integers(3, 12), st.integers(0, 9))


@st.composite
def requirements(draw: st.DrawFn) -> Requirement:
    op = draw(st.sampled_from(["==", ">=", "in", "~="]))
    name = draw(names)
    if op == "==":
        value = draw(tokens)
    elif op == ">=":
        value = draw(version_text)
    elif op == "in":
        value = ",".join(draw(st.lists(tokens, min_size=1, max_size=4)))
    else:
        value = ", ".join(draw(st.lists(targets, min_size=1, max_size=3)))
    return Requirement(name, op, value)


@given(requirements())
def test_requirement_round_trips_through_its_canonical_string(req: Requirement) -> None:
    text = str(req)
    assert Requirement.parse(text) == req
    assert str(Requirement.parse(text)) == text


@given(st.lists(requirements(), max_size=6))
def test_requirements_round_trip_and_are_order_independent(items: list[Requirement]) -> None:
    reqs = Requirements.of(items)
    assert Requirements.parse(str(reqs)) == reqs
    assert Requirements.of(list(reversed(items))) == reqs
    assert list(reqs) == sorted(reqs)


@given(st.lists(requirements(), min_size=2, max_size=6))
def test_requirement_ordering_is_total_and_consistent(items: list[Requirement]) -> None:
    ordered = sorted(items)
    for a, b in zip(ordered, ordered[1:]):
        assert a <= b
        assert (a.name, a.op, a.value) <= (b.name, b.op, b.value)


@given(version_text, version_text)
def test_fast_version_order_matches_packaging(a: str, b: str) -> None:
    expected = (Version(a) > Version(b)) - (Version(a) < Version(b))
    assert versions.compare(a, b) == expected


@pytest.mark.parametrize("a,b", [("2.10.0a0", "2.10"), ("1!1.0", "2.0"), ("2.13.0.dev1+cpu", "2.13.0"),
                                 ("3.4.30", "3.4.9"), ("2.13.0+cpu", "2.13.0")])
def test_versions_outside_the_fast_path_fall_back_to_packaging(a: str, b: str) -> None:
    expected = (Version(a) > Version(b)) - (Version(a) < Version(b))
    assert versions.compare(a, b) == expected


@given(targets, devices)
def test_gpu_rules(target: str, device: str) -> None:
    t, d = archs.parse_target(target), archs.parse_device(device)
    if t.suffix == "a":
        expected = (d.major, d.minor) == (t.major, t.minor)
    elif t.kind == "sm" or t.suffix == "f":
        expected = d.major == t.major and d.minor >= t.minor
    else:
        expected = (d.major, d.minor) >= (t.major, t.minor)
    assert t.runs_on(d) is expected


@pytest.mark.parametrize(
    "req,device,ok",
    [
        ("gpu.arch ~= sm_90a", "sm_90", True),
        ("gpu.arch ~= sm_90a", "sm_100", False),
        ("gpu.arch ~= sm_80", "sm_86", True),
        ("gpu.arch ~= sm_80", "sm_90", False),
        ("gpu.arch ~= compute_80", "sm_90", True),
        ("gpu.arch ~= compute_90a", "sm_100", False),
        ("gpu.arch ~= sm_100f", "sm_103", True),
        ("gpu.arch ~= sm_80,sm_90", "sm_80,sm_90", True),
        ("gpu.arch ~= sm_90", "sm_80,sm_90", False),
        ("gpu.arch ~= sm_90a", "none", True),  # no GPU here: nothing to run the GPU code on
        ("gpu.arch ~= gfx942", "none", True),
    ],
)
def test_gpu_operator_checks_every_device(req: str, device: str, ok: bool) -> None:
    assert (Requirement.parse(req).check({"gpu.arch": device}) is None) is ok


def test_no_gpu_meets_gpu_code_and_not_knowing_does_not() -> None:
    """GPU code is a requirement on running it: a machine known to have no GPU (gpu.arch = none)
    loads a host library with device code for its CPU paths; one whose GPUs are not known
    (a driver that failed: no fact) is not trusted with it, and a GPU of another arch never is."""
    reqs = Requirements.of(["gpu.arch ~= sm_90", "cuda.runtime == 13"])
    assert reqs.satisfied_by({"gpu.arch": "none", "cuda.runtime": "13"})
    assert reqs.gpu_rank({"gpu.arch": "none"}) == 0
    assert [str(u) for u in reqs.unmet({"cuda.runtime": "13"})] == [
        "gpu.arch ~= sm_90: gpu.arch is not available in this environment"]
    assert [str(u) for u in reqs.unmet({"gpu.arch": "sm_80", "cuda.runtime": "13"})] == [
        "gpu.arch ~= sm_90: this environment has gpu.arch = sm_80"]
    assert not Requirements.of(["gpu.arch ~= sm_90", "cuda.driver >= 13.0"]).satisfied_by({"gpu.arch": "none"})


def test_unmet_requirements_say_why() -> None:
    reqs = Requirements.of(["python.abi == cp311", "torch.version >= 2.10", "platform.machine in aarch64,x86_64"])
    unmet = reqs.unmet({"python.abi": "cp312", "torch.version": "2.9.1+cu121", "platform.machine": "x86_64"})
    reasons = [str(u) for u in unmet]
    assert reasons == [
        "python.abi == cp311: this environment has python.abi = cp312",
        "torch.version >= 2.10: this environment has torch.version = 2.9.1+cu121",
    ]
    missing = Requirements.of(["torch.version >= 2.10"]).unmet({})
    assert "not available in this environment" in str(missing[0])


def test_several_minimums_keep_the_highest() -> None:
    reqs = Requirements.of(["platform.glibc >= 2.17", "platform.glibc >= 2.34", "platform.glibc >= 2.2.5"])
    assert str(reqs) == "platform.glibc >= 2.34"
    assert (Requirements.of(["a == 1"]) | Requirements.of(["b >= 2"])).names() == {"a", "b"}


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("python.abi", "cannot parse"),
        ("Python.abi == cp311", "cannot parse"),
        ("python.abi === cp311", "characters outside"),
        ("torch.version >= banana", "needs a version"),
        ("gpu.arch ~= sm_9x", "not a GPU target"),
        ("python.abi == cp 311", "characters outside"),
        ("platform.machine in ,x86", "comma-separated"),
    ],
)
def test_bad_requirements_get_clear_errors(text: str, fragment: str) -> None:
    with pytest.raises(RequirementSyntaxError, match=fragment):
        Requirement.parse(text)


def test_unknown_operator_is_named() -> None:
    with pytest.raises(RequirementSyntaxError, match="unknown operator"):
        Requirement("a", "!=", "1")


# The hit path reads names, values, lines and versions without compiling a pattern; the rules
# stay the patterns', checked here on random text of the characters that matter.
_ALPHABET = ["a", "z", "A", "0", "9", "_", ".", "-", "+", ":", "/", "=", "@", " ", "\t", "\n", "\r", "\x0b",
             "\x85", "\u2028", "\xa0", "v", "==", ">=", "~=", " in ", "in", ",", "é", "٣", "²", "#"]


def _random_texts(seed: int, count: int, longest: int = 8) -> list[str]:
    import random

    rng = random.Random(seed)
    return ["".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, longest))) for _ in range(count)]


def test_names_and_values_are_checked_as_their_patterns_check_them() -> None:
    import re

    from abicache.values import requirements as r

    for text in _random_texts(1, 40000):
        assert r._is_name(text) == bool(re.fullmatch(r._NAME, text)), repr(text)
        assert r._is_token(text) == bool(re.fullmatch(r._TOKEN, text)), repr(text)
    with pytest.raises(RequirementSyntaxError, match="characters outside"):
        Requirement("python.abi", "==", "cp311\n")  # '$' let a trailing newline through


def test_lines_split_as_the_line_pattern_splits_them() -> None:
    import re

    from abicache.values import requirements as r

    line = re.compile(r._LINE)
    starts = ["python.abi == ", "torch.version >= ", "a.b in ", "gpu.arch ~= ", "x ", "x  == ", " x == "]
    for i, tail in enumerate(_random_texts(2, 40000)):
        text = starts[i % len(starts)] + tail
        match = line.match(text)
        assert r._split_line(text) == (None if match is None else (match[1], match[2].strip(), match[3])), repr(text)


def test_plain_versions_are_read_as_the_version_pattern_reads_them() -> None:
    import re

    simple = re.compile(r"^v?(\d+(?:\.\d+)*)(?:\+([a-z0-9]+(?:[._-][a-z0-9]+)*))?$")
    for i, text in enumerate(_random_texts(3, 40000)):
        text = (("2.13" if i % 3 == 0 else "") + ("+" if i % 5 == 0 else "") + text).strip().lower()  # as sort_key
        match = simple.match(text)
        assert versions._simple(text) == (None if match is None else match.groups()), repr(text)
    assert versions.compare("2.13.0+cpu.1", "2.13.0+cpu-1") == 0  # as packaging: separators are equal
