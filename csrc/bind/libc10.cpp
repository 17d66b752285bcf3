// libc10.cpp — see libc10.h.
#include "libc10.h"

#include <dlfcn.h>

namespace amem {

void* libc10_symbol(const char* mangled) {
  void* lib = dlopen("libc10.so", RTLD_NOW | RTLD_NOLOAD);  // torch's own copy, if loaded
  if (lib == nullptr) return nullptr;
  void* symbol = dlsym(lib, mangled);
  dlclose(lib);  // drops only the reference NOLOAD added; torch keeps the library loaded
  return symbol;
}

}  // namespace amem
