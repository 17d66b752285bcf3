// torch_oom.cpp — see Note [raising torch.OutOfMemoryError] in torch_oom.h.
#include "torch_oom.h"

#include <cxxabi.h>

#include <cstdint>
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

struct TorchOom {
  Constructor construct = nullptr;
  std::type_info* type = nullptr;
};

const TorchOom& resolve() {
  static TorchOom oom;
  static std::once_flag once;
  std::call_once(once, [] {
    auto construct = reinterpret_cast<Constructor>(libc10_symbol(kConstructor));
    auto type = static_cast<std::type_info*>(libc10_symbol(kTypeInfo));
    if (construct != nullptr && type != nullptr) oom = {construct, type};
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
