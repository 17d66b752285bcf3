// libc10.cpp — see libc10.h.
#include "libc10.h"

#include <dlfcn.h>

namespace amem {

void* libc10_symbol(const char* mangled) { return torch_library_symbol("libc10.so", mangled); }

void* torch_library_symbol(const char* soname, const char* mangled) {
  void* lib = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);  // torch's own copy, if loaded
  if (lib == nullptr) return nullptr;
  void* symbol = dlsym(lib, mangled);
  dlclose(lib);  // drops only the reference NOLOAD added; torch keeps the library loaded
  return symbol;
}

}  // namespace amem
