"""FakeCudaSession: run user code with fake CUDA tensors and record what CUDA's caching allocator
would be asked, in order: every storage's requested bytes, stream and free.

Design note
-----------
Inside the session every tensor is a meta tensor (engine/__init__.py): no compute, no memory on
any device, so a 7B-parameter model costs only its Python objects. torch's own dispatcher,
autograd engine and optimizers run unchanged, so lifetimes are torch's. Two modes do the work:
`DeviceMode` (device_mode.py, torch-function level: devices, autocast, attention backends, value
reads) and `Recorder` (recorder.py, dispatch level: allocations). What CUDA does beyond the meta
kernels comes from the rules (rules/).

Each allocation goes to the listeners at once (key, stream, AllocInfo). AllocInfo.category at that
moment is what the phase tells (an activation in forward, a gradient or autograd detail in
backward, optimizer state in a step); when the session exits, `infos` holds the final category
from the Tracer's classifier (provenance/classify.py), which knows which storages became
parameters, .grad and optimizer state.

While it runs the session keeps its state in one object (state.py: notes, autocast's cache, the
frees held for other streams, torch.cuda's current device and stream), owns the Meta kernels torch
lacks (rules/meta_kernels.py), and changes torch through one PatchSet (torch_patches.py says what
and why; stream_uses.py adds record_stream): on exit every change is undone, whatever happened.
"""
from __future__ import annotations

import functools
import warnings
import weakref
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ...categories import Category
from ...provenance import classify
from ...provenance.records import AllocRecord, next_seq
from ...provenance.scope import ModuleScope
from ...replay import Program, pack
from ...patching import PatchSet
from .. import notes as notes_mod
from .. import options as options_mod
from .. import rules as cuda_rules
from .. import state as state_mod
from ..rules import meta_kernels
from ..run import RunRecorder
from . import children
from . import lbfgs
from . import stream_uses
from . import torch_patches
from . import threads
from . import bitsandbytes_paged, deepspeed_host_ops, safetensors_files, saved_files, warning_sites
from . import triton_launches

# torch's warnings that code runs uncompiled, silenced inside a region the program compiled
# (torch/nn/attention/flex_attention.py: flex_attention outside torch.compile)
_NOT_COMPILED_WARNINGS = r"flex_attention called without torch\.compile"
from .device_mode import DeviceMode
from .graph_runner import GraphRunner
from .recorder import Recorder
from .values import DataDependentError
from .collector import CollectorWatch
from .storages import Storages, storage_tensors, user_frames
from .known import KnownValues
from .pinned import PinnedHost

__all__ = ["AllocInfo", "AllocationListener", "FakeCudaSession", "DataDependentError"]


@dataclass(frozen=True)
class AllocInfo:
    requested: int          # bytes the storage asked for (before the allocator's rounding)
    category: str           # the Tracer's categories (provenance/classify.py), or "workspace"
    module: str | None      # qualified module name active at allocation, if known
    op: str | None          # aten op, or "cublas_workspace"
    frames: tuple           # user frames (filename, line, name), innermost first; may be empty
    phase: str = ""         # forward, backward, optimizer or other, when it was allocated
    grad: bool = True       # grad mode was on (False: under no_grad / inference_mode, e.g. an eval loop)


class AllocationListener(Protocol):
    def on_alloc(self, key: int, stream: int, info: AllocInfo) -> None: ...
    def on_free(self, key: int) -> None: ...
    def on_marker(self, name: str) -> None: ...


GATHERED_PARAMETER = "parameter (gathered)"   # FSDP's unsharded parameters (_unsharding)
KV_CACHE = Category.KV_CACHE.value
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


