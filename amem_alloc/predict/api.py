"""amem_alloc.predict(fn, ...) and `with amem_alloc.predicting(...) as p:` — predict the GPU memory
of code that builds its model and runs its step itself, on a machine with no GPU.

    import amem_alloc
    p = amem_alloc.predict(train_step, gpu="H100-80GB")       # calls train_step() once
    print(amem_alloc.format_prediction(p)); p.row("torch").fits; p.write_trace("predicted.pickle")

    with amem_alloc.predicting(gpu="A100-40GB", policies="torch,amem-roundup4") as run:
        model = build(); step(model)
    print(amem_alloc.format_prediction(run.result))

Design note
-----------
`predicting` stacks three things, entered in this order and left in the reverse order whatever
happens inside: the engine's FakeCudaSession (CUDA tensors become fake: no compute, no device
memory), a LiveAllocator listening to it (the recorded allocations, fed to the sim core as they
happen), and CudaShims (torch.cuda answers from the chosen card and the LiveAllocator). On a
clean exit the program is analysed under every requested policy (outcome.analyse) into
`run.result`; on an exception nothing is analysed and the exception goes on unchanged.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from .. import policies as policies_mod
from ..user_script import for_the_script
from . import gpus as gpus_mod
from . import options as options_mod
from . import repeat, state
from .decode_loop import DecodeLoops
from .engine.children import ChildWatch
from .engine.saved_files import whole_prediction
from .shims.cuda import CudaShims, LiveAllocator
from .notes import NotModelledError
from .engine.values import DataDependentError
from .analysis.prediction import Prediction, analyse
from .run import RecordedRun, RunRecorder


def is_predicting() -> bool:
    """True while code runs under prediction: guard what needs real values with it, e.g.
    `if not amem_alloc.predict.is_predicting(): print(loss.item())`."""
    return state.current() is not None


def engine() -> tuple[type, type]:
    """(FakeCudaSession, DataDependentError) of the fake-execution engine."""
    try:
        from .engine.session import DataDependentError, FakeCudaSession
    except ImportError as err:  # pragma: no cover - a build without the engine
        raise RuntimeError(f"amem predict: the fake-execution engine is not available ({err})") from None
    return FakeCudaSession, DataDependentError


def resolve_gpu(gpu: str | gpus_mod.Gpu | None = None, capacity_gb: float | None = None,
                context_mb: float | None = None, calibration_file: Any = None) -> gpus_mod.Gpu:
    """The card: by name (or a Gpu), or a device of `capacity_gb` GiB; with what the process holds
    outside the caching allocator given (`context_mb`), or taken from a calibration file for that
    card (`calibration_file`, else $AMEM_CALIBRATION, else amem doctor --calibrate's default place)."""
    if gpu is not None and capacity_gb is not None:
        raise ValueError("give a GPU name or a capacity, not both")
    if capacity_gb is not None:
        card = gpus_mod.custom(capacity_gb)
    elif isinstance(gpu, gpus_mod.Gpu):
        card = gpu
    else:
        card = gpus_mod.get(gpu or gpus_mod.DEFAULT)
    card = gpus_mod.with_context(card, context_mb)
    return card if card.calibration is not None else gpus_mod.with_calibration(card, calibration_file)


def resolve_policies(policies: Any = None) -> list[policies_mod.Policy]:
    if policies is None:
        return [policies_mod.get(n) for n in policies_mod.DEFAULT_COMPARE]
    if isinstance(policies, str):
        return policies_mod.parse_list(policies)
    return [policies_mod.get(p) if isinstance(p, str) else p for p in policies]


class predicting:  # noqa: N801 - used like a function in `with`
    """Context manager: the body runs under prediction; `.recorded` (the RecordedRun) and `.result`
    (a Prediction) after a clean exit. analyse=False skips the per-policy analysis
    (`.recording.ops` is the program so far, `.recorded` the whole run)."""

    def __init__(self, gpu: str | gpus_mod.Gpu | None = None, *, capacity_gb: float | None = None,
                 context_mb: float | None = None, calibration_file: Any = None, policies: Any = None,
                 live_policy: str = "torch", device_count: int = 1,
                 target: str = "code", session_factory: Callable[..., Any] | None = None,
                 shims: bool = True, analyse: bool = True, strict: bool = False,
                 shapes: str = options_mod.default("shapes"), write_decode: bool = True) -> None:
        self.gpu = resolve_gpu(gpu, capacity_gb, context_mb, calibration_file)
        self.policies = resolve_policies(policies)
        self.live_policy = policies_mod.get(live_policy) if isinstance(live_policy, str) else live_policy
        if isinstance(device_count, bool) or not isinstance(device_count, int) or device_count < 1:
            raise ValueError(f"device_count must be an integer >= 1, got {device_count!r}")
        self.device_count, self.target = device_count, target
        self._factory = session_factory
        self._use_shims, self._analyse = shims, analyse
        self.strict, self.shapes = options_mod.check("strict", strict), options_mod.check("shapes", shapes)
        self.children = ChildWatch()
        self.child_reports: list[dict] = []   # children that used CUDA (children.py)
        self.live = LiveAllocator(self.live_policy.conf)
        self.session: Any = None
        self.recording: RunRecorder | None = None   # the one listener that writes the run (run.py)
        self.shims: CudaShims | None = None
        self.recorded: RecordedRun | None = None
        self.written_out = 0   # steps repeating the last one run, written out instead (repeat.py)
        self.decode: DecodeLoops | None = None   # decode loops' steps written out (decode_loop.py)
        self._write_decode = write_decode
        self.result: Prediction | None = None
        self._started = 0.0

    def marker(self, name: str) -> None:
        """A named point in the program (e.g. "step"); shown in the JSON, kept in the trace's order."""
        self.session.marker(name)

    def __enter__(self) -> "predicting":
        factory = self._factory or engine()[0]
        options = {"strict": True} if self.strict else {}
        if self.shapes != options_mod.default("shapes"):
            options["shapes"] = self.shapes
        self.session = factory(device_count=self.device_count, device_name=self.gpu.name,
                               capability=self.gpu.capability, total_memory=self.gpu.total_memory, **options)
        self.recording = getattr(self.session, "recording", None)
        if self.recording is None:   # an engine that keeps no recording of its own (a test double)
            self.recording = RunRecorder()
            self.session.add_listener(self.recording)
        self.session.add_listener(self.live)
        self.session.__enter__()
        try:
            if hasattr(self.session, "patches") and hasattr(self.session, "ops"):
                self.decode = DecodeLoops(self.session, self._write_decode)
                self.decode.install()
            if self._use_shims:
                self.shims = CudaShims(self.gpu, self.live, self.session, self.recording, self.device_count)
                self.shims.__enter__()
        except BaseException:
            self.session.__exit__(None, None, None)
            raise
        self.children.__enter__()
        self._started = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        seconds = time.perf_counter() - self._started
        try:
            self.children.__exit__(exc_type, exc, tb)
            self.child_reports = self.children.reports()
            self.children.cleanup()
            if self.shims is not None:
                self.shims.__exit__(exc_type, exc, tb)
            if self.decode is not None:
                self.decode.remove()
        finally:
            self.session.__exit__(exc_type, exc, tb)
        if exc_type is None and self.child_reports:
            first = self.child_reports[0]
            raise NotModelledError(f"{first['what']} (pid {first['pid']}): prediction models one process",
                                   first["where"])
        if exc_type is None:
            notes = self.session.notes.as_list() if hasattr(self.session, "notes") else []
            self.recorded = self.recording.finish(self.target, notes, self.live_policy.conf,
                                                  getattr(self.session, "autocast_keys", ()), seconds,
                                                  getattr(self.session, "libraries", None),
                                                  getattr(self.session, "compile_regions", None))
            if self.decode is not None:
                self.recorded = self.decode.extend(self.recorded)   # decode steps not run (decode_loop.py)
            self.recorded = repeat.extend(self.recorded, self.written_out)   # steps not run (script.py)
            if self._analyse:
                self.result = analyse(self.recorded, self.gpu, self.policies)
        return False


def predict(fn: Callable[..., Any], *args: Any, gpu: str | gpus_mod.Gpu | None = None,
            capacity_gb: float | None = None, context_mb: float | None = None, calibration_file: Any = None,
            policies: Any = None, live_policy: str = "torch",
            device_count: int = 1, session_factory: Callable[..., Any] | None = None, strict: bool = False,
            shapes: str = options_mod.default("shapes"), what_if: Any = None, blocks: str | None = None,
            **kwargs: Any) -> Prediction:
    """Runs fn(*args, **kwargs) once under prediction; returns the Prediction (peaks per policy,
    min capacity, fits, what holds memory at the peak; .write_json/.write_trace; its text and page:
    amem_alloc.format_prediction and amem_alloc.write_prediction_report).
    what_if: changes (whatif.NAMES, a list or 'a,b' or 'all'): fn runs again once per change, with the
    change applied by amem (blocks: the stack to checkpoint); the answers are in `.what_if`.
    strict, shapes: options.py's table (shapes: 'expected' or 'upper', for sizes only values decide).
    context_mb: what the process holds outside the caching allocator (CUDA context and libraries), in
    MiB, as measured; calibration_file: amem doctor --calibrate's file to take it from instead."""
    if not callable(fn):
        raise for_the_script(TypeError(f"amem_alloc.predict takes a callable (the code to predict), got "
                                       f"{type(fn).__name__}"))
    name = getattr(fn, "__qualname__", None) or repr(fn)
    card = resolve_gpu(gpu, capacity_gb, context_mb, calibration_file)
    with whole_prediction():   # files saved from fake tensors go after the what-if trials too
        with predicting(card, policies=policies, live_policy=live_policy,
                        device_count=device_count, target=name, session_factory=session_factory, strict=strict,
                        shapes=shapes) as run:
            fn(*args, **kwargs)
        assert run.result is not None
        if what_if:
            from .whatif import answers as whatif, run as whatif_run

            whatif_run.run_all(whatif.parse(what_if), lambda _run: fn(*args, **kwargs), run.result, predicting,
                               blocks=blocks, strict=strict, policies=run.policies, shapes=shapes)
    return run.result
