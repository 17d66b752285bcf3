"""The fake device objects torch.cuda hands out under prediction: the card's properties, streams
with a stable identity (nothing runs on them), events, and which device and stream are current in
each thread (kept in the session's state, state.py)."""
from __future__ import annotations

import itertools
import threading
from typing import Any

from .. import notes, state
from ..engine import stream_uses
from ..failures import stand_in
from ..gpus import Gpu


# ============================================================================ fake device objects
@stand_in
class FakeDeviceProperties:
    """What torch.cuda.get_device_properties returns, for the chosen card."""

    def __init__(self, gpu: Gpu) -> None:
        self.name = gpu.name
        self.major, self.minor = gpu.capability
        self.total_memory = gpu.total_memory
        self.multi_processor_count = gpu.multi_processor_count
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.L2_cache_size = 50 << 20
        self.warp_size = 32
        self.gcnArchName = "NVIDIA CUDA"
        self.uuid = "00000000-0000-0000-0000-amem-predict"

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory >> 20}MB, multi_processor_count={self.multi_processor_count}) "
                "[predicted: no GPU]")


def _device_index(device: Any) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        _, _, idx = device.partition(":")
        return int(idx) if idx else current_device()
    index = getattr(device, "index", None)
    return current_device() if index is None else int(index)


def current_device() -> int:
    """torch.cuda.current_device() under prediction: this thread's (0 outside a prediction)."""
    st = state.current()
    return st.thread.device_index if st is not None else 0


def set_current_device(index: int) -> None:
    st = state.current()
    if st is not None:
        st.thread.device_index = index


def _current_stream_object() -> "FakeStream | None":
    st = state.current()
    return st.thread.stream if st is not None else None


def _set_current_stream_object(stream: "FakeStream | None") -> None:
    st = state.current()
    if st is not None:
        st.thread.stream = stream


_stream_ids = itertools.count(1)   # stream ids, like CUDA's stream handles, are the process's
_stream_lock = threading.Lock()


@stand_in
class FakeStream:
    """torch.cuda.Stream stand-in: a stable id, nothing runs. Equal streams share the id. `with s:`
    makes it current for the block, as torch.Stream's context manager does (torch >= 2.7;
    transformers' offloaded cache prefetches so)."""

    def __init__(self, device: Any = None, priority: int = 0, *, stream_id: int | None = None, **_: Any) -> None:
        if stream_id is None:
            with _stream_lock:
                stream_id = next(_stream_ids)
        self.stream_id = stream_id
        self.cuda_stream = stream_id      # torch's raw handle; the default stream is 0
        self.device_index = _device_index(device)
        self.priority = priority
        self._entered: list = []   # the stream current before each `with self:` still open

    def __enter__(self) -> "FakeStream":
        self._entered.append(_current_stream_object())
        set_stream(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _set_current_stream_object(self._entered.pop())

    @property
    def device(self) -> Any:
        import torch

        return torch.device("cuda", self.device_index)

    def wait_stream(self, stream: Any) -> None:
        stream_uses.synchronised(getattr(stream, "stream_id", None))

    def wait_event(self, event: Any) -> None:
        event.wait(self)

    def synchronize(self) -> None:
        stream_uses.synchronised(self.stream_id)

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False

    def record_event(self, event: Any = None) -> "FakeEvent":
        event = event or FakeEvent()
        event.record(self)
        return event

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, FakeStream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("amem-fake-stream", self.stream_id))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.cuda_stream:#x} [predicted]>"


DEFAULT_STREAM = FakeStream(stream_id=0)


@stand_in
class FakeEvent:
    """torch.cuda.Event stand-in: recording and waiting do nothing; no time passes."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self.stream: FakeStream | None = None
        self.position: int | None = None   # the point of the program it marks (stream_uses.position)

    def record(self, stream: Any = None) -> None:
        self.stream = stream or current_stream()
        self.position = stream_uses.position()

    def wait(self, stream: Any = None) -> None:
        if self.stream is not None:   # waiting for an event: its stream's work up to it is done
            stream_uses.synchronised(self.stream.stream_id, self.position)

    def synchronize(self) -> None:
        if self.stream is not None:   # the CPU waits for the device to reach it (see stream_uses.py)
            stream_uses.synchronised(None, self.position)

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Any) -> float:
        notes.record(notes.STAND_IN, ELAPSED_NOTE)
        return ELAPSED_MS


ELAPSED_MS = 1.0   # not zero: a script dividing by it (a rate, a throughput) goes on
ELAPSED_NOTE = (f"Event.elapsed_time: {ELAPSED_MS} ms (no kernel runs, so there is no time to measure; "
                "any rate computed from it is made up)")


def current_stream(device: Any = None) -> FakeStream:
    return _current_stream_object() or DEFAULT_STREAM


def current_stream_id() -> int:
    """The id of the stream a `with torch.cuda.stream(s)` block made current (0: the default)."""
    return current_stream().stream_id


def default_stream(device: Any = None) -> FakeStream:
    return DEFAULT_STREAM


def set_stream(stream: Any) -> None:
    _set_current_stream_object(stream if isinstance(stream, FakeStream) else None)


class _Generic(type):
    """torch.Stream / torch.Event (the accelerator-generic kinds) under prediction: one made for a
    CUDA device, or for the accelerator's by default (CUDA, as the shims say), is the fake one;
    for another device, torch's own. isinstance and issubclass accept both."""

    def __call__(cls, device: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not _names_cuda(device):
            return cls.real(device, *args, **kwargs)
        if cls.fake is FakeEvent:
            return FakeEvent(*args, **kwargs)
        return FakeStream(device, *args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, (cls.fake, cls.real))

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, (cls.fake, cls.real))


def generic(name: str, real: type, fake: type) -> type:
    """The stand-in for torch.Stream or torch.Event (`real`): CUDA's made as `fake`."""
    return _Generic(name, (), {"real": real, "fake": fake, "__module__": "torch"})


def _names_cuda(device: Any) -> bool:
    if device is None or isinstance(device, int):
        return True
    import torch

    try:
        return torch.device(device).type == "cuda"
    except (TypeError, RuntimeError):
        return False


@stand_in
class FakeStreamContext:
    """`with torch.cuda.stream(s):` makes s current for the block; None leaves the stream as it is."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.previous = stream, None

    def __enter__(self) -> Any:
        self.previous = _current_stream_object()
        if self.stream is not None:
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        _set_current_stream_object(self.previous)




