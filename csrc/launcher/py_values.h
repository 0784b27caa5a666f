#pragma once
// What the launcher's Python-visible functions take from Python: handles and addresses as ints,
// grid / block / cluster shapes as 3-arrays, and bytes-like Params read in place.

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <string>

namespace humming_aot::launcher {

namespace py = pybind11;

using Dim3 = std::array<unsigned int, 3>;

template <typename Handle>
Handle to_handle(std::uint64_t value, const char* kind) {
  if (value == 0) {
    throw py::value_error(std::string("the ") + kind + " handle is 0: pass the value that load_library / " +
                          "get_kernel returned");
  }
  return reinterpret_cast<Handle>(static_cast<std::uintptr_t>(value));
}

template <typename Handle>
std::uint64_t from_handle(Handle handle) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle));
}

// Read-only view of a bytes-like object without copying. bytes take a fast path with no buffer
// export; anything else (bytearray, memoryview, ctypes structure) must be C-contiguous.
// Construct and destroy with the GIL held.
class ByteView {
 public:
  explicit ByteView(py::handle object) {
    if (PyBytes_CheckExact(object.ptr())) {
      data_ = reinterpret_cast<const unsigned char*>(PyBytes_AS_STRING(object.ptr()));
      size_ = static_cast<std::size_t>(PyBytes_GET_SIZE(object.ptr()));
      return;
    }
    if (PyObject_GetBuffer(object.ptr(), &view_, PyBUF_SIMPLE) != 0) {
      throw py::error_already_set();
    }
    exported_ = true;
    data_ = static_cast<const unsigned char*>(view_.buf);
    size_ = static_cast<std::size_t>(view_.len);
  }
  ByteView(const ByteView&) = delete;
  ByteView& operator=(const ByteView&) = delete;
  ~ByteView() {
    if (exported_) {
      PyBuffer_Release(&view_);
    }
  }
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  Py_buffer view_{};
  bool exported_ = false;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

inline std::string dim3_text(const Dim3& dim) {
  return "(" + std::to_string(dim[0]) + ", " + std::to_string(dim[1]) + ", " + std::to_string(dim[2]) + ")";
}

inline std::string device_text(int device) { return "device " + std::to_string(device); }

}  // namespace humming_aot::launcher