class FakeCudaSession:
    """Context manager: from __enter__ on, tensors are fake and CUDA storages are recorded."""

    def __init__(self, device_count: int = 1, device_name: str = "NVIDIA H100 80GB HBM3",
                 capability: tuple[int, int] = (9, 0), total_memory: int = 80 * 2**30, frames: bool = True,
                 strict: bool = False, shapes: str = options_mod.default("shapes")):
        self.strict = options_mod.check("strict", strict)   # a value read stops the prediction (values.py)
        self.shapes = options_mod.check("shapes", shapes)   # the shape rule (rules/data_dependent.py)
        self.device_count, self.device_name = device_count, device_name
        self.capability, self.total_memory = tuple(capability), total_memory
        self.record_frames = frames
        self.recording = RunRecorder()   # the one listener that writes the run down (run.py)
        self.listeners: list = [self.recording]
        self.records: dict[int, AllocRecord] = {}
        self.know = classify.Knowledge()
        self.storages = Storages(self._on_alloc, self._on_free)
        self.known = KnownValues()   # the real values of small fake tensors made from known data
        self.pinned = PinnedHost()   # host memory the program pinned (pinned.py)
        self.saved_files = saved_files.SavedFiles()   # checkpoints the program saved (saved_files.py)
        self.modules = ModuleScope.every_module()  # the module running now (provenance/scope.py)
        self.modules.new_root.append(self._remember_state_of)
        self._remembered: dict = {}   # weak reference to a model -> its state as storage keys (remember_model_state)
        self._workspaces: dict[tuple, int] = {}   # (thread, stream) -> key
        self.gathered_params: set[int] = set()   # keys of FSDP's unsharded parameters (_unsharding)
        self.kv_cache: set[int] = set()          # keys of a KV cache's keys and values (decode_loop.py)
        self.state = state_mod.SessionState(self)   # what modules find as the running session (state.py)
        self.meta_kernels = meta_kernels.MetaKernels()   # Meta kernels torch lacks, while the session runs
        self.patches = PatchSet()
        self._modes: list = []
        self._in_backward = False
        self._compiled_depth = 0   # > 0 inside a function given to torch.compile
        self.inductor_depth = 0    # > 0 inside one compiled by inductor (torch.compile's default backend)
        self.compile_regions: list[dict] = []   # per torch.compile region traced: where, and how predicted
        self.graph_runner = GraphRunner(self)   # runs a compiled region's graphs (graph_runner.py)
        self._phase_override: str | None = None
        self._default_cuda = False
        self.notes = notes_mod.Notes()   # stand-ins, estimates, what was not modelled (notes.py)
        self.collector = CollectorWatch(self.notes, self.recording)   # what Python's collector frees (collector.py)
        self.add_listener(self.collector)
        self.libraries: dict[str, int] = {}   # what the run initialised: cuda, cublas, cudnn, backward, nccl (context.py)
        self.cudnn_searched: set = set()   # convolution configurations cudnn.benchmark searched (rules/convolution.py)

    # ------------------------------------------------------------------ interface
    def add_listener(self, listener: AllocationListener) -> None:
        self.listeners.append(listener)

    def marker(self, name: str) -> None:
        for lst in self.listeners:
            lst.on_marker(name)

    def pool_event(self, event: str, pool: int) -> None:
        """A CUDA graph capture's private pool opened ("begin"), closed ("end") or released
        ("release"): the listeners hear of it (shims/graphs.py; the run gets a pool op)."""
        for lst in self.listeners:
            on_pool = getattr(lst, "on_pool", None)
            if on_pool is not None:
                on_pool(event, pool)

    def release(self) -> None:
        """torch.cuda.empty_cache(): the listeners hear of it (the run gets a release op there)."""
        for lst in self.listeners:
            on_release = getattr(lst, "on_release", None)
            if on_release is not None:
                on_release()

    # what the run holds so far (run.py's RunRecorder writes it)
    @property
    def ops(self) -> list[tuple[int, int, int, int]]:
        return self.recording.ops

    @property
    def markers(self) -> list[tuple[int, str]]:
        return self.recording.markers

    @property
    def infos(self) -> dict[int, AllocInfo]:
        return self.recording.infos

    @property
    def program(self) -> Program:
        return Program(pack(self.ops), 0, 0)

    def __enter__(self) -> "FakeCudaSession":
        self.state.notes = self.notes
        self._token = state_mod.enter(self.state)
        self.patches = PatchSet()
        try:
            self.meta_kernels.__enter__()
            self.patches.callback(self.meta_kernels.__exit__)
            torch_patches.apply(self, self.patches)
            self.stream_uses = stream_uses.install(self)   # record_stream: frees held for other streams
            self.collector.install(self.patches)   # gc's callback and gc.collect, for the session
            triton_launches.install(self, self.patches)   # the program's own Triton kernels run nothing
            saved_files.install(self.patches, self.saved_files, self.known)   # checkpoints never over a file that was there
            safetensors_files.install(self.patches, self.saved_files)   # a fake tensor's bytes there: zeros
            threads.install(self.patches, lambda: self._modes)   # the program's threads see fake CUDA too
            warning_sites.install(self.patches)   # warnings at the program's line, not amem's
            bitsandbytes_paged.install(self.patches)   # paged optimizer state: through the caching allocator
            deepspeed_host_ops.install(self.patches)   # ZeRO-Offload's CPU optimizers skip host copies of fakes
        except BaseException:
            self._leave()
            raise
        self.modules.install()
        self._hooks = [register_optimizer_step_pre_hook(self._opt_pre),
                       register_optimizer_step_post_hook(self._opt_post)]
        self._modes = [DeviceMode(self.storages, self), Recorder(self.storages, self)]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for m in reversed(self._modes):
            m.closed = True   # a program's thread still running with them passes its calls through
            m.__exit__(None, None, None)
        self._modes = []
        stream_uses.finish(self.stream_uses)
        for h in self._hooks:
            h.remove()
        self.modules.remove()
        self._leave()
        self._learn_gone_models()
        self._learn_model_state()
        self.recording.infos = self.final_infos()   # the engine's final word on each storage

    def _leave(self) -> None:
        """Undoes every patch (and the meta kernels), then leaves the session's state."""
        try:
            self.patches.close()
        finally:
            state_mod.leave(self.state, self._token)

    @property
    def autocast_keys(self) -> set:
        """The storages autocast's casts made (engine/autocast.py)."""
        return self.state.autocast_keys

    # ------------------------------------------------------------------ recording
    def uses(self, library: str, count: int = 1) -> None:
        """The run initialised `library` (cublas, cudnn, nccl: `count` communicators) or did
        `backward`: what it holds outside the caching allocator follows (predict/context.py)."""
        self.libraries[library] = max(self.libraries.get(library, 0), count)

    def shape_rule(self) -> str | None:
        """The rule data-dependent sizes take (options.py's `shapes`); None under strict, where
        nothing is assumed and the first size from values stops the prediction."""
        return None if self.strict else self.shapes

    def default_cuda(self) -> bool:
        return self._default_cuda

    def stream(self) -> int:
        """The current stream's id as torch.cuda under prediction tells it (0 without its shims)."""
        stream = self.state.thread.stream
        return int(stream.stream_id) if stream is not None else 0

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
        if "cuda" not in self.libraries or (phase == "backward" and "backward" not in self.libraries):
            self.uses("cuda")
            if phase == "backward":
                self.uses("backward")
        if phase == "backward" and not self._in_backward:
            self.know.backward_starts.append(next_seq())
        self._in_backward = phase == "backward"
        module = self.modules.module
        rec = AllocRecord(op, module, phase, "cuda:0", key, nbytes,
                          str(t.dtype).replace("torch.", "") if t is not None else "uint8",
                          tuple(t.shape) if t is not None else (nbytes,))
        self.records[key] = rec
        category = "workspace" if t is None else _PHASE_GUESS[phase]
        info = AllocInfo(nbytes, category, module, op, user_frames() if self.record_frames else (), phase,
                         torch.is_grad_enabled())
        stream = self.stream()
        for lst in self.listeners:
            lst.on_alloc(key, stream, info)

    def _on_free(self, key: int) -> None:
        rec = self.records.get(key)
        if rec is not None:
            rec.freed_seq = next_seq()
        for lst in self.listeners:
            lst.on_free(key)

    def _cublas_workspace(self) -> None:
        """torch keeps one workspace per (cuBLAS handle, stream), and handles are per thread:
        backward runs on the autograd engine's device thread, so it gets a workspace of its own."""
        where = ("autograd" if torch._C._current_graph_task_id() != -1 else "main", self.stream())
        if where not in self._workspaces:
            self.uses("cublas")
            self._workspaces[where] = self.storages.alloc_extra(
                cuda_rules.cublas_workspace_bytes(self.capability), "cublas_workspace")

    # ------------------------------------------------------------------ what storages are
    def _mark(self, t, table: dict, label: str) -> None:
        for inner in storage_tensors(t):
            self._mark_key(self.storages.key_of(inner), table, label)

    def _mark_key(self, key, table: dict, label: str) -> None:
        if key is not None and key in self.records:
            table[key] = label
            rec = self.records[key]
            if table is self.know.model_state:
                rec.add_role("parameter")   # stays one once freed (Lightning's teardown moves the model back to the CPU)
            elif table is self.know.grads:
                rec.add_role("gradient")
            elif table is self.know.optimizer_state:
                rec.add_role("optimizer_state")

    def _state_of(self, root) -> list[tuple]:
        """(tensor, table, label) for a model's parameters, buffers and their gradients now
        (DeepSpeed ZeRO-3's partition of a parameter, `ds_tensor`, a view of its flat buffer; a
        gradient not made yet left out). A tensor subclass is marked by the tensors it holds
        (storage_tensors: a DTensor's local shard, torchao's int data and scales)."""
        out = []
        for name, p in list(root.named_parameters()) + list(root.named_buffers()):
            out.append((p, self.know.model_state, ("parameter", name)))
            if isinstance(p, torch.nn.Parameter):
                out.append((p.grad, self.know.grads, name))
                out.append((getattr(p, "ds_tensor", None), self.know.model_state, ("parameter", name)))
        return [(t, table, label) for t, table, label in out if isinstance(t, torch.Tensor)]

    def _learn_model_state(self) -> None:
        """The running models' parameters, buffers and gradients, as they are now (at each optimizer
        step and at the end)."""
        for root in self.modules.roots:
            self.learn_model(root)

    def made_parameter(self, param) -> None:
        """A Parameter made over a CUDA storage (a model deep-copied for its EMA, which may never run a
        forward, and so is no model the module scope sees): that storage holds a parameter."""
        self._mark(param, self.know.model_state, ("parameter", "made as a Parameter"))

    def learn_model(self, model) -> None:
        """A model's parameters, buffers and gradients as they are now, by name: a running model's,
        and one just moved or cast (Module._apply), whose forward may never run (its weights read
        as `F.linear(x, m.weight)`)."""
        for t, table, label in self._state_of(model):
            self._mark(t, table, label)

    def _remember_state_of(self, root) -> None:
        """A model's state as it first runs (see remember_model_state)."""
        self._remembered[weakref.ref(root)] = self._keys_of_state(root)

    def remember_model_state(self) -> None:
        """After each backward: each running model's state as storage keys, learnt at the end for a
        model gone by then (`del pipeline`; a model the script's namespace or a returned function
        held: the module scope holds models weakly), as for the models alive then."""
        for ref in self._remembered:
            root = ref()
            if root is not None:
                self._remembered[ref] = self._keys_of_state(root)

    def _keys_of_state(self, root) -> list[tuple]:
        return [(self.storages.key_of(inner), table, label) for t, table, label in self._state_of(root)
                for inner in storage_tensors(t)]

    def _learn_gone_models(self) -> None:
        for ref, keys in self._remembered.items():
            if ref() is None:
                for key, table, label in keys:
                    self._mark_key(key, table, label)

    def compiled(self, fn, inductor: bool = True):
        """`fn` run as eager, marked as a compiled region while it runs (`inductor`: by inductor,
        whose kernels rules may model, not by the eager backend that torch's own wrappers use).
        Warnings torch gives because the code is not compiled are for a run this is not. Called
        inside another compiled region that dynamo traces, `fn` itself is traced into it (torch
        inlines a torch.compile'd function called from a compiled one)."""
        @functools.wraps(fn)
        def run(*args, **kwargs):
            self._compiled_depth += 1
            self.inductor_depth += inductor
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=_NOT_COMPILED_WARNINGS)
                    return fn(*args, **kwargs)
            finally:
                self._compiled_depth -= 1
                self.inductor_depth -= inductor
        run._torchdynamo_inline = fn   # inside a region dynamo traces, `fn` is traced, as torch.compile's wrapper is
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
        lbfgs.note_step(optimizer)
        for state in optimizer.state.values():
            for name, v in state.items():
                self._mark(v, self.know.optimizer_state, name)

    def final_infos(self) -> dict[int, AllocInfo]:
        """AllocInfo per key with the Tracer's category as known now."""
        out = {}
        for key, info in self.infos.items():
            rec = self.records.get(key)
            if key in self.gathered_params or key in self.kv_cache:
                out[key] = replace(info, category=GATHERED_PARAMETER if key in self.gathered_params else KV_CACHE)
                continue
            if info.category == "workspace" or rec is None:
                out[key] = info
                continue
            cat = classify.category(key, rec, self.know) or info.category
            out[key] = replace(info, category=cat)
        return out
