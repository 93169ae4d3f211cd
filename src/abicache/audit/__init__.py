"""Audit: what a built artifact depends on, read from its files.

    audit_file(path)  ->  FileAudit: requirements with evidence, contradictions
    detect(stage, paths, declared, facts)  ->  (detected requirements, summary)

Host shared libraries give platform floors (glibc, GLIBCXX, CXXABI, machine),
the Python ABI, the torch dependence and the CUDA libraries they need; cubins,
fatbins (also embedded in host libraries) and PTX give GPU targets and the
minimum driver. Claims (declared requirements, or an extension's file name)
are checked against the binary: a contradiction is a problem, and the cache
fails the build with it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import BuildError
from ..values.requirements import Requirement, Requirements
from . import amdgpu, cuda, elf, native, offload, python_abi, torch_abi
from .errors import AuditError
from .findings import FileAudit, Finding, finding

if TYPE_CHECKING:
    from ..values.requirements import FactSource

__all__ = ["AuditError", "FileAudit", "Finding", "audit_file", "detect"]

_HEAD = 4096


def audit_file(path: str | Path, *, claims: Requirements = Requirements(),
               facts: FactSource | None = None, memo_dir: Path | None = None,
               built_here: bool = False) -> FileAudit:
    """Audit one file. Raises AuditError for unreadable, truncated or malformed binaries.

    built_here: the file was just built in the environment `facts` describes,
    so "the exact torch build" is that one (the cache's case).
    """
    from ..env import Facts

    facts = facts if facts is not None else Facts(memo_dir=memo_dir)
    data = elf.mapped(path)
    head = bytes(data[:_HEAD])
    if head[:4] == elf.ELF_MAGIC:
        info = elf.parse(path, data)
        if info.is_cubin:
            return _cubin(str(path), info, data, claims)
        if amdgpu.is_code_object(info):
            return _code_object(str(path), info, claims)
        return _host(str(path), info, data, claims, facts, memo_dir, built_here)
    if head[:4] == cuda.FATBIN_MAGIC.to_bytes(4, "little"):
        return _device(str(path), "fatbin", cuda.fatbin_targets(bytes(data), str(path)), claims)
    if offload.is_bundle(head):
        return _bundle(str(path), bytes(data), claims)
    if cuda.looks_like_ptx(head):
        text = bytes(data).decode("utf-8", errors="replace")
        return _device(str(path), "ptx", [cuda.ptx_target(text, str(path))], claims)
    return FileAudit(str(path), "data")


def _cubin(path: str, info: elf.ElfInfo, data: Any, claims: Requirements) -> FileAudit:
    return _device(path, "cubin", [cuda.cubin_target(info, data)], claims,
                   {"e_flags": hex(info.flags), "osabi": info.osabi, "abiversion": info.abiversion})


def _code_object(path: str, info: elf.ElfInfo, claims: Requirements) -> FileAudit:
    """Device code for an AMD GPU: the gfx target and modes, never a host machine."""
    co = amdgpu.code_object(info)
    findings = [finding(f"gpu.arch ~= {co.target}", f"{co.describe()} (e_flags {info.flags:#x})")]
    summary = {"e_flags": hex(info.flags), "code_object_version": co.version, "target": co.target}
    return FileAudit(path, "amdgpu code object", tuple(findings), tuple(_gpu_problems(findings, claims)), summary)


def _bundle(path: str, data: bytes, claims: Requirements) -> FileAudit:
    """A clang offload bundle file (hipcc's device code, as `clang-offload-bundler` writes it)."""
    device = offload.device_code(data, path)
    findings = _amd_findings(device, "offload bundle")
    summary = {"device_code_amd": [d._asdict() for d in device]}
    return FileAudit(path, "offload bundle", tuple(findings), tuple(_gpu_problems(findings, claims)), summary)


def _amd_findings(device: list[offload.DeviceCode], where: str) -> list[Finding]:
    """One requirement for all the code objects: the HIP runtime picks the one the GPU runs."""
    if not device:
        return []
    targets = sorted({d.target for d in device})
    described = "; ".join(f"{d.triple}: {d.described}" for d in device)
    return [finding(f"gpu.arch ~= {','.join(targets)}", f"{where} holds {described}")]


def _device(path: str, kind: str, targets: list[cuda.Target], claims: Requirements,
            summary: dict[str, Any] | None = None) -> FileAudit:
    findings = _gpu_findings(targets, kind)
    problems = _gpu_problems(findings, claims)
    summary = {**(summary or {}), "targets": [t._asdict() for t in targets]}
    return FileAudit(path, kind, tuple(findings), tuple(problems), summary)


def _gpu_findings(targets: list[cuda.Target], where: str) -> list[Finding]:
    loadable = [t for t in targets if t.kind in ("elf", "ptx")]
    if not loadable:
        return []
    arches = sorted({t.arch for t in loadable})
    described = ", ".join(f"{t.kind} {t.arch}" + (f" (ISA {t.ptx_isa}" + (f", {t.compression}" if t.compression else "") + ")"
                                                    if t.ptx_isa else "") for t in loadable)
    out = [finding(f"gpu.arch ~= {','.join(arches)}", f"{where} holds {described}")]
    if all(t.kind == "ptx" for t in loadable):  # PTX only: the driver must JIT it
        isa = max((t.ptx_isa for t in loadable if t.ptx_isa), key=lambda v: tuple(map(int, v.split("."))))
        out.append(finding(f"cuda.driver >= {cuda.driver_for_isa(isa)}",
                           f"PTX ISA {isa} is JIT-compiled by a driver of CUDA {cuda.driver_for_isa(isa)} or newer"))
    return out


def _gpu_problems(findings: list[Finding], claims: Requirements) -> list[str]:
    detected = {f.requirement.name: f.requirement for f in findings if f.requirement.op == "~="}
    problems = []
    for claim in claims:
        found = detected.get(claim.name)
        if claim.op == "~=" and found is not None and found.value != claim.value:
            problems.append(f"declared {claim} but the binary holds {found.value}")
    return problems


def _host(path: str, info: elf.ElfInfo, data: Any, claims: Requirements,
          facts: FactSource, memo_dir: Path | None, built_here: bool) -> FileAudit:
    from_filename = not _claims_python(claims)
    if from_filename:
        claims = claims | python_abi.claim_from_filename(path)
    findings = native.findings(info)
    built_for = facts.get("python.abi") if built_here else None
    py_found, py_problems, py_summary = python_abi.audit(info, claims, from_filename, built_for)
    torch_found, torch_problems, torch_summary = torch_abi.audit(info, claims, facts, memo_dir, built_here)
    findings += py_found + torch_found + _cuda_library_findings(info)
    device = cuda.embedded_fatbins(data, path)
    findings += _gpu_findings(device, "embedded .nv_fatbin")
    amd = [code for blob in elf.sections_named(data, ".hip_fatbin")
           for code in offload.device_code(blob, f"{path} (.hip_fatbin)")]
    findings += _amd_findings(amd, "embedded .hip_fatbin")
    problems = py_problems + torch_problems + _gpu_problems(findings, claims)
    kind = ("torch extension" if torch_found else "python extension" if py_found else "shared library")
    summary = {**native.summary(info), **py_summary, **torch_summary}
    if device:
        summary["device_code"] = [t._asdict() for t in device]
    if amd:
        summary["device_code_amd"] = [d._asdict() for d in amd]
    return FileAudit(path, kind, tuple(findings), tuple(problems), summary)


def _claims_python(claims: Requirements) -> bool:
    return bool(claims.names() & {"python.abi", "python.abi3"})


def _cuda_library_findings(info: elf.ElfInfo) -> list[Finding]:
    out = []
    for lib, major in sorted(cuda.cuda_libraries(info.needed).items()):
        name = "cuda.runtime" if lib == "cudart" else f"cuda.{lib}"
        out.append(finding(f"{name} == {major}", f"DT_NEEDED lib{lib}.so.{major}"))
    if "libcuda.so.1" in info.needed:
        out.append(finding("cuda.driver >= 1.0", "DT_NEEDED libcuda.so.1 (links the driver directly)"))
    for lib in info.needed:  # the HIP runtime: one major per soname, as for CUDA's
        match = re.fullmatch(r"libamdhip64\.so\.(\d+)", lib)
        if match:
            out.append(finding(f"hip.runtime == {match.group(1)}", f"DT_NEEDED {lib}"))
    return out


def detect(stage: Path, paths: Sequence[str], declared: Requirements,
           facts: FactSource, memo_dir: Path | None = None) -> tuple[Requirements, dict[str, Any]]:
    """Detected requirements of a freshly built artifact; BuildError on a contradiction."""
    findings: list[Finding] = []
    problems: list[str] = []
    summary: dict[str, Any] = {}
    for rel in paths:
        try:
            audited = audit_file(stage / rel, claims=declared, facts=facts, memo_dir=memo_dir,
                                 built_here=True)
        except AuditError as exc:
            raise BuildError(f"the builder produced {rel}, which cannot be audited: {exc}") from None
        if audited.kind == "data":
            continue
        findings += audited.findings
        problems += [f"{rel}: {p}" for p in audited.problems]
        summary[rel] = {"kind": audited.kind, **audited.summary,
                        "evidence": {str(f.requirement): f.evidence for f in audited.findings}}
    if problems:
        raise BuildError("the built files contradict what was declared:\n  " + "\n  ".join(problems))
    return _merge_gpu(findings), summary


def _merge_gpu(findings: list[Finding]) -> Requirements:
    """Several device files in one artifact: a device needs to run any one of them."""
    gpu = sorted({t for f in findings if f.requirement.op == "~=" for t in f.requirement.values})
    rest = [f.requirement for f in findings if f.requirement.op != "~="]
    if gpu:
        rest.append(Requirement("gpu.arch", "~=", ",".join(gpu)))
    return Requirements.of(rest)

