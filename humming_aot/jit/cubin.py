"""Reading and checking a CUDA cubin without a GPU: ELF header, sections, symbols, and the kernel's
self-description (its KernelMetadata, ``KernelKey.metadata_symbol``).

A JIT cubin is published to the cache only after ``check_cubin`` accepts it, and every cache hit is
checked again, so a truncated or foreign file is caught before the driver sees it.
ELF64 layout: System V ABI, "ELF Header", "Section Header", "Symbol Table".
"""
from __future__ import annotations

import dataclasses
import struct

from humming_aot import codegen, kernels
from humming_aot.fatbin import FatbinTargetError, elf_sm
from humming_aot.spec import KernelKey, parse_arch

EM_CUDA = 190  # e_machine of NVIDIA CUDA objects
SHT_SYMTAB, SHT_NOBITS = 2, 8
STT_OBJECT, STT_FUNC = 1, 2
_HEADER = struct.Struct("<HHIQQQIHHHHHH")  # e_type .. e_shstrndx, from byte 16
_SECTION = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, addr, offset, size, link, info, addralign, entsize
_SYMBOL = struct.Struct("<IBBHQQ")  # name, info, other, shndx, value, size


class CubinError(ValueError):
    """Bytes that are not a valid cubin of the kernel they should hold."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Section:
    name: str
    type: int
    offset: int
    size: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Symbol:
    name: str
    type: int  # STT_FUNC, STT_OBJECT, ...
    section: int  # index into the section list
    value: int  # offset inside its section
    size: int


@dataclasses.dataclass(frozen=True, slots=True)
class Cubin:
    """The parts of a cubin the checks need."""

    data: bytes
    machine: int
    sm: int  # from e_flags
    sections: tuple[Section, ...]
    symbols: dict[str, Symbol]

    def section_bytes(self, name: str) -> bytes | None:
        for section in self.sections:
            if section.name == name:
                return b"" if section.type == SHT_NOBITS else self.data[section.offset:section.offset + section.size]
        return None

    def symbol_bytes(self, name: str) -> bytes:
        symbol = self.symbols[name]
        section = self.sections[symbol.section]
        start = section.offset + symbol.value
        if section.type == SHT_NOBITS or symbol.value + symbol.size > section.size:
            raise CubinError(f"symbol {name} lies outside the data of section {section.name}")
        return self.data[start:start + symbol.size]


def _string(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise CubinError(f"string table offset {offset} is out of range")
    return table[offset:end].decode("ascii", errors="replace")


def read_cubin(data: bytes) -> Cubin:
    """Parse the ELF header, section headers and symbol table; CubinError for anything malformed."""
    try:
        sm = elf_sm(data)  # also checks the ELF magic, 64-bit class and CUDA's OS ABI
    except FatbinTargetError as e:
        raise CubinError(str(e)) from None
    try:
        (_type, machine, _version, _entry, _phoff, shoff, _flags, _ehsize, _phentsize, _phnum,
         shentsize, shnum, shstrndx) = _HEADER.unpack_from(data, 16)
        if shentsize != _SECTION.size or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
            raise CubinError(f"section headers (offset {shoff}, {shnum} entries) do not fit the {len(data)} bytes")
        raw = [_SECTION.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
        for entry in raw:
            if entry[1] != SHT_NOBITS and entry[4] + entry[5] > len(data):
                raise CubinError(f"a section (offset {entry[4]}, {entry[5]} bytes) runs past the end of the file")
        names = data[raw[shstrndx][4]:raw[shstrndx][4] + raw[shstrndx][5]]
        sections = tuple(
            Section(name=_string(names, e[0]), type=e[1], offset=e[4], size=e[5]) for e in raw
        )
        symbols: dict[str, Symbol] = {}
        for entry in raw:
            if entry[1] != SHT_SYMTAB:
                continue
            table = data[entry[4]:entry[4] + entry[5]]
            strings = data[raw[entry[6]][4]:raw[entry[6]][4] + raw[entry[6]][5]]
            for offset in range(0, len(table) - _SYMBOL.size + 1, _SYMBOL.size):
                st_name, info, _other, shndx, value, size = _SYMBOL.unpack_from(table, offset)
                name = _string(strings, st_name)
                if name and shndx < len(sections):
                    symbols[name] = Symbol(name=name, type=info & 0xF, section=shndx, value=value, size=size)
    except struct.error as e:
        raise CubinError(f"truncated ELF file ({e})") from None
    return Cubin(data, machine, sm, sections, symbols)


def expected_metadata(key: KernelKey) -> dict[str, int]:
    """What the kernel of ``key`` must say about itself (the `expected` of kernels.load_kernel_image)."""
    return {
        "threads": key.tile.threads,
        "smem_bytes": codegen.kernel_smem_bytes(key),
        "block_m": key.tile.block_m,
        "block_n": key.tile.block_n,
        "block_k": key.tile.block_k,
    }


def check_cubin(data: bytes, key: KernelKey) -> None:
    """CubinError unless ``data`` is a cubin for ``key.arch`` exporting ``key.symbol`` and metadata
    that describes ``key`` (name, params version, threads, shared memory, tile)."""
    if not data:
        raise CubinError(f"kernel {key.name}: the cubin is empty")
    try:
        cubin = read_cubin(data)
    except CubinError as e:
        raise CubinError(f"kernel {key.name}: not a readable cubin ({e})") from None
    number, _ = parse_arch(key.arch)
    if cubin.machine != EM_CUDA:
        raise CubinError(f"kernel {key.name}: ELF e_machine is {cubin.machine}, not CUDA's {EM_CUDA}")
    if cubin.sm != number:
        raise CubinError(f"kernel {key.name}: the cubin is for sm_{cubin.sm}, expected sm_{number} ({key.arch})")
    function = cubin.symbols.get(key.symbol)
    if function is None or function.type != STT_FUNC:
        raise CubinError(f"kernel {key.name}: the cubin has no kernel function {key.symbol}")
    if key.metadata_symbol not in cubin.symbols:
        raise CubinError(f"kernel {key.name}: the cubin has no {key.metadata_symbol} symbol")
    raw = cubin.symbol_bytes(key.metadata_symbol)
    try:
        metadata = kernels.parse_kernel_metadata(raw, kernel=key.name)
        kernels.check_kernel_metadata(metadata, name=key.name, expected=expected_metadata(key))
    except kernels.KernelMetadataError as e:
        raise CubinError(str(e)) from None
