"""What a prediction session changes in torch while it runs: each change declared here (the table
docs/predict.md prints, amem_alloc/patching.py) and applied through the session's PatchSet, so all
of it is undone when the session ends, whatever happened inside.

The changes, and why:

* autocast's "is CUDA available" check and `torch.cuda.is_bf16_supported`: `torch.autocast("cuda")`
  stays on with no GPU (autocast.py applies CUDA's policy to fake tensors);
* `torch.clear_autocast_cache`: the emulated cast cache is dropped where torch drops its own;
* torch.nn.init's in-place initializers: they only write values (some loop on them, e.g.
  trunc_normal_'s rejection sampling), so they return the tensor unchanged;
* `torch.nn.Parameter.__new__`, `Tensor.pin_memory`, `Tensor.is_pinned`: parameters are fake
  wherever they are made (their values never decide what CUDA allocates; a 7B model on the CPU
  would need 28 GB; a tensor subclass wrapping tensors, torchao's quantized weights or a
  DTensor, stays what it is: the tensors it holds are already fake), and pinning host memory,
  which needs a CUDA driver, makes an ordinary copy; both on the classes, not in the modes: the
  DataLoader pins batches in a thread of its own;
* `torch.nn.Module._apply` (`.cuda()`, `.to()`): a model moved holds parameters and buffers, though
  its forward may never run (its weights read directly, `F.linear(x, m.weight)`);
* `torch.compile` and `nn.Module.compile`: inductor's regions are predicted as compiled
  (compiled.py), other backends run as eager and the output says so (keeping what compiling
  changes for an optimizer step: capturable state);
* `UntypedStorage.resize_` and `UntypedStorage.data_ptr`: FSDP frees and refills storages outside
  any op, and programs key tensors by address (no mode sees either call); a host storage moved to
  CUDA (`torch.load(..., map_location="cuda")` moves each storage so) is a fake CUDA storage;
* `torch.autograd._engine_run_backward`: backward's hooks and checkpoint recomputation run with the
  device mode pushed again (a torch function mode is popped while it handles backward());
* `_push_saved_tensors_default_hooks`: saved-tensor unpack hooks see tensors as their pack hooks
  did (meta), as checkpoint's device check needs;
* `torch.cuda.FloatTensor` and the nine other legacy CUDA types, and `torch.set_default_tensor_type`:
  the legacy typed-tensor API makes fake CUDA tensors (legacy_types.py) where torch's C++ would
  initialise CUDA. The default dtype and default device a script sets (`set_default_tensor_type`,
  `set_default_device("cuda")`, which DeviceMode follows) are put back when the session ends;
* `torch._C._scatter` and `_gather`: torch.nn.DataParallel's split and join on the one device
  predicted, in ops the modes record (data_parallel.py);
* `torch.autograd.profiler.profile.__init__` (what `torch.profiler.profile` runs too): CUDA
  activity is off, as torch turns it off where CUDA is not available (the shims say it is, and
  torch would then record a CUDA event per op, each failing with a C++ warning and its stack);
  noted. The CPU's events are profiled instead, also where only CUDA's were asked for (torch
  refuses a profiler with no activity). `torch.cuda.profiler.start`/`stop` (an external
  profiler's capture range, nsys's `--capture-range=cudaProfilerApi`) return at once, noted: they
  would ask the driver.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes, is_traceable_wrapper_subclass

from ...patching import PatchSet, declare, declare_many
from .. import notes as notes_mod
from ..notes import NotModelledError
from . import autocast as autocast_rules
from . import compiled as compiled_mod
from . import data_parallel, legacy_types, module_hooks
from .device_mode import DeviceMode
from .values import is_fake

AMP_AVAILABLE = declare("torch.cuda.amp.common", "amp_definitely_not_available",
                        "autocast(\"cuda\") stays on without a GPU (autocast.py applies CUDA's policy)")
BF16 = declare("torch.cuda", "is_bf16_supported", "the chosen card's bf16 support, not this machine's")
CLEAR_CACHE = declare("torch", "clear_autocast_cache", "drops the emulated cast cache where torch drops its own")
INIT = declare("torch.nn.init", "every in-place initializer (name_)",
               "initializers only write values: they return the tensor unchanged (no minutes of real init)")
PARAMETER = declare("torch.nn.Parameter", "__new__", "parameters are fake wherever they are made")
MODULE_APPLY = declare("torch.nn.Module", "_apply", "a model moved to the GPU holds parameters, whether or not its "
                       "forward ever runs (F.linear(x, m.weight))")
PIN = declare("torch.Tensor", "pin_memory", "pinning needs a CUDA driver: an ordinary copy")
IS_PINNED = declare("torch.Tensor", "is_pinned", "answers for the copies pin_memory made")
COMPILE = declare("torch", "compile", "inductor's regions predicted as compiled (torch traces them on its fake CUDA "
                  "tensors); other backends run as eager, noted")
MODULE_COMPILE = declare("torch.nn.Module", "compile", "the module's call compiled as torch.compile's is")
HOOKS_WARNING = declare("torch._dynamo.eval_frame.OptimizedModule", "its warning of global module hooks",
                        "not shown: torch.compile(module)'s OptimizedModule warns at every call while any global "
                        "module hook exists, and the session's module tracking is one (not the program's)")
RESIZE = declare("torch.UntypedStorage", "resize_", "FSDP frees and refills storages outside any op: recorded")
DATA_PTR = declare("torch.UntypedStorage", "data_ptr", "a fake storage's address (programs key tensors by it)")
STORAGE_TO = declare("torch.storage", "_to (UntypedStorage.to, .cuda)",
                     "a host storage moved to CUDA is a fake CUDA storage of its bytes (torch.load's map_location "
                     "\"cuda\" moves each storage so): allocated, its values not copied")
LOCATION_TAG = declare("torch.serialization", "location_tag",
                       "torch.save names a fake CUDA storage's device as CUDA's (\"cuda:N\"), so torch.load "
                       "brings it back to CUDA as from a GPU run's checkpoint")
RUN_BACKWARD = declare("torch.autograd", "_engine_run_backward",
                       "backward's hooks and recomputation run with the device mode pushed again")
SAVED_TENSOR_HOOKS = declare("torch._C._autograd", "_push_saved_tensors_default_hooks",
                             "pack hooks see the devices the program sees, as unpack hooks do (checkpoint's "
                             "device check, its recomputation)")
GROUP_BY_DEVICE = declare("torch._C", "_group_tensors_by_device_and_dtype",
                          "torch's C++ grouping files fake tensors under the device they claim (cuda), not meta: "
                          "foreach and fused paths (clip_grad_norm_(foreach=True), optimizers) take CUDA's branch")

LEGACY_TYPES = declare_many("torch.cuda", legacy_types.NAMES,
                            "the legacy CUDA tensor types make and recognise fake CUDA tensors (legacy_types.py)")
DEFAULT_TENSOR_TYPE = declare("torch", "set_default_tensor_type",
                              "a CUDA type makes factories without a device allocate on (fake) CUDA")

PROFILER = declare("torch.autograd.profiler.profile", "__init__",
                   "CUDA activity off, as torch turns it off where CUDA is not available (noted)")
EXPORT = declare("torch.export", "export",
                 "a module with parameters that require grad, exported with grad enabled: not modelled, said in "
                 "one line (on torch's fake CUDA tensors autograd asks the CUDA driver, and with none the process aborts)")
CAPTURE_RANGE = declare_many("torch.cuda.profiler", ["start", "stop"],
                             "an external profiler's capture range: returns at once (it would ask the driver), noted")

_UNSHARDING = {"alloc_storage", "_alloc_storage"}   # FSDP2's _fsdp_param.py, FSDP1's distributed/utils.py
_EAGER_BACKENDS = ("eager", "aot_eager")   # torch.compile backends that run the captured graph eagerly
COMPILE_NOTE = ("torch.compile(backend={backend!r}): runs as eager (only inductor's compiled code is "
                "predicted as compiled)")


def apply(session: Any, patches: PatchSet) -> None:
    """Every change the session makes to torch, through `patches`."""
    _autocast(session, patches)
    _init(patches)
    _host(session, patches)
    _compile(session, patches)
    _storages(session, patches)
    _backward(session, patches)
    _grouping(session, patches)
    _legacy_types(session, patches)
    _profiler(patches)
    _export(patches)
    data_parallel.install(patches)


# ============================================================================ autocast
def _autocast(session: Any, patches: PatchSet) -> None:
    import torch.cuda.amp.common as amp_common

    cap = session.capability
    patches.apply(AMP_AVAILABLE, amp_common, "amp_definitely_not_available", lambda: False)
    patches.apply(BF16, torch.cuda, "is_bf16_supported", lambda *a, **k: cap[0] >= 8)
    orig_clear = torch.clear_autocast_cache

    def clear():
        autocast_rules.clear_cache()
        orig_clear()
    patches.apply(CLEAR_CACHE, torch, "clear_autocast_cache", clear)


# ============================================================================ values and host memory
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


def _init(patches: PatchSet) -> None:
    import torch.nn.init as init

    for name in dir(init):
        fn = getattr(init, name)
        if name.endswith("_") and not name.startswith("_") and callable(fn):
            patches.apply(INIT, init, name, _value_only(fn))


def _host(session: Any, patches: PatchSet) -> None:
    """Parameters are fake wherever they are made, and pinning makes an ordinary copy (see the note)."""
    orig_new = torch.nn.Parameter.__new__
    pinned = session.pinned

    def parameter(cls, data=None, requires_grad=True):
        if isinstance(data, torch.Tensor) and not is_fake(data) and not is_traceable_wrapper_subclass(data):
            with torch._C.DisableTorchFunction(), _disable_current_modes():
                data = torch.empty_strided(data.shape, data.stride(), dtype=data.dtype, device="meta")
        made = orig_new(cls, data, requires_grad)
        session.made_parameter(made)   # a copy no forward runs (an EMA model's deepcopy) is one too
        return made

    def pin_memory(t, device=None):
        if is_fake(t):
            return t
        out = t.clone()
        pinned.add(out)
        return out

    patches.apply(PARAMETER, torch.nn.Parameter, "__new__", parameter)
    _moved_models(session, patches)
    patches.apply(PIN, torch.Tensor, "pin_memory", pin_memory)
    patches.apply(IS_PINNED, torch.Tensor, "is_pinned", lambda t, device=None: not is_fake(t) and pinned.holds(t))


def _moved_models(session: Any, patches: PatchSet) -> None:
    """`.cuda()`, `.to()`, `.half()`... of a model (Module._apply, which recurses through its
    children): once the outermost call returns, its parameters and buffers are learnt as such."""
    orig_apply, depth = torch.nn.Module._apply, [0]

    def apply(module, *args, **kwargs):
        depth[0] += 1
        try:
            out = orig_apply(module, *args, **kwargs)
        finally:
            depth[0] -= 1
        if not depth[0]:
            session.learn_model(module)
        return out

    patches.apply(MODULE_APPLY, torch.nn.Module, "_apply", apply)


# ============================================================================ torch.compile
def _compile(session: Any, patches: PatchSet) -> None:
    """torch.compile: a module or a function compiled by inductor (the default backend) is predicted
    as compiled (compiled.py: torch's own dynamo and partition, on its fake CUDA tensors; a
    function's tensors read from globals, closures and objects are the session's, compile_inputs.py);
    a region the trace must not run (an optimizer step, side effects on Python objects) runs as
    eager and says why; the eager backends (eager, aot_eager) run as eager, as they do; another
    backend runs as eager and the output says so. An optimizer step inside a compiled function gets
    `capturable=True`, as dynamo sets it (torch/_dynamo/variables/optimizer.py `_set_capturable`;
    FakeCudaSession._opt_pre). Compiling switched off (`disable=True`, TORCHDYNAMO_DISABLE=1,
    TORCH_COMPILE_DISABLE=1) is torch's own: torch.compile itself says what comes back, and it runs
    as eager."""
    original = torch.compile

    def compile(model=None, **kwargs):
        if model is None:
            return lambda fn: compile(fn, **kwargs)
        if kwargs.get("disable") or _dynamo_disabled():
            return original(model, **kwargs)
        backend = kwargs.get("backend", "inductor")
        backend = backend if isinstance(backend, str) else getattr(backend, "__name__", "a custom backend")
        if backend != "inductor":
            return _eager_region(session, model, backend)
        if not isinstance(model, torch.nn.Module):
            if not callable(model) or _modelled_compiled(model):   # flex_attention: a rule of its own
                return _eager_region(session, model, "inductor")
            return compiled_mod.compiled_function(session, model, _inductor_options(kwargs))
        return compiled_mod.compiled_module(session, model, _inductor_options(kwargs))

    def module_compile(module, *args, **kwargs):
        where = notes_mod.call_site(2)
        module._compiled_call_impl = _hooks_around(session, module, compile(module._call_impl, **kwargs),
                                                   lambda: compile(module.forward, **kwargs), where)

    patches.apply(COMPILE, torch, "compile", compile)
    patches.apply(MODULE_COMPILE, torch.nn.Module, "compile", module_compile)
    patches.ignore_warning(HOOKS_WARNING, r"Using `torch\.compile\(module\)` when there are global hooks on modules")


def _dynamo_disabled() -> bool:
    """Whether torch has compiling switched off: TORCHDYNAMO_DISABLE=1 (torch._dynamo.optimize then
    returns the model as it is), TORCH_COMPILE_DISABLE=1 or `torch._dynamo.config.disable` (its
    frames are then never converted: the model runs as eager)."""
    if os.environ.get("TORCHDYNAMO_DISABLE", "") == "1":
        return True
    config = sys.modules.get("torch._dynamo.config")
    if config is not None:
        return bool(getattr(config, "disable", False))
    return os.environ.get("TORCH_COMPILE_DISABLE", "0") == "1"


OWN_HOOKS_NOTE = ("torch.compile region {name}: the module's own hooks ({hooks}) run as eager around its "
                  "compiled forward; torch traces hooks it can trace into the region")


def _hooks_around(session: Any, module: torch.nn.Module, region, compile_forward, where: str):
    """`module.compile()`'s call: the compiled region, or, while the module has forward or backward
    hooks of its own (FSDP2's `fully_shard`, applied after compiling, adds them), the module's call
    run as eager around its forward compiled, as torch runs FSDP2's hooks: dynamo never traces them
    (torch.distributed.fsdp's `_dynamo_disable`), so they run eager between the region's graphs.
    Hooks of another kind, which torch would trace into the region, are noted once at the
    `compile()` line (the region's memory is then the forward's; what the hooks allocate is eager)."""
    forward, skipped = [], []
    eager = session.compiled(module._call_impl, inductor=True)

    def call(*args, **kwargs):
        hooks = module_hooks.own(module)
        if not hooks:
            return region(*args, **kwargs)
        if module_hooks.torch_compiles_nothing(module):   # (module_hooks.py)
            if not skipped:
                skipped.append(True)
                compiled_mod.region_record(session, type(module).__name__, where, compiled_mod.FORWARD_SKIPPED.format(
                    forward=type(module).forward.__qualname__))
            return eager(*args, **kwargs)
        if not forward:
            forward.append(compile_forward())
            traced = [h for h in hooks if not module_hooks.dynamo_skips(module, h)]
            if traced:
                notes_mod.record(notes_mod.NOT_MODELLED, OWN_HOOKS_NOTE.format(name=type(module).__name__,
                                                                               hooks=", ".join(traced)), where=where)
        with module_hooks.forward_as(module, forward[0]):
            return module._call_impl(*args, **kwargs)
    return call


def _modelled_compiled(fn: Any) -> bool:
    """Functions whose compiled form has a rule of its own: flex_attention's fused kernel
    (rules/flex_attention.py), which torchtitan and FlexAttention's documentation compile alone."""
    flex = sys.modules.get("torch.nn.attention.flex_attention")
    return flex is not None and fn is getattr(flex, "flex_attention", None)


def _eager_region(session: Any, model, backend: str):
    if backend not in _EAGER_BACKENDS + ("inductor",):   # (the eager backends run as eager: nothing to note)
        notes_mod.record(notes_mod.NOT_MODELLED, COMPILE_NOTE.format(backend=backend))
    if isinstance(model, torch.nn.Module):
        return compiled_mod.eager_module(model)
    if not callable(model):
        return model
    return session.compiled(model, inductor=backend == "inductor")


def _inductor_options(kwargs: dict) -> dict | None:
    """inductor's config for torch.compile's `mode` and `options`, as torch.compile passes them."""
    mode, options = kwargs.get("mode"), kwargs.get("options")
    out = {}
    if mode not in (None, "default"):
        from torch._inductor import list_mode_options
        out.update(list_mode_options(mode, kwargs.get("dynamic")))
    out.update(options or {})
    return out or None


# ============================================================================ storages
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


def _storages(session: Any, patches: PatchSet) -> None:
    storages = session.storages
    orig_resize = torch.UntypedStorage.resize_

    def resize_(storage, size):   # outside any op: FSDP frees and refills storages so
        before = storages.key_of_storage(storage)
        out = orig_resize(storage, size)
        if storage.device.type == "meta":
            storages.resized(storage, int(size))
            if int(size) > 0 and _unsharding(sys._getframe(1)):
                session.gathered_params.update({before, storages.key_of_storage(storage)} - {None})
        return out
    patches.apply(RESIZE, torch.UntypedStorage, "resize_", resize_)
    orig_data_ptr = torch.UntypedStorage.data_ptr

    def data_ptr(storage):   # not a torch function: no mode sees it (transformers' id_tensor_storage asks)
        return storages.address(storage) if storage.device.type == "meta" else orig_data_ptr(storage)
    patches.apply(DATA_PTR, torch.UntypedStorage, "data_ptr", data_ptr)
    _storage_moves(session, patches)


KNOWN_STORAGE_BYTES = 1 << 18   # a loaded storage this small keeps its values: a float tensor at known.py's cap


def _storage_moves(session: Any, patches: PatchSet) -> None:
    """UntypedStorage.to(device="cuda") / .cuda() of a host storage (what torch.load does for each
    storage under map_location="cuda"): a fake CUDA storage of the same bytes, made by an empty
    tensor under the session's modes (so allocated and recorded as any tensor's). A small real
    one's bytes are its known value (known.py), as `.to("cuda")` of a small CPU tensor's are: an
    optimizer resumed from a checkpoint reads its `step` (Adam's bias correction divided by zero
    with the stand-in 0, read as the script's failure); a larger one's are unknown, as every fake
    tensor's. torch's own would make a real CUDA storage."""
    import torch.storage as storage_module

    orig_to = storage_module._to

    def to(storage, device, non_blocking=False):
        if device.type == "cuda" and storage.device.type in ("cpu", "meta"):
            fake = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device)
            if storage.device.type == "cpu" and 0 < storage.nbytes() <= KNOWN_STORAGE_BYTES:
                with _disable_current_modes(), torch._C.DisableTorchFunction():
                    real = torch.empty(0, dtype=torch.uint8).set_(storage)
                session.known.remember(fake, real)
            return fake.untyped_storage()
        return orig_to(storage, device, non_blocking)
    patches.apply(STORAGE_TO, storage_module, "_to", to)
    import torch.serialization as serialization

    orig_tag = serialization.location_tag

    def location_tag(storage):   # torch.save names each storage's device: a fake CUDA one's is CUDA's
        untyped = getattr(storage, "_untyped_storage", storage)
        if isinstance(untyped, torch.UntypedStorage) and session.storages.device_of_storage(untyped) == "cuda":
            from .devices import cuda_index

            return f"cuda:{cuda_index()}"
        return orig_tag(storage)
    patches.apply(LOCATION_TAG, serialization, "location_tag", location_tag)


# ============================================================================ backward
def _backward(session: Any, patches: PatchSet) -> None:
    orig_run = torch.autograd._engine_run_backward

    def run_backward(*args, **kwargs):
        # backward() is a torch function: the mode runs it with itself popped. Push a mode
        # again so that the hooks backward runs (FSDP's, DDP's, a script's) see CUDA devices
        # as in forward, and checkpoint recomputation gets CUDA's autocast and kernels.
        with DeviceMode(session.storages, session):
            out = orig_run(*args, **kwargs)
        session.remember_model_state()   # the gradients it made, while their models are alive
        return out
    patches.apply(RUN_BACKWARD, torch.autograd, "_engine_run_backward", run_backward)
    _saved_tensor_hooks(session, patches)


def _saved_tensor_hooks(session: Any, patches: PatchSet) -> None:
    """Saved-tensor pack hooks run inside the op that saves, while the mode handles that op (popped:
    fake tensors would show their real device, meta); their unpack hooks run in backward, where
    devices answer CUDA. Each pack hook runs with the mode pushed again, so pack and unpack see the
    devices the program's code sees: checkpoint compares the devices its pack hook recorded with
    the recomputed tensors' (torch/utils/checkpoint.py `_default_meta_extractor`), and recomputes
    the forward inside its unpack hook, where the program's code must see CUDA (FlexAttention
    checks its inputs' device); an offloading hook's `.to(device)` gets the device it recorded."""
    import torch._C._autograd as autograd_c
    push = autograd_c._push_saved_tensors_default_hooks

    def push_hooks(pack_hook, unpack_hook):
        @functools.wraps(pack_hook)
        def pack(tensor):
            with DeviceMode(session.storages, session):
                return pack_hook(tensor)
        return push(pack, unpack_hook)
    patches.apply(SAVED_TENSOR_HOOKS, autograd_c, "_push_saved_tensors_default_hooks", push_hooks)


# ============================================================================ foreach's grouping
def _grouping(session: Any, patches: PatchSet) -> None:
    """torch._C._group_tensors_by_device_and_dtype keys its groups by each tensor's real device, meta
    for every fake tensor; torch's Python then asks whether that device has foreach kernels
    (torch/utils/_foreach_utils.py) and clip_grad_norm_(foreach=True) refuses meta. The groups are
    keyed here by the device each fake tensor claims, as on a GPU."""
    original = torch._C._group_tensors_by_device_and_dtype

    def group(tensorlistlist, with_indices=False):
        out = original(tensorlistlist, with_indices)
        if not any(key[0].type == "meta" for key in out):
            return out
        regrouped: dict = {}
        for (device, dtype), (lists, indices) in out.items():
            for claimed, positions in _by_claimed_device(session, device, lists).items():
                into = regrouped.setdefault((claimed, dtype), ([[] for _ in lists], []))
                for j in positions:
                    for k, ts in enumerate(lists):
                        if ts:   # an empty list (amsgrad's max_exp_avg_sqs off) stays empty, as in torch
                            into[0][k].append(ts[j])
                    if indices:
                        into[1].append(indices[j])
        return regrouped
    patches.apply(GROUP_BY_DEVICE, torch._C, "_group_tensors_by_device_and_dtype", group)


def _by_claimed_device(session: Any, device: torch.device, lists) -> dict:
    """Positions of a group's tensors by the device each claims (its first list's tensor: a
    parameter, with its gradient and state beside it in the other lists)."""
    if device.type != "meta":
        return {device: range(len(lists[0]) if lists else 0)}
    out: dict = {}
    for j, t in enumerate(lists[0] if lists else []):
        out.setdefault(_claimed(session, t), []).append(j)
    return out


def _claimed(session: Any, t) -> torch.device:
    kind = session.storages.device_of(t) if isinstance(t, torch.Tensor) else None
    if kind == "cuda":
        from .devices import cuda_index

        return torch.device("cuda", cuda_index())
    return torch.device(kind) if kind in ("cpu", "meta") else torch.device("meta")


# ============================================================================ the legacy typed-tensor API
def _legacy_types(session: Any, patches: PatchSet) -> None:
    """torch.cuda's legacy types as stand-ins, set_default_tensor_type with a CUDA type, and the
    defaults a script sets put back at the end (see the note)."""
    for name in legacy_types.NAMES:
        patches.apply(LEGACY_TYPES[name], torch.cuda, name, legacy_types.stand_in(name))
    orig = torch.set_default_tensor_type

    def set_default_tensor_type(t, /):
        found = legacy_types.target(t)
        session._default_cuda = found is not None and found[0] == "cuda"
        return orig(legacy_types.name_of("cpu", found[1]) if session._default_cuda else t)
    patches.apply(DEFAULT_TENSOR_TYPE, torch, "set_default_tensor_type", set_default_tensor_type)
    dtype, device = torch.get_default_dtype(), _default_device_context()

    def restore() -> None:
        torch.set_default_dtype(dtype)
        if _default_device_context() is not device:
            torch.set_default_device(device.device if device is not None else None)
    patches.callback(restore)


# ============================================================================ the profiler
PROFILER_NOTE = ("torch.profiler: CUDA activity off (nothing runs on a GPU here); the profile has the CPU's "
                 "events only, also where only CUDA's were asked for")
CAPTURE_NOTE = ("torch.cuda.profiler.{name}(): an external profiler's capture range (cudaProfiler API); returned "
                "at once, nothing runs on a GPU here")


def _profiler(patches: PatchSet) -> None:
    """torch's profiler without CUDA activity (see the note)."""
    cls = torch.autograd.profiler.profile
    init = cls.__init__

    @functools.wraps(init)
    def without_cuda(self, *args, **kwargs):
        if kwargs.get("use_cuda") or kwargs.get("use_device") == "cuda":   # (use_cuda: torch before 2.14)
            kwargs.update(use_device=None, use_cpu=True)
            if "use_cuda" in kwargs:
                kwargs["use_cuda"] = False
            notes_mod.record(notes_mod.STAND_IN, PROFILER_NOTE, where=notes_mod.call_site(2))
        init(self, *args, **kwargs)
    patches.apply(PROFILER, cls, "__init__", without_cuda)
    import torch.cuda.profiler as capture

    def capture_range(name: str):
        def mark() -> None:
            notes_mod.record(notes_mod.STAND_IN, CAPTURE_NOTE.format(name=name), where=notes_mod.call_site(2))
        return mark
    patches.apply_all(CAPTURE_RANGE, capture, {name: capture_range(name) for name in ("start", "stop")})


def _default_device_context() -> Any:
    """The DeviceContext torch.set_default_device installed (torch/__init__.py), or None."""
    return getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)


# ============================================================================ torch.export
EXPORT_REASON = ("torch.export of {name}, whose parameters require grad, with grad enabled (as "
                 "torch.distributed.pipelining's pipeline() exports a stage): torch traces it on its own fake CUDA "
                 "tensors, for which autograd asks the CUDA driver, and with no GPU the process would abort; export "
                 "under torch.no_grad() or with requires_grad_(False) where the program allows, or split the stages by hand")


def _export(patches: PatchSet) -> None:
    import torch.export

    export = torch.export.export

    def refused_where_autograd_would_ask_the_driver(mod, *args, **kwargs):
        if torch.is_grad_enabled() and isinstance(mod, torch.nn.Module) and any(
                p.requires_grad for p in mod.parameters()):
            raise NotModelledError(EXPORT_REASON.format(name=type(mod).__name__))
        return export(mod, *args, **kwargs)
    patches.apply(EXPORT, torch.export, "export", functools.wraps(export)(refused_where_autograd_would_ask_the_driver))
