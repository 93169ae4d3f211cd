"""`abicache bundle`: named entries of the local store, as a read-only store to ship.

A maintainer builds through abicache (each Python ABI, torch build, GPU arch
a variant), then bundles every variant of the named entries into

  * a store folder: the local store's layout, its files copied (not linked),
    its manifests byte for byte (so their signatures still hold), and the
    name index (tiers.py finds entries by what was asked for through it); or
  * a wheel holding that folder in a package of its own, which registers it
    through the `abicache.stores` entry point: `pip install` it, and abicache
    finds its entries (tiers.py) with no setting.
With ABICACHE_SIGNING_KEY set, every manifest is signed by it (readers with
ABICACHE_TRUSTED_KEYS accept only those, tiers.py). Its platform tag comes from
    the entries' requirements: the highest `platform.glibc` floor and the one
    `platform.machine` (manylinux_2_28_x86_64), or `any` for entries that need
    neither (cubins, PTX). Its Python tags come from the variants (cp311 for
    CPython 3.11 modules, cp310-abi3 for stable-ABI ones, py3-none where a
    Python-free entry rides along), and Requires-Dist pins the torch versions
    the torch variants cover, so pip never pairs it with a torch it cannot load.

Every entry is verified in full (sha256 of each file) before it is copied: a
damaged entry stops the bundle, naming it. `--check` writes nothing: for each
target environment (facts given, the rest this machine's) it says which
variant of each entry a lookup there would load, or what every variant lacks.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

from ..settings.config import human_size
from ..errors import AbicacheError, ManifestError, UsageError
from ..store import Manifest, Store
from ..store.layout import Layout
from ..store.manifest import FILENAME, MAX_BYTES, preference
from ..store.manifest_names import read_any

#: the folder of a bundle wheel's package that holds the store
STORE_FOLDER = "store"


class Bundled(NamedTuple):
    out: Path  # the store folder, or the wheel file
    entries: tuple[Manifest, ...]
    tag: str | None = None  # the wheel's tags (python-abi-platform)
    group: str = ""  # the provider group (--split-by), '' for the base wheel
    size: int = 0  # the wheel's bytes


def select(store: Store, names: Sequence[str], kind: str | None = None,
           sources: Sequence[Path] = ()) -> list[tuple[Path, Manifest]]:
    """Every variant of the named entries (of one kind, if given) in the local store and in
    the store folders `sources` (other jobs' bundles: a CI matrix), each verified in full;
    a variant found twice is taken once."""
    from .tiers import Tier

    chosen: dict[tuple[str, str, str], tuple[Path, Manifest]] = {}
    readers = [(store, lambda vdir, m: _damage(store, vdir, m))]
    for root in sources:
        tier = Tier(Path(root), "--from")
        tier.store.ensure()
        readers.append((tier.store, lambda vdir, m, tier=tier: None if tier.intact(vdir, m) else "see the warning"))
    for where, damage_of in readers:
        for vdir in where.iter_variant_dirs():
            try:
                manifest = where.read_manifest(vdir)
            except (OSError, ManifestError):
                continue
            if manifest.name not in names or kind not in (None, manifest.kind):
                continue
            damage = damage_of(vdir, manifest)
            if damage is not None:
                raise AbicacheError(f"{manifest.kind} {manifest.name} ({vdir}) is damaged: {damage}; "
                                    "run `abicache verify` and build it again before bundling")
            chosen.setdefault((manifest.kind, manifest.key, manifest.variant), (vdir, manifest))
    missing = sorted(set(names) - {m.name for _, m in chosen.values()})
    if missing:
        raise UsageError(f"nothing named {', '.join(missing)} is in the store at {store.root}"
                         + "".join(f" or {root}" for root in sources)
                         + (f" as {kind}" if kind else "") + ": build it first (`abicache ls` lists what is there)")
    return list(chosen.values())


def fetch_named(remote: str, store: Store, names: Sequence[str], kind: str | None = None) -> int:
    """Every variant of the named entries the remote holds (whatever machine each loads on),
    verified into the local store as a pull verifies it: a CI matrix's jobs push, and the last
    one bundles from the remote. How many were fetched."""
    from . import replicate
    from ..remote import RemoteSettings, tier_for

    settings = RemoteSettings.from_env(remote)
    assert settings is not None
    tier = tier_for(settings)
    listed = tier.call(lambda b: sorted(b.entries())) or []
    if tier.down:
        raise AbicacheError(f"bundle --remote {tier.name}: {tier.down}")
    fetched = 0
    for entry_kind, key in listed:
        if kind not in (None, entry_kind):
            continue
        for manifest in replicate.candidates(tier, store, entry_kind, key, lambda m: m.name in names):
            if store.layout.variant_dir(manifest.kind, manifest.key, manifest.variant).is_dir():
                continue  # here already (verified by select, as every entry)
            fetched += replicate.download(tier, store, manifest) is not None
    return fetched


def _damage(store: Store, vdir: Path, manifest: Manifest) -> str | None:
    found = store.check(vdir, manifest, full=True)
    return None if found is None else found[0]


def write_store(chosen: Iterable[tuple[Path, Manifest]], out: Path, signer: Any = None,
                blobs: bool = False) -> None:
    """A store folder at out (which must not exist yet): folders 0755, files 0444 or 0555;
    with a signer (remote/keys.py), each manifest signed by it, else copied byte for byte.
    blobs: each distinct file once, in v3/blobs/ as the local store keeps it, and the entries'
    folders hold their manifests only (a wheel: a file shared by variants is shipped once;
    tiers.py copies an entry into the local store at its first use)."""
    if out.exists():
        raise UsageError(f"{out} already exists: bundle into a new folder")
    layout = Layout(out)
    top = layout.base
    (top / "entries").mkdir(parents=True)  # a store, even of no entries (a base wheel whose providers hold all)
    for vdir, manifest in chosen:
        target = layout.variant_dir(manifest.kind, manifest.key, manifest.variant)
        target.mkdir(parents=True, exist_ok=True, mode=0o755)
        for record in manifest.files:
            path = target / record.path
            if blobs:
                sha = record.sha256
                path = top / "blobs" / sha[:2] / (sha + ("x" if record.executable else ""))
                if path.exists():
                    continue  # the same bytes, shipped once
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            shutil.copyfile(vdir / record.path, path)
            path.chmod(record.mode)
        if signer is None:  # a file in a wheel, whether the local store kept it in names or not
            (target / FILENAME).write_bytes(read_any(os.fspath(vdir), MAX_BYTES))
        else:
            (target / FILENAME).write_bytes(signer.sign(manifest).dumps())
        (target / FILENAME).chmod(0o444)
        marker = layout.name_marker(manifest.kind, manifest.name, manifest.key)
        marker.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        marker.touch(mode=0o444)
    for folder, dirs, _ in os.walk(out):
        for name in [".", *dirs]:
            os.chmod(os.path.join(folder, name), 0o755)  # whatever the umask: readable, writable by us only


def platform_tag(entries: Iterable[Manifest]) -> str:
    """The wheel's platform tag from the entries' requirements (see the module's docstring)."""
    machines, floor = set(), (0, 0)
    for manifest in entries:
        for req in manifest.requirements:
            if req.name == "platform.machine":
                machines.update(req.values)
            elif req.name == "platform.glibc" and req.op == ">=":
                floor = max(floor, tuple(int(p) for p in req.values[0].split(".")[:2]))  # type: ignore[assignment]
    if len(machines) > 1:
        raise UsageError(f"the entries need different machines ({', '.join(sorted(machines))}): "
                         "bundle one wheel per machine (--kind, or fewer names)")
    if not machines:
        return "any"
    machine = machines.pop()
    major, minor = floor if floor >= (2, 17) else (2, 17)  # manylinux2014, the oldest pip still installs
    return f"manylinux_{major}_{minor}_{machine}"


def signer_from_env() -> Any:
    """The signer of ABICACHE_SIGNING_KEY, or None: bundles are signed as uploads are."""
    from ..remote import keys

    path = keys.signing_key_from_env()
    return None if path is None else keys.load_signer(path)


def python_tags(entries: Iterable[Manifest]) -> tuple[str, str]:
    """(python tag, abi tag) from the entries' Python requirements: cp311-cp311 where every
    Python-specific entry needs CPython 3.11, cp310-abi3 where the stable ABI from 3.10 is the
    only one, dotted tag sets where several (cp311.cp312-cp311.cp312), py3-none where none does."""
    abis, floors, free = set(), set(), False
    for manifest in entries:
        names = {r.name for r in manifest.requirements}
        free = free or not names & {"python.abi", "python.abi3"}
        for req in manifest.requirements:
            if req.name == "python.abi" and req.op == "==":
                abis.update(req.values)
            elif req.name == "python.abi3" and req.op == ">=":
                floors.add(req.values[0])
    if not abis and not floors:
        return "py3", "none"
    if free:  # a Python-free entry (a C library, a cubin) rides along: the wheel must install anywhere
        return "py3", "none"
    if abis and not floors:
        tags = ".".join(sorted(abis))
        return tags, tags
    if floors and not abis:
        low = min(floors, key=lambda v: tuple(int(p) for p in v.split(".")))
        return "cp" + low.replace(".", ""), "abi3"
    return "py3", "none"


def torch_requirement(entries: Iterable[Manifest]) -> str | None:
    """Requires-Dist for torch from the entries: the range of torch versions the classic (torch.build)
    variants were built for (torch>=2.12,<2.14), else the stable-ABI floor (torch>=2.9); None: no torch."""
    built, floors = set(), set()
    for manifest in entries:
        for req in manifest.requirements:
            if req.name == "torch.build" and req.op == "==":
                built.add(_minor(req.values[0].split("+")[0].split("/")[0]))
            elif req.name == "torch.version" and req.op == ">=":
                floors.add(_minor(req.values[0]))
    if built:
        low, high = min(built), max(built)
        return f"torch>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}"
    if floors:
        low = min(floors)
        return f"torch>={low[0]}.{low[1]}"
    return None


def _minor(version: str) -> tuple[int, int]:
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


SPLITS = ("none", "arch", "torch", "python")
#: GitHub's release assets stop at 2 GiB; a wheel of more is refused by default
MAX_WHEEL = int(1.9 * (1 << 30))


def group_of(manifest: Manifest, split_by: str) -> str:
    """The provider wheel an entry goes to ('' for the base wheel): its GPU targets, its torch
    (a minor version, or stable-X.Y for a stable-ABI floor) or its Python (cp311, abi3)."""
    for req in manifest.requirements:
        if split_by == "arch" and req.name == "gpu.arch":
            return "-".join(req.values)
        if split_by == "torch" and req.name == "torch.build":
            major, minor = _minor(req.values[0].split("+")[0].split("/")[0])
            return f"torch{major}.{minor}"
        if split_by == "torch" and req.name == "torch.version":
            return "torch-stable"
        if split_by == "python" and req.name == "python.abi":
            return req.values[0]
        if split_by == "python" and req.name == "python.abi3":
            return "abi3"
    return ""


def write_wheels(chosen: Sequence[tuple[Path, Manifest]], requirement: str, out_dir: Path, signer: Any = None,
                 split_by: str = "none", max_size: int = MAX_WHEEL) -> list[Bundled]:
    """A base wheel (the entries no group claims) and a provider wheel per group, each registering
    its own store, each installable alone; UsageError naming a wheel over max_size."""
    if split_by not in SPLITS:
        raise UsageError(f"--split-by {split_by!r}: use {', '.join(SPLITS)}")
    dist, _ = _parse_requirement(requirement)
    groups: dict[str, list[tuple[Path, Manifest]]] = {"": []}
    for item in chosen:
        groups.setdefault(group_of(item[1], split_by) if split_by != "none" else "", []).append(item)
    made = []
    for group, members in sorted(groups.items()):
        name = f"{dist}-{re.sub(r'[^A-Za-z0-9]+', '_', group).strip('_')}" if group else dist
        wheel = write_wheel(members, requirement.replace(dist, name, 1) if group else requirement, out_dir, signer)
        size = wheel.out.stat().st_size
        if size > max_size:
            for done in [*made, wheel]:
                done.out.unlink(missing_ok=True)
            largest = max(members, key=lambda vm: sum(f.size for f in vm[1].files))[1] if members else None
            raise UsageError(
                f"the wheel {wheel.out.name} ({'base' if not group else 'group ' + group}) is {human_size(size)}, "
                f"over --max-size {human_size(max_size)}"
                + (f" (its largest entry: {largest.kind} {largest.name}, variant {largest.variant})" if largest else "")
                + ": split it further (--split-by arch, torch or python) or bundle fewer names")
        made.append(wheel._replace(group=group, size=size))
    return made


def _parse_requirement(requirement: str) -> tuple[str, str]:
    match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([0-9][A-Za-z0-9.+!-]*)\s*", requirement)
    if match is None:
        raise UsageError(f"--wheel {requirement!r}: give the distribution and its version, e.g. mylib-kernels==1.0")
    return match.group(1), match.group(2)


def write_wheel(chosen: Sequence[tuple[Path, Manifest]], requirement: str, out_dir: Path,
                signer: Any = None) -> Bundled:
    """A wheel DIST-VERSION-py3-none-TAG.whl in out_dir whose package holds the store."""
    given, version = _parse_requirement(requirement)
    dist = re.sub(r"[-_.]+", "_", given).lower()
    manifests = [m for _, m in chosen]
    python, abi = python_tags(manifests)
    tag = f"{python}-{abi}-{platform_tag(manifests)}"
    torch = torch_requirement(manifests)
    staging = out_dir / f".{dist}-{os.getpid()}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        write_store(chosen, staging / dist / STORE_FOLDER, signer, blobs=True)
        (staging / dist / "__init__.py").write_text(
            f'"""Prebuilt entries for abicache (abicache bundle): found through the abicache.stores entry point."""\n'
            f"from pathlib import Path\n\nSTORE = str(Path(__file__).resolve().parent / {STORE_FOLDER!r})\n")
        info = f"{dist}-{version}.dist-info"
        meta = {
            f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {given}\nVersion: {version}\n"
                                f"Summary: prebuilt entries for abicache ({len(chosen)} variants)\n"
                                f"Requires-Dist: abicache\n" + (f"Requires-Dist: {torch}\n" if torch else ""),
            f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: abicache bundle\nRoot-Is-Purelib: false\n"
                             + "".join(f"Tag: {t}\n" for t in _expanded(tag)),
            f"{info}/entry_points.txt": f"[abicache.stores]\n{dist} = {dist}:STORE\n",
        }
        wheel = out_dir / f"{dist}-{version}-{tag}.whl"
        _zip(staging, meta, f"{info}/RECORD", wheel)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Bundled(wheel, tuple(m for _, m in chosen), tag)


def _expanded(tag: str) -> list[str]:
    """A compressed tag set (cp311.cp312-cp311.cp312-plat) as the WHEEL file lists it, one a line."""
    python, abi, plat = tag.split("-")
    if python.count(".") and python == abi:
        return [f"{p}-{p}-{plat}" for p in python.split(".")]
    return [f"{p}-{a}-{plat}" for p in python.split(".") for a in abi.split(".")]


def _zip(staging: Path, meta: dict[str, str], record_name: str, wheel: Path) -> None:
    rows: list[tuple[str, str, str]] = []
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            name = path.relative_to(staging).as_posix()
            data = path.read_bytes()
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # reproducible
            info.external_attr = (0o100755 if path.stat().st_mode & 0o111 else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            rows.append(_record_row(name, data))
        for name, text in meta.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), text)
            rows.append(_record_row(name, text.encode()))
        rows.append((record_name, "", ""))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)  # a comma in a file name is quoted
        z.writestr(zipfile.ZipInfo(record_name, date_time=(2020, 1, 1, 0, 0, 0)), text.getvalue())
    temp = wheel.with_name(wheel.name + ".part")
    temp.write_bytes(buffer.getvalue())
    os.replace(temp, wheel)  # a wheel is whole or absent


