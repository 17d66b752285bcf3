/* A CUDA driver (libcuda.so.1) that writes down every call made to it: tests/test_no_driver.py puts
 * it first on LD_LIBRARY_PATH and predicts real programs, so any path by which a prediction reaches
 * the driver shows up, with the Python stack that made it, in the file $AMEM_LOUD_DRIVER_LOG, even
 * when the error it returns is caught by a library. Each entry point answers as a machine with no
 * GPU does (an error), so the program goes on as it would there.
 *
 * The Python stack is printed through the interpreter the process runs (the symbols come from the
 * python executable itself; nothing is linked). */
#include <stdio.h>
#include <stdlib.h>

extern int PyGILState_Ensure(void);
extern void PyGILState_Release(int);
extern int PyRun_SimpleString(const char*);
extern int Py_IsInitialized(void);

static void called(const char* what) {
  const char* path = getenv("AMEM_LOUD_DRIVER_LOG");
  if (path == NULL) return;
  FILE* log = fopen(path, "a");
  if (log == NULL) return;
  fprintf(log, "=== %s\n", what);
  fclose(log);
  if (Py_IsInitialized()) {
    int gil = PyGILState_Ensure();
    PyRun_SimpleString(
        "import os, traceback\n"
        "with open(os.environ['AMEM_LOUD_DRIVER_LOG'], 'a') as f:\n"
        "    traceback.print_stack(file=f)\n");
    PyGILState_Release(gil);
  }
}

#define CUDA_ERROR_NO_DEVICE 100
#define LOUD(name)                \
  int name() {                    \
    called(#name);                \
    return CUDA_ERROR_NO_DEVICE;  \
  }

LOUD(cuInit)
LOUD(cuDriverGetVersion)
LOUD(cuGetProcAddress)
LOUD(cuGetProcAddress_v2)
LOUD(cuDeviceGetCount)
LOUD(cuDeviceGet)
LOUD(cuDevicePrimaryCtxRetain)
LOUD(cuCtxGetCurrent)
LOUD(cuGetExportTable)
LOUD(cuMemAlloc_v2)
LOUD(cuMemGetInfo_v2)
