// torch_oom.cpp — see Note [raising torch.OutOfMemoryError] in torch_oom.h.
#include "torch_oom.h"

#include <cxxabi.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <typeinfo>

#include "libc10.h"

namespace amem {
namespace {

struct SourceLocation {  // c10::SourceLocation
  const char* function;
  const char* file;
  uint32_t line;
};

using Constructor = void (*)(void* self, SourceLocation where, std::string message);
using Destructor = void (*)(void*);

constexpr size_t kExceptionBytes = 4096;  // more than any c10::Error subclass needs
constexpr const char* kConstructor =
    "_ZN3c1016OutOfMemoryErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";
constexpr const char* kTypeInfo = "_ZTIN3c1016OutOfMemoryErrorE";
// torch 2.11/2.12 (Note [OutOfMemoryError before 2.13] in torch_oom.h).
constexpr const char* kErrorConstructor =
    "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";
constexpr const char* kVtable = "_ZTVN3c1016OutOfMemoryErrorE";
constexpr const char* kTypeName = "N3c1016OutOfMemoryErrorE";  // std::type_info::name()
constexpr const char* const kWeakCopies[] = {"libc10_cuda.so", "libtorch_cuda.so", "libtorch_python.so"};

struct TorchOom {
  Constructor construct = nullptr;
  std::type_info* type = nullptr;
  void* const* vtable = nullptr;  // set: construct is c10::Error's, and the object becomes an OutOfMemoryError
};

// torch 2.13+: libc10 exports the class's constructor and type_info.
TorchOom from_libc10() {
  auto construct = reinterpret_cast<Constructor>(libc10_symbol(kConstructor));
  auto type = static_cast<std::type_info*>(libc10_symbol(kTypeInfo));
  if (construct == nullptr || type == nullptr) return {};
  return {construct, type, nullptr};
}

// torch 2.11/2.12: c10::Error's exported constructor, then the vtable and
// type_info of a weak copy of the class in one of torch's CUDA libraries.
TorchOom from_weak_copies() {
  auto construct = reinterpret_cast<Constructor>(libc10_symbol(kErrorConstructor));
  if (construct == nullptr) return {};
  for (const char* lib : kWeakCopies) {
    auto vtable = static_cast<void* const*>(torch_library_symbol(lib, kVtable));
    // Itanium ABI: a vtable starts {offset to top = 0, &type_info}; anything else is not what we think.
    if (vtable == nullptr || vtable[0] != nullptr || vtable[1] == nullptr) continue;
    auto type = static_cast<std::type_info*>(vtable[1]);  // the copy the loader bound this vtable to
    if (std::strcmp(type->name(), kTypeName) != 0) continue;
    return {construct, type, vtable};
  }
  return {};
}

const TorchOom& resolve() {
  static TorchOom oom;
  static std::once_flag once;
  std::call_once(once, [] {
    oom = from_libc10();
    if (oom.construct == nullptr) oom = from_weak_copies();
  });
  return oom;
}

void destroy(void* object) {  // the virtual destructor: vtable slot 0
  (*static_cast<Destructor**>(object))[0](object);
}

}  // namespace

bool torch_oom_available() { return resolve().construct != nullptr; }

void throw_torch_oom(const std::string& message) {
  const TorchOom& oom = resolve();
  if (oom.construct == nullptr) return;
  void* object = abi::__cxa_allocate_exception(kExceptionBytes);
  try {
    oom.construct(object, SourceLocation{"amem_malloc", __FILE__, __LINE__}, message);
  } catch (...) {
    abi::__cxa_free_exception(object);
    return;
  }
  // A c10::Error made an OutOfMemoryError: the vtable's address point is 2 entries in.
  if (oom.vtable != nullptr) *static_cast<void* const**>(object) = oom.vtable + 2;
  abi::__cxa_throw(object, oom.type, &destroy);
}

std::string torch_oom_check(const std::string& message) {
  if (!torch_oom_available()) return "";
  try {
    throw_torch_oom(message);
  } catch (const std::exception& caught) {
    return std::string(typeid(caught).name()) + ": " + caught.what();
  }
  return "";
}

}  // namespace amem