def _record_row(name: str, data: bytes) -> tuple[str, str, str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return name, f"sha256={digest}", str(len(data))


class Verdict(NamedTuple):
    environment: str  # as given: "python.abi=cp312,gpu.arch=sm_90", or "here"
    kind: str
    name: str
    variant: str | None  # the variant a lookup there picks; None: it builds
    needs: str  # what the nearest variant needs that the environment lacks ('' when one loads)


def check(chosen: Sequence[tuple[Path, Manifest]], environments: Sequence[tuple[str, Any]]) -> list[Verdict]:
    """For each environment (a label and its Facts) and each (kind, name): the variant that loads
    there (the most specific whose requirements hold, as a lookup picks), or what is missing."""
    groups: dict[tuple[str, str], list[Manifest]] = {}
    for _, manifest in chosen:
        groups.setdefault((manifest.kind, manifest.name), []).append(manifest)
    verdicts = []
    for label, facts in environments:
        for (kind, name), manifests in sorted(groups.items()):
            fitting = sorted((m for m in manifests if m.requirements.satisfied_by(facts)),
                             key=lambda m: (m.requirements.gpu_rank(facts), *preference(m)), reverse=True)
            if fitting:
                verdicts.append(Verdict(label, kind, name, fitting[0].variant, ""))
                continue
            nearest = min(manifests, key=lambda m: len(m.requirements.unmet(facts)))
            verdicts.append(Verdict(label, kind, name, None,
                                    "; ".join(str(u) for u in nearest.requirements.unmet(facts))))
    return verdicts
