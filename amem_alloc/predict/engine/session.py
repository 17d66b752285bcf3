"""FakeCudaSession: run user code with fake CUDA tensors and record what CUDA's caching allocator
would be asked, in order: every storage's requested bytes, stream and free.

Design note
-----------
Inside the session every tensor is a meta tensor (execution.py): no compute, no memory on any
device, so a 7B-parameter model costs only its Python objects. torch's own dispatcher, autograd
engine and optimizers run unchanged, so lifetimes are torch's. Two modes do the work:
`execution.DeviceMode` (torch-function level: devices, autocast, attention backends, value reads)
and `execution.Recorder` (dispatch level: allocations). CUDA-only allocations are in cuda_rules.py.

Each allocation goes to the listeners at once (key, stream, AllocInfo). AllocInfo.category at that
moment is what the phase tells (an activation in forward, a gradient or autograd detail in
backward, optimizer state in a step); when the session exits, `infos` holds the final category
from the Tracer's classifier (provenance/classify.py), which knows which storages became
parameters, .grad and optimizer state.

What the session patches while active (restored on exit): autocast's "is CUDA available" check
and `torch.cuda.is_bf16_supported` (so `torch.autocast("cuda")` stays on),
`torch.clear_autocast_cache` (to drop the emulated cast cache where torch drops its own),
torch.nn.init's in-place initializers (they only write values; on fake tensors they do nothing),
and `torch.autograd._engine_run_backward` (so code that runs inside backward, such as
checkpoint recomputation, runs under the session's device and autocast handling).
"""
from __future__ import annotations

import bisect
import functools
import sys
import weakref
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import _disable_current_modes

from ...provenance import classify
from ...provenance.records import AllocRecord, next_seq
from ...provenance.scope import ModuleScope
from ...replay import ALLOC, FREE, Program, pack
from . import autocast as autocast_rules
from . import children
from .. import rules as cuda_rules
from .. import notes as notes_mod
from . import stream_uses
from .execution import DataDependentError, DeviceMode, Recorder, is_fake, unspoofed
from .storages import Storages, user_frames
from .known import KnownValues

__all__ = ["AllocInfo", "AllocationListener", "FakeCudaSession", "DataDependentError"]


@dataclass(frozen=True)
class AllocInfo:
    requested: int          # bytes the storage asked for (before the allocator's rounding)
    category: str           # the Tracer's categories (provenance/classify.py), or "workspace"
    module: str | None      # qualified module name active at allocation, if known
    op: str | None          # aten op, or "cublas_workspace"
    frames: tuple           # user frames (filename, line, name), innermost first; may be empty
    phase: str = ""         # forward, backward, optimizer or other, when it was allocated


class AllocationListener(Protocol):
    def on_alloc(self, key: int, stream: int, info: AllocInfo) -> None: ...
    def on_free(self, key: int) -> None: ...
    def on_marker(self, name: str) -> None: ...


GATHERED_PARAMETER = "parameter (gathered)"   # FSDP's unsharded parameters (_unsharding)
_UNSHARDING = {"alloc_storage", "_alloc_storage"}   # FSDP2's _fsdp_param.py, FSDP1's distributed/utils.py


def _unsharding(frame, depth: int = 3) -> bool:
    """Whether a storage's resize_ comes from FSDP refilling an unsharded parameter: FSDP2's
    `alloc_storage` (the all-gather output a parameter is a view of), FSDP1's `_alloc_storage`
    (the padded flat parameter, and under MixedPrecision the low-precision copy of the shard it is
    gathered from, through TypedStorage._resize_). torch regrows a freed storage
    with resize_ for nothing else; the storage's earlier life (the first all-gather output, made
    by torch.empty) was the same parameter and is labelled with it."""
    while frame is not None and depth > 0:
        if frame.f_code.co_name in _UNSHARDING and "distributed" in frame.f_code.co_filename:
            return True
        frame, depth = frame.f_back, depth - 1
    return False


