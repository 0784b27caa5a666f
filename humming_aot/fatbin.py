"""Reads fatbin images and the cubins inside them: which arch each entry holds, PTX or SASS,
compressed or not, and the sm number in a cubin's ELF header. The build checks every fatbin it
writes with it (aot/ninja.py), the JIT every cubin it compiles (jit/cubin.py). No CUDA needed.
"""
from __future__ import annotations

import dataclasses
import struct

from humming_aot.spec import parse_arch


class FatbinTargetError(RuntimeError):
    """A fatbin does not hold exactly the SASS its key asks for."""


#
# A fatbin is one or more containers: a 16-byte header (u32 magic 0xBA55ED50, u16 version,
# u16 header size, u64 size of the entries that follow), then entries, each with its own header
# (u16 kind: 1 = PTX, 2 = ELF cubin; u32 header size; u64 payload size; ...; u32 sm number;
# ...; u64 flags) and its payload. NOTE: the flag bits for arch-specific (0x100000, 'a') and
# family (0x200000, 'f') targets and for compression (0x2000, 0x8000) are what nvcc 13.0 writes;
# they are not documented. The cubin's ELF header cannot tell sm_120 from sm_120a at all.

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
_FLAG_ARCH_SPECIFIC, _FLAG_FAMILY = 0x100000, 0x200000
_FLAG_COMPRESSED = 0x2000 | 0x8000
_CONTAINER = struct.Struct("<IHHQ")
# kind, _, header size, payload size, compressed size, _, minor, major, sm, name offset, name length, flags
_ENTRY = struct.Struct("<HHIQIIHHIIIQ")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FatbinEntry:
    kind: int  # KIND_PTX or KIND_ELF
    sm: int  # 90 for sm_90 / sm_90a
    suffix: str  # "", "a" or "f", from the entry flags
    compressed: bool
    elf_sm: int | None  # the sm number in the cubin's ELF e_flags (None: PTX or compressed)

    @property
    def arch(self) -> str:
        return f"sm{self.sm}{self.suffix}"


def elf_sm(elf: bytes) -> int:
    """The sm number a CUDA cubin (ELF64, OS ABI 0x41) is built for, from e_flags: bits 0-7 up to
    ELF ABI version 7, bits 8-15 from ABI version 8 (CUDA 12.8+ toolkits)."""
    if len(elf) < 64 or elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise FatbinTargetError("payload is not a 64-bit ELF file")
    if elf[7] != 0x41:
        raise FatbinTargetError(f"ELF OS ABI is {elf[7]:#x}, not CUDA's 0x41")
    (e_flags,) = struct.unpack_from("<I", elf, 0x30)
    return (e_flags >> 8) & 0xFF if elf[8] >= 8 else e_flags & 0xFF


def read_fatbin(data: bytes) -> list[FatbinEntry]:
    """Every entry of a fatbin image; FatbinTargetError when the bytes are not one."""
    entries = []
    offset = 0
    while offset + _CONTAINER.size <= len(data):
        magic, _version, header_size, size = _CONTAINER.unpack_from(data, offset)
        if magic != FATBIN_MAGIC:
            if entries and not any(data[offset:]):  # trailing padding
                break
            raise FatbinTargetError(f"no fatbin container at byte {offset} (magic {magic:#x})")
        pos, end = offset + header_size, offset + header_size + size
        if end > len(data):
            raise FatbinTargetError(f"fatbin container at byte {offset} runs past the end of the file")
        while pos < end:
            fields = _ENTRY.unpack_from(data, pos)
            kind, entry_header, payload_size, compressed_size, sm, flags = (fields[i] for i in (0, 2, 3, 4, 8, 11))
            payload = data[pos + entry_header: pos + entry_header + payload_size]
            compressed = bool(flags & _FLAG_COMPRESSED) or compressed_size != 0
            suffix = "a" if flags & _FLAG_ARCH_SPECIFIC else "f" if flags & _FLAG_FAMILY else ""
            entries.append(FatbinEntry(
                kind=kind, sm=sm, suffix=suffix, compressed=compressed,
                elf_sm=elf_sm(payload) if kind == KIND_ELF and not compressed else None,
            ))
            pos += entry_header + payload_size
        offset = end
    if not entries:
        raise FatbinTargetError("the file holds no fatbin entries")
    return entries


def check_fatbin_target(data: bytes, arch: str, *, what: str = "fatbin") -> None:
    """FatbinTargetError unless ``data`` holds exactly one SASS cubin, for ``arch``, and no PTX."""
    number, suffix = parse_arch(arch)
    try:
        entries = read_fatbin(data)
    except (FatbinTargetError, struct.error) as e:
        raise FatbinTargetError(f"{what}: not a readable fatbin ({e})") from None
    found = ", ".join(f"{'PTX' if e.kind == KIND_PTX else 'SASS'} {e.arch}" for e in entries)
    problems = []
    if len(entries) != 1 or entries[0].kind != KIND_ELF:
        problems.append("expected exactly one SASS entry and no PTX")
    for e in entries:
        if e.kind == KIND_ELF and (e.sm != number or e.suffix != suffix):
            problems.append(f"entry is for {e.arch}")
        if e.elf_sm is not None and e.elf_sm != number:
            problems.append(f"its cubin's ELF header says sm_{e.elf_sm}")
    if problems:
        raise FatbinTargetError(f"{what}: expected SASS for {arch} only, found {found}: {'; '.join(problems)}")
