#pragma once
// Sanity check of a kernel image before it reaches cuLibraryLoadData.
// The driver takes no size with the image: it trusts the sizes in the image's own header, so a
// truncated or foreign buffer would make it read past the end. Accepted: a fatbin (nvcc -fatbin)
// or an ELF64 cubin whose header and every section lie inside the buffer. PTX is not accepted:
// the catalog and the JIT both produce SASS.

#include <cstddef>
#include <string>

namespace humming_aot::launcher {

// "" when `data[0, size)` is a complete fatbin or cubin, else what is wrong with it.
std::string image_problem(const unsigned char* data, std::size_t size);

}  // namespace humming_aot::launcher