_INHERITED = object()   # a patched class attribute that the class itself did not define

_PHASE_GUESS = {"forward": "activation", "backward": "autograd_detail", "optimizer": "optimizer_state",
                "other": "temporary"}


def _set_capturable(optimizer) -> None:
    """What dynamo does to an optimizer whose step it compiles (_dynamo/variables/optimizer.py
    `_set_capturable`): each param group with a `capturable` option, all of whose parameters are
    on the GPU and none of which has state yet, becomes capturable, for good; its state (`step`
    included) is then made on the parameters' device."""
    for group in optimizer.param_groups:
        params = group.get("params", [])
        if "capturable" in group and all(p.is_cuda for p in params) and not any(p in optimizer.state for p in params):
            group["capturable"] = True


def _value_only(fn):
    """torch.nn.init's in-place initializers write a weight's values, nothing else: under prediction
    they return the tensor unchanged, on fake tensors and on real CPU ones alike (a weight made on
    the CPU becomes a fake parameter; initialising a 7B model for real takes minutes and 28 GB)."""
    def init(tensor, *args, **kwargs):
        if isinstance(tensor, torch.Tensor):
            return tensor
        return fn(tensor, *args, **kwargs)
    init.__name__ = fn.__name__
    return init


class FakeCudaSession:
    """Context manager: from __enter__ on, tensors are fake and CUDA storages are recorded."""

    def __init__(self, device_count: int = 1, device_name: str = "NVIDIA H100 80GB HBM3",
                 capability: tuple[int, int] = (9, 0), total_memory: int = 80 * 2**30, frames: bool = True,
                 strict: bool = False):
        self.strict = strict   # a value read stops the prediction instead of getting a stand-in (values.py)
        self.device_count, self.device_name = device_count, device_name
        self.capability, self.total_memory = tuple(capability), total_memory
        self.record_frames = frames
        self.listeners: list = []
        self.ops: list[tuple[int, int, int, int]] = []   # (kind, key, size, stream)
        self.markers: list[tuple[int, str]] = []         # (op index, name)
        self.infos: dict[int, AllocInfo] = {}
        self.records: dict[int, AllocRecord] = {}
        self.know = classify.Knowledge()
        self.storages = Storages(self._on_alloc, self._on_free)
        self.known = KnownValues()   # the real values of small fake tensors made from known data
        self.modules = ModuleScope.every_module()  # the module running now (provenance/scope.py)
        self._workspaces: dict[tuple, int] = {}   # (thread, stream) -> key
        self.gathered_params: set[int] = set()   # keys of FSDP's unsharded parameters (_unsharding)
        self._patches: list = []
        self._modes: list = []
        self._in_backward = False
        self._compiled_depth = 0   # > 0 inside a function given to torch.compile
        self._stream_id = None
        self._phase_override: str | None = None
        self._default_cuda = False
        self.notes = notes_mod.Notes()   # stand-ins, estimates, what was not modelled (notes.py)

    # ------------------------------------------------------------------ interface
    def add_listener(self, listener: AllocationListener) -> None:
        self.listeners.append(listener)

    def marker(self, name: str) -> None:
        self.markers.append((len(self.ops), name))
        for lst in self.listeners:
            lst.on_marker(name)

    @property
    def program(self) -> Program:
        return Program(pack(self.ops), 0, 0)

    def __enter__(self) -> "FakeCudaSession":
        notes_mod.activate(self.notes)
        autocast_rules.install(self)
        self._patch()
        self.stream_uses = stream_uses.install(self)   # record_stream: frees held for other streams
        self.modules.install()
        self._hooks = [register_optimizer_step_pre_hook(self._opt_pre),
                       register_optimizer_step_post_hook(self._opt_post)]
        self._modes = [DeviceMode(self.storages, self), Recorder(self.storages, self)]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for m in reversed(self._modes):
            m.__exit__(None, None, None)
        self._modes = []
        stream_uses.finish(self.stream_uses)
        for h in self._hooks:
            h.remove()
        self.modules.remove()
        self._unpatch()
        autocast_rules.install(None)
        autocast_rules.clear_cache()
        notes_mod.deactivate(self.notes)
        self._learn_model_state()
        self.infos = self.final_infos()

    # ------------------------------------------------------------------ recording
    def default_cuda(self) -> bool:
        return self._default_cuda

    def stream(self) -> int:
        """The current stream's id as torch.cuda under prediction tells it (0 without its shims)."""
        if self._stream_id is None:
            try:
                from ..shims.cuda import current_stream_id
                self._stream_id = current_stream_id
            except ImportError:
                self._stream_id = lambda: 0
        return int(self._stream_id())

    def phase(self) -> str:
        if self._phase_override:
            return self._phase_override
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        return "forward" if self.modules.module is not None or torch.is_grad_enabled() else "other"

    def _on_alloc(self, key: int, nbytes: int, op: str, t) -> None:
        if children.in_child():
            raise children.cuda_in_child()
        phase = self.phase()
        if phase == "backward" and not self._in_backward:
            self.know.backward_starts.append(next_seq())
        self._in_backward = phase == "backward"
        module = self.modules.module
        rec = AllocRecord(op, module, phase, "cuda:0", key, nbytes,
                          str(t.dtype).replace("torch.", "") if t is not None else "uint8",
                          tuple(t.shape) if t is not None else (nbytes,))
        self.records[key] = rec
        category = "workspace" if t is None else _PHASE_GUESS[phase]
        info = AllocInfo(nbytes, category, module, op, user_frames() if self.record_frames else (), phase)
        self.infos[key] = info
        stream = self.stream()
        self.ops.append((ALLOC, key, nbytes, stream))
        for lst in self.listeners:
            lst.on_alloc(key, stream, info)

    def _on_free(self, key: int) -> None:
        rec = self.records.get(key)
        if rec is not None:
            rec.freed_seq = next_seq()
        self.ops.append((FREE, key, 0, 0))
        for lst in self.listeners:
            lst.on_free(key)

    def _cublas_workspace(self) -> None:
        """torch keeps one workspace per (cuBLAS handle, stream), and handles are per thread:
        backward runs on the autograd engine's device thread, so it gets a workspace of its own."""
        where = ("autograd" if torch._C._current_graph_task_id() != -1 else "main", self.stream())
        if where not in self._workspaces:
            self._workspaces[where] = self.storages.alloc_extra(
                cuda_rules.cublas_workspace_bytes(self.capability), "cublas_workspace")

    # ------------------------------------------------------------------ what storages are
    def _mark(self, t, table: dict, label: str) -> None:
        t = getattr(t, "_local_tensor", t)   # a DTensor (FSDP2, tensor parallel): its shard's storage
        if isinstance(t, torch.Tensor):
            key = self.storages.key_of(t)
            if key is not None and key in self.records:
                table[key] = label
                rec = self.records[key]
                if table is self.know.model_state:
                    rec.add_role("parameter")   # stays one once freed (Lightning's teardown moves the model back to the CPU)
                elif table is self.know.grads:
                    rec.add_role("gradient")
                elif table is self.know.optimizer_state:
                    rec.add_role("optimizer_state")

    def _learn_model_state(self) -> None:
        for root in self.modules.roots:
            for name, p in list(root.named_parameters()) + list(root.named_buffers()):
                self._mark(p, self.know.model_state, ("parameter", name))
                self._mark(p.grad if isinstance(p, torch.nn.Parameter) else None, self.know.grads, name)

    def _compiled(self, fn):
        """`fn` run as eager, marked as a compiled region while it runs."""
        @functools.wraps(fn)
        def run(*args, **kwargs):
            self._compiled_depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._compiled_depth -= 1
        return run

    def _opt_pre(self, optimizer, args, kwargs):
        if self._compiled_depth:
            _set_capturable(optimizer)
        self._learn_optimizer_params(optimizer)
        self._phase_override = "optimizer"
        return self._closure_in_its_own_phase(optimizer, args, kwargs)

    def _learn_optimizer_params(self, optimizer) -> None:
        self._learn_model_state()
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._mark(p, self.know.model_state, ("parameter", "optimizer param"))
                self._mark(p.grad, self.know.grads, "optimizer param")

    def _closure_in_its_own_phase(self, optimizer, args, kwargs):
        """`optimizer.step(closure)` (torch/optim/optimizer.py: args[0] is the optimizer) runs the
        closure inside the step: Lightning's automatic optimization and LBFGS run forward and
        backward there. The closure's allocations take their own phase (forward, backward), not
        the optimizer's, and the gradients it leaves are learnt as the step's. Returns the
        step's (args, kwargs) with the closure wrapped, or None when there is no closure."""
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure):
            return None

        @functools.wraps(closure)
        def run_closure(*a, **k):
            outer, self._phase_override = self._phase_override, None
            try:
                return closure(*a, **k)
            finally:
                self._phase_override = outer
                self._learn_optimizer_params(optimizer)
        if "closure" in kwargs:
            return args, {**kwargs, "closure": run_closure}
        return (args[0], run_closure, *args[2:]), kwargs

    def _opt_post(self, optimizer, args, kwargs) -> None:
        self._phase_override = None
        for state in optimizer.state.values():
            for name, v in state.items():
                self._mark(v, self.know.optimizer_state, name)

    def final_infos(self) -> dict[int, AllocInfo]:
        """AllocInfo per key with the Tracer's category as known now."""
        out = {}
        for key, info in self.infos.items():
            rec = self.records.get(key)
            if key in self.gathered_params:
                out[key] = replace(info, category=GATHERED_PARAMETER)
                continue
            if info.category == "workspace" or rec is None:
                out[key] = info
                continue
            cat = classify.category(key, rec, self.know) or info.category
            out[key] = replace(info, category=cat)
        return out

    # ------------------------------------------------------------------ patches
    def _patch(self) -> None:
        import torch.cuda.amp.common as amp_common
        cap = self.capability
        self._set(amp_common, "amp_definitely_not_available", lambda: False)
        self._set(torch.cuda, "is_bf16_supported", lambda *a, **k: cap[0] >= 8)
        orig_clear = torch.clear_autocast_cache

        def clear():
            autocast_rules.clear_cache()
            orig_clear()
        self._set(torch, "clear_autocast_cache", clear)
        self._patch_init()
        self._patch_host()
        self._patch_compile()
        orig_resize = torch.UntypedStorage.resize_

        def resize_(storage, size):   # outside any op: FSDP frees and refills storages so
            before = self.storages.key_of_storage(storage)
            out = orig_resize(storage, size)
            if storage.device.type == "meta":
                self.storages.resized(storage, int(size))
                if int(size) > 0 and _unsharding(sys._getframe(1)):
                    self.gathered_params.update({before, self.storages.key_of_storage(storage)} - {None})
            return out
        self._set(torch.UntypedStorage, "resize_", resize_)
        orig_data_ptr = torch.UntypedStorage.data_ptr

        def data_ptr(storage):   # not a torch function: no mode sees it (transformers' id_tensor_storage asks)
            return self.storages.address(storage) if storage.device.type == "meta" else orig_data_ptr(storage)
        self._set(torch.UntypedStorage, "data_ptr", data_ptr)
        orig_run = torch.autograd._engine_run_backward

        def run_backward(*args, **kwargs):
            # backward() is a torch function: the mode runs it with itself popped. Push a mode
            # again so that the hooks backward runs (FSDP's, DDP's, a script's) see CUDA devices
            # as in forward, and checkpoint recomputation gets CUDA's autocast and kernels.
            with DeviceMode(self.storages, self):
                return orig_run(*args, **kwargs)
        self._set(torch.autograd, "_engine_run_backward", run_backward)
        self._patch_unpack_hooks()

    def _patch_unpack_hooks(self) -> None:
        """Saved-tensor pack hooks run inside the op that saves (the mode popped: fake tensors show
        their real device, meta); their unpack hooks run in backward, where devices answer CUDA.
        Each unpack hook runs `unspoofed`, so it sees the tensors as its pack hook did: checkpoint
        compares the recomputed tensors' devices with the ones its pack hook recorded
        (torch/utils/checkpoint.py, `_default_meta_extractor`)."""
        import torch._C._autograd as autograd_c
        push = autograd_c._push_saved_tensors_default_hooks

        def push_hooks(pack_hook, unpack_hook):
            @functools.wraps(unpack_hook)
            def unpack(packed):
                with unspoofed():
                    return unpack_hook(packed)
            return push(pack_hook, unpack)
        self._set(autograd_c, "_push_saved_tensors_default_hooks", push_hooks)

    def _patch_init(self) -> None:
        """torch.nn.init's in-place initializers only write values (some loop on them, e.g.
        trunc_normal_'s rejection sampling): they return the tensor unchanged (_value_only)."""
        import torch.nn.init as init
        for name in dir(init):
            fn = getattr(init, name)
            if name.endswith("_") and not name.startswith("_") and callable(fn):
                self._set(init, name, _value_only(fn))
        self._default_cuda = False

    def _patch_host(self) -> None:
        """Parameters are fake wherever they are made (their values never decide what CUDA
        allocates; a 7B model on the CPU would need 28 GB), and pinning host memory, which needs a
        CUDA driver, makes an ordinary copy. Both are patched on the classes, not in the modes: the
        DataLoader pins batches in a thread of its own, where no mode is active."""
        orig_new = torch.nn.Parameter.__new__
        pinned = weakref.WeakSet()

        def parameter(cls, data=None, requires_grad=True):
            if isinstance(data, torch.Tensor) and not is_fake(data):
                with torch._C.DisableTorchFunction(), _disable_current_modes():
                    data = torch.empty_strided(data.shape, data.stride(), dtype=data.dtype, device="meta")
            return orig_new(cls, data, requires_grad)

        def pin_memory(t, device=None):
            if is_fake(t):
                return t
            out = t.clone()
            pinned.add(out)
            return out

        self._set(torch.nn.Parameter, "__new__", parameter)
        self._set(torch.Tensor, "pin_memory", pin_memory)
        self._set(torch.Tensor, "is_pinned", lambda t, device=None: t in pinned)

    def _patch_compile(self) -> None:
        """torch.compile: compiled code is predicted as eager, and the output says so. One thing
        compiling changes is kept: an optimizer step run inside a compiled function gets
        `capturable=True`, as dynamo sets it (torch/_dynamo/variables/optimizer.py
        `_set_capturable`), so its `step` counts live on the GPU (see _opt_pre)."""
        what = ("torch.compile: compiled code predicted as eager (what AOTAutograd saves for backward "
                "and inductor's buffer reuse and fusion of temporaries are not modelled; a compiled "
                "optimizer step's capturable state is)")

        def compile(model=None, **kwargs):
            notes_mod.record(notes_mod.NOT_MODELLED, what)
            if model is None:
                return lambda fn: compile(fn, **kwargs)
            if isinstance(model, torch.nn.Module) or not callable(model):
                return model
            return self._compiled(model)

        def module_compile(module, *args, **kwargs):
            notes_mod.record(notes_mod.NOT_MODELLED, what)

        self._set(torch, "compile", compile)
        self._set(torch.nn.Module, "compile", module_compile)

    def _set(self, obj, name, value) -> None:
        own = vars(obj).get(name, _INHERITED) if isinstance(obj, type) else getattr(obj, name)
        self._patches.append((obj, name, own))
        setattr(obj, name, value)

    def _unpatch(self) -> None:
        for obj, name, value in reversed(self._patches):
            if value is _INHERITED:
                delattr(obj, name)
            else:
                setattr(obj, name, value)
        self._patches = []
