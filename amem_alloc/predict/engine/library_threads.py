"""Libraries that would run a program's CUDA work in threads of their own, kept on the program's
thread under prediction.

Design note
-----------
The session's modes (device_mode.py, recorder.py) are torch's thread-local mode stacks: they see
the thread that entered them, the program's. Work a library hands to a thread pool of its own
runs with no mode, on torch's real CUDA, and stops at "Found no NVIDIA driver" with no GPU.
transformers 5 loads a checkpoint's tensors with a pool of up to 4 threads, each moving its
tensors to the target device (core_model_loading.py `spawn_materialize`): a model loaded with
`from_pretrained(..., device_map="cuda")`, or by a trainer that places it (TRL's GRPOTrainer),
failed so. Its own switch `HF_DEACTIVATE_ASYNC_LOAD` loads on the calling thread instead, the same
copies in the order the pool's results are used: each tensor moved once, as the pool moves it
(where a weight conversion merges tensors, the pool may hold more of them moved at once than the
calling thread does).
"""
from __future__ import annotations

from ...patching import PatchSet, declare

TRANSFORMERS_LOADING = declare("os.environ", "HF_DEACTIVATE_ASYNC_LOAD",
                               "transformers loads a checkpoint's tensors on the program's thread, where the "
                               "session's modes are (its loading threads would reach the real CUDA)")


def install(patches: PatchSet) -> None:
    patches.setenv(TRANSFORMERS_LOADING, "HF_DEACTIVATE_ASYNC_LOAD", "1")
