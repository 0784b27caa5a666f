// Header checks for fatbin and cubin images (see image_format.h).

#include "image_format.h"

#include <cstdint>
#include <cstring>
#include <string>

namespace humming_aot::launcher {
namespace {

constexpr std::uint32_t kFatbinMagic = 0xBA55ED50u;  // first 4 bytes of nvcc's fatbin, little-endian
constexpr std::size_t kFatbinHeaderBytes = 16;       // u32 magic, u16 version, u16 header size, u64 payload size
constexpr std::size_t kElf64HeaderBytes = 64;
constexpr std::uint32_t kSectionTypeNoBits = 8;  // SHT_NOBITS (.bss-like): occupies no file bytes

template <typename T>
T read_le(const unsigned char* data, std::size_t offset) {
  T value;
  std::memcpy(&value, data + offset, sizeof(T));  // NOTE: every platform with a CUDA driver is little-endian
  return value;
}

// Whether [offset, offset + length) lies inside [0, size), without overflow.
bool inside(std::uint64_t offset, std::uint64_t length, std::size_t size) {
  return offset <= size && length <= size - offset;
}

std::string truncated(const char* kind, std::uint64_t needed, std::size_t size) {
  return std::string("the ") + kind + " header describes " + std::to_string(needed) + " bytes but the image has " +
         std::to_string(size) + ": the file is truncated or corrupt";
}

std::string fatbin_problem(const unsigned char* data, std::size_t size) {
  if (size < kFatbinHeaderBytes) {
    return truncated("fatbin", kFatbinHeaderBytes, size);
  }
  const std::uint64_t header_bytes = read_le<std::uint16_t>(data, 6);
  const std::uint64_t payload_bytes = read_le<std::uint64_t>(data, 8);
  if (header_bytes < kFatbinHeaderBytes || !inside(header_bytes, payload_bytes, size)) {
    return truncated("fatbin", header_bytes + payload_bytes, size);
  }
  return "";
}

std::string cubin_problem(const unsigned char* data, std::size_t size) {
  if (size < kElf64HeaderBytes) {
    return truncated("ELF", kElf64HeaderBytes, size);
  }
  if (data[4] != 2 /* ELFCLASS64 */ || data[5] != 1 /* little-endian */) {
    return "the image is an ELF file but not a 64-bit little-endian cubin";
  }
  const auto program_offset = read_le<std::uint64_t>(data, 0x20);
  const auto section_offset = read_le<std::uint64_t>(data, 0x28);
  const std::uint64_t program_entry = read_le<std::uint16_t>(data, 0x36);
  const std::uint64_t program_count = read_le<std::uint16_t>(data, 0x38);
  const std::uint64_t section_entry = read_le<std::uint16_t>(data, 0x3A);
  const std::uint64_t section_count = read_le<std::uint16_t>(data, 0x3C);
  if (!inside(program_offset, program_entry * program_count, size)) {
    return truncated("ELF program", program_offset + program_entry * program_count, size);
  }
  if (!inside(section_offset, section_entry * section_count, size)) {
    return truncated("ELF section", section_offset + section_entry * section_count, size);
  }
  if (section_count > 0 && section_entry < kElf64HeaderBytes) {
    return "the image's ELF section headers are " + std::to_string(section_entry) + " bytes, not 64";
  }
  for (std::uint64_t i = 0; i < section_count; ++i) {
    const unsigned char* section = data + section_offset + i * section_entry;
    const auto type = read_le<std::uint32_t>(section, 0x04);
    const auto offset = read_le<std::uint64_t>(section, 0x18);
    const auto bytes = read_le<std::uint64_t>(section, 0x20);
    if (type != kSectionTypeNoBits && !inside(offset, bytes, size)) {
      return truncated("ELF section", offset + bytes, size);
    }
  }
  return "";
}

}  // namespace

std::string image_problem(const unsigned char* data, std::size_t size) {
  if (size >= 4 && read_le<std::uint32_t>(data, 0) == kFatbinMagic) {
    return fatbin_problem(data, size);
  }
  if (size >= 4 && std::memcmp(data,
                               "\x7f"
                               "ELF",
                               4) == 0) {
    return cubin_problem(data, size);
  }
  return "the image is neither a fatbin nor a cubin (expected the bytes of a .fatbin or .cubin file, got " +
         std::to_string(size) + " bytes starting with something else)";
}

}  // namespace humming_aot::launcher
