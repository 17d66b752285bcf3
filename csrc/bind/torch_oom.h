// torch_oom.h — raise torch's own OutOfMemoryError from the plugin.
//
// Note [raising torch.OutOfMemoryError]
// -------------------------------------
// torch turns a C++ exception from a pluggable allocator into a Python
// exception in its bindings (HANDLE_TH_ERRORS): c10::OutOfMemoryError becomes
// torch.OutOfMemoryError, anything else a bare RuntimeError (pytorch#133280).
// So code that catches torch.OutOfMemoryError only works if the plugin throws a
// real c10::OutOfMemoryError — one whose type_info *is* libc10's.
//
// We do not compile against torch (the extension must load under every torch
// from 2.11 on). Instead, at run time we find libc10.so, which torch has
// already loaded, and take from it the exported constructor
// c10::OutOfMemoryError(SourceLocation, std::string) and the exported
// `typeinfo for c10::OutOfMemoryError`. We allocate the exception object with
// the C++ ABI (__cxa_allocate_exception), construct it with torch's own
// constructor, and throw it with __cxa_throw and torch's own type_info, so the
// catch in torch's bindings matches by identity. The destructor __cxa_throw
// needs is the object's virtual destructor, slot 0 of its vtable (Itanium C++
// ABI: c10::Error's primary base is std::exception, whose first virtual
// function is its destructor).
//
// Note [OutOfMemoryError before 2.13]: torch 2.11 and 2.12's libc10 exports
// neither that constructor nor that type_info; the class's type_info and
// vtable exist only as weak copies in libc10_cuda, libtorch_cuda and
// libtorch_python. OutOfMemoryError adds no data members to c10::Error
// (`using Error::Error;`, c10/util/Exception.h), so we construct a c10::Error
// with libc10's exported constructor, point the object's vptr at
// OutOfMemoryError's vtable (its address point, 16 bytes in), and throw it with
// that copy's type_info. The catch in torch's bindings matches it: libstdc++
// compares type_infos by name, and the copy's bases are libc10's c10::Error.
// We take the vtable and type_info from the same library and check that the
// vtable names that type_info before using them.
//
// Robustness: the mangled constructor name encodes the std::string ABI, so a
// torch built with another ABI simply does not match; c10::SourceLocation has
// been {function, file, line} in every torch we support. If anything is
// missing the caller throws amem's own error instead (a RuntimeError in
// Python) — never undefined behaviour. torch_oom_check() exercises the whole
// path on a CPU so the tests prove it without a GPU.
#pragma once

#include <string>

namespace amem {

// True when libc10's OutOfMemoryError can be thrown in this process.
bool torch_oom_available();
// Throws c10::OutOfMemoryError(message); returns only if that is unavailable.
void throw_torch_oom(const std::string& message);
// Throws through the real path and catches it here: returns the caught
// exception's type name and message (for tests), or "" when unavailable.
std::string torch_oom_check(const std::string& message);

}  // namespace amem
