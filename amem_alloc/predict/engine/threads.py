"""Threads under prediction: the program's own threads see fake CUDA as its main thread does, and
libraries that would move tensors in a pool of their own do it on the program's thread.

Design note
-----------
The session's modes (device_mode.py, recorder.py) are torch's thread-local mode stacks: they see
the thread that entered them. A thread the program starts (ultralytics plots a batch in one, a
server runs requests in a pool, a prefetcher copies the next batch) began with no mode: a fake
tensor there answered "meta", its ops allocated nothing that the prediction saw (a 256 MiB tensor
made in a worker thread was missing from the peak, silently), and a copy to the host failed with
"Cannot copy out of meta tensor". So while a prediction runs, every `threading.Thread` started
(concurrent.futures' pools are made of them) runs its body with the session's two modes pushed,
in the main thread's order; its per-thread answers (current device and stream, autocast and grad
mode) start as a new thread's do on a GPU. A thread that outlives the session finds the modes
closed and passes every call through (device_mode.py, recorder.py: `closed`). Threads started
before the prediction, and C++ threads (the autograd engine's carry the modes themselves), are
left alone. Allocations from several threads interleave as the threads run, as on the GPU.

transformers 5 loads a checkpoint's tensors with a pool of up to 4 threads, each moving its
tensors to the target device (core_model_loading.py `spawn_materialize`). Its own switch
`HF_DEACTIVATE_ASYNC_LOAD` loads on the calling thread instead: the same copies, in the order the
pool's results are used, the same from run to run (each tensor moved once, as the pool moves it;
where a weight conversion merges tensors, the pool may hold more of them moved at once than the
calling thread does).
"""
from __future__ import annotations

import threading
from typing import Callable

import torch
from torch.utils._python_dispatch import _pop_mode, _push_mode

from ...patching import PatchSet, declare

TRANSFORMERS_LOADING = declare("os.environ", "HF_DEACTIVATE_ASYNC_LOAD",
                               "transformers loads a checkpoint's tensors on the program's thread, where the "
                               "session's modes are (its loading threads would reach the real CUDA)")
PROGRAM_THREADS = declare("threading.Thread", "_bootstrap_inner",
                          "a thread started during the prediction runs with the session's modes, as the "
                          "program's thread does: its CUDA work is fake and recorded")


def install(patches: PatchSet, modes: Callable[[], list]) -> None:
    """Threads started from now until `patches` close run with `modes()` (the session's function
    mode, then its dispatch mode) pushed; transformers loads on the calling thread."""
    patches.setenv(TRANSFORMERS_LOADING, "HF_DEACTIVATE_ASYNC_LOAD", "1")
    original = threading.Thread._bootstrap_inner

    def bootstrap_inner(thread):
        pushed = list(modes())
        if not pushed:
            return original(thread)
        function_mode, dispatch_mode = pushed
        torch._C._push_on_torch_function_stack(function_mode)
        _push_mode(dispatch_mode)
        try:
            return original(thread)
        finally:
            _pop_mode()
            torch._C._pop_torch_function_stack()

    patches.apply(PROGRAM_THREADS, threading.Thread, "_bootstrap_inner", bootstrap_inner)
