"""`amem fit` and amem_alloc.fit(...): the largest integer value of a script's argument (or of a
function's parameter) with which the run fits the card, per allocator policy, by bisection over
predictions.

    amem fit --gpu H100 --arg batch_size -- python train.py --batch_size=12
    amem_alloc.fit(["train.py", "--compile=False"], "batch_size", gpu="H100")
    amem_alloc.fit(lambda batch: step(batch), "batch", gpu="A100-40GB")

Design note
-----------
A trial predicts the run at one value (trial.predict: the script again in this process with the
argument set, `--NAME V` / `--NAME=V` replaced where it is given, `--NAME=V` added where it is not,
which argparse and nanoGPT's configurator both read). Every trial answers for every policy at
once, so the policies share trials: a cache by value.

A value fits when what it needs (the min capacity, the one "needs" figure of amem predict) leaves
`margin` of the usable memory free: `amem fit` keeps 5% by default (DEFAULT_MARGIN; `--margin 0`
finds the very edge), since the context is an estimate and a run's memory varies a little.

The search assumes that more of the argument never needs less memory. From `lo` it doubles until
no policy fits (or `hi`); then, per policy, bisects between the largest value seen to fit and the
smallest seen not to, until they are neighbours. So the answer is consistent by construction: the
largest value fits, the next one was predicted and does not. A run that does not fit at `lo`, that
fails at `lo`, or whose peak does not grow from `lo` to 2·lo, ends with FitError (one line). A
trial that fails above `lo` (the script refuses a value) counts as "does not fit" and is named.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..introspection import format_bytes

MAX_DOUBLINGS = 24     # lo * 2**24: past this the run "fits as far as was tried"


class FitError(ValueError):
    """The search cannot answer: one line saying why. `amems`: because amem itself failed inside the
    run at the smallest value (failures.py; `amem fit` exits 4 then, as amem predict does)."""

    def __init__(self, message: str, amems: bool = False) -> None:
        super().__init__(message)
        self.amems = amems


# ============================================================================ the argument
def with_value(argv: list[str], name: str, value: int) -> list[str]:
    """argv with the script's --NAME set to value (argv[0] is the script)."""
    flag = "--" + name
    out, i, found = list(argv), 1, False
    while i < len(out):
        if out[i] == flag and i + 1 < len(out):
            out[i + 1], found = str(value), True
            i += 1
        elif out[i].startswith(flag + "="):
            out[i], found = f"{flag}={value}", True
        i += 1
    return out if found else out + [f"{flag}={value}"]


# ============================================================================ trials
@dataclass
class Trial:
    value: int
    prediction: Any = None            # outcome.Prediction, or None when it failed
    failed: str | None = None
    seconds: float = 0.0
    margin: int = 0                   # bytes of usable memory the answer must leave free
    status: int = 0                   # the failed trial's exit status (4: amem's own failure)

    def fits(self, policy: str) -> bool:
        """Whether it fits with `margin` to spare: what it needs (the min capacity) <= usable - margin."""
        if self.prediction is None:
            return False
        row = self.prediction.row(policy)
        return row.fits and row.min_capacity + self.margin <= self.prediction.gpu.usable

    def row(self, policy: str) -> Any:
        return self.prediction.row(policy) if self.prediction is not None else None


@dataclass
class PolicyFit:
    policy: str
    largest: int | None
    peak_reserved: int | None
    headroom: int | None
    first_failing: int | None           # None: every value tried fits (up to hi)
    needed_at_first_failing: int | None  # min capacity there; None if that trial failed or none failed
    why_first_failing: str | None = None  # a failed trial's line
    needed: int | None = None           # min capacity at the largest value: what it needs of the card
    spare: int | None = None            # usable less `needed` (>= the margin)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class FitResult:
    arg: str
    gpu: Any
    policies: list[PolicyFit]
    trials: list[Trial] = field(default_factory=list)
    seconds: float = 0.0
    margin: int = 0                   # bytes of usable memory every answer leaves free
    margin_text: str = "none"         # how it was given ("5% of usable memory")

    def to_dict(self) -> dict:
        g = self.gpu
        return {"arg": self.arg, "margin_bytes": self.margin, "margin": self.margin_text,
                "gpu": {"name": g.name, "key": g.key, "capacity_bytes": g.total_memory, "usable_bytes": g.usable,
                        "context_bytes": g.context, "context_source": g.context_source},
                "policies": [p.to_dict() for p in self.policies],
                "trials": [{"value": t.value, "seconds": round(t.seconds, 3), "failed": t.failed,
                            "fits": {r.policy: r.fits for r in t.prediction.rows} if t.prediction else None}
                           for t in self.trials],
                "seconds": round(self.seconds, 3)}

    def write_json(self, path: Any) -> Any:
        import json

        from ..atomic_write import write_text

        return write_text(path, json.dumps(self.to_dict(), indent=1))


class _Trials:
    """Trials by value, each run once; a progress line per trial."""

    def __init__(self, predict_at: Callable[[int], Any], policies: list[str],
                 progress: Callable[[str], None] | None, quiet: bool, margin: int = 0) -> None:
        self.predict_at, self.policies, self.progress, self.quiet = predict_at, policies, progress, quiet
        self.margin = margin
        self.done: dict[int, Trial] = {}

    def __call__(self, value: int) -> Trial:
        if value not in self.done:
            self.done[value] = t = self._run(value)
            if self.progress:
                self.progress(self._line(len(self.done), t))
        return self.done[value]

    def _run(self, value: int) -> Trial:
        from .whatif import trial

        started = time.perf_counter()
        quiet = contextlib.redirect_stdout(io.StringIO()) if self.quiet else contextlib.nullcontext()
        try:
            with quiet:
                prediction = self.predict_at(value)
        except trial.TrialFailed as failed:
            return Trial(value, None, str(failed), time.perf_counter() - started, self.margin, failed.status)
        if prediction is not None and getattr(prediction, "run", None) is not None:   # keep its answer, not its
            prediction.run = dataclasses.replace(prediction.run, ops=[], infos={}, markers=[])   # program
        return Trial(value, prediction, None, time.perf_counter() - started, self.margin)

    def _line(self, n: int, t: Trial) -> str:
        if t.prediction is None:
            return f"  trial {n}: {t.value}: could not be predicted ({t.failed}) [{t.seconds:.1f} s]"
        rows = ", ".join(f"{r.policy} {format_bytes(r.min_capacity)} {'fits' if t.fits(r.policy) else 'does not fit'}"
                         for r in t.prediction.rows if r.policy in self.policies)
        return f"  trial {n}: {t.value}: needs {rows} [{t.seconds:.1f} s]"


# ============================================================================ the search
def search(predict_at: Callable[[int], Any], arg: str, gpu: Any, policies: list[str], lo: int = 1,
           hi: int | None = None, progress: Callable[[str], None] | None = None, quiet: bool = True,
           margin: int = 0, margin_text: str = "none") -> FitResult:
    """The largest value in [lo, hi] that fits with `margin` bytes to spare, per policy (FitError:
    one line when there is none to find)."""
    if lo < 1 or (hi is not None and hi < lo):
        raise FitError(f"--lo must be >= 1 and --hi >= --lo (got {lo}, {hi})")
    started = time.perf_counter()
    trials = _Trials(predict_at, policies, progress, quiet, margin)
    first = trials(lo)
    _check_first(arg, first, policies, margin)
    top = _grow(trials, arg, lo, hi, policies)
    fits = [_bisect(trials, p, lo, top) for p in policies]
    # the card as the first prediction judged it: its total less what that run holds outside the allocator
    return FitResult(arg, first.prediction.gpu, fits, list(trials.done.values()), time.perf_counter() - started,
                     margin, margin_text)


ARGPARSE_USAGE = 2   # the exit status argparse gives a command line it refuses


def _check_first(arg: str, first: Trial, policies: list[str], margin: int = 0) -> None:
    if first.prediction is None:
        usage = (f" (status 2 is argparse's for an option it does not take: is --{arg} the script's own? its "
                 "--help lists them)") if first.status == ARGPARSE_USAGE else ""
        raise FitError(f"the run fails at the smallest value, --{arg} {first.value}: {first.failed}{usage}",
                       amems=first.status == 4)
    if not any(first.fits(p) for p in policies):
        need = min(first.row(p).min_capacity for p in policies)
        kept = f", less the margin of {format_bytes(margin)} (--margin)" if margin else ""
        raise FitError(f"the run does not fit even at the smallest value, --{arg} {first.value}: it needs "
                       f"{format_bytes(need)} (usable {format_bytes(first.prediction.gpu.usable)}{kept})")


def _peak(t: Trial) -> int:
    return max(r.peak_allocated for r in t.prediction.rows)


def _grow(trials: _Trials, arg: str, lo: int, hi: int | None, policies: list[str]) -> int:
    """The smallest value tried at which no policy fits (hi, or lo doubled until then); hi or the
    last doubling when every value fits."""
    value = lo
    for doubling in range(MAX_DOUBLINGS):
        nxt = min(value * 2, hi) if hi is not None else value * 2
        if nxt == value:
            return value
        t = trials(nxt)
        if doubling == 0 and t.prediction is not None and _peak(t) <= _peak(trials(lo)):
            raise FitError(f"the run's memory does not grow with --{arg} (peak allocated "
                           f"{format_bytes(_peak(t))} at {lo} and at {nxt}): there is no largest value to find")
        value = nxt
        if not any(t.fits(p) for p in policies):
            return value
    return value


def _bisect(trials: _Trials, policy: str, lo: int, top: int) -> PolicyFit:
    tried = sorted(trials.done.items())
    good = max((v for v, t in tried if t.fits(policy)), default=None)
    if good is None:
        return PolicyFit(policy, None, None, None, lo, trials(lo).row(policy).min_capacity)
    bad = min((v for v, t in tried if v > good and not t.fits(policy)), default=None)
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if trials(mid).fits(policy):
            good = mid
        else:
            bad = mid
    g = trials(good).row(policy)
    spare = g.capacity - g.min_capacity
    if bad is None:
        return PolicyFit(policy, good, g.peak_reserved, g.headroom, None, None, needed=g.min_capacity, spare=spare)
    b = trials(bad)
    return PolicyFit(policy, good, g.peak_reserved, g.headroom, bad,
                     b.row(policy).min_capacity if b.prediction else None, b.failed, needed=g.min_capacity,
                     spare=spare)


# ============================================================================ the margin
DEFAULT_MARGIN = "5%"   # amem fit's: of the card's usable memory (3.9 GiB on an H100-80GB), above the
                        # context's uncertainty (predict/gpus.py) on every card in its table


def margin_bytes(text: str | int | float, usable: int) -> tuple[int, str]:
    """(bytes, in words) of a margin: "5%" of usable memory, or a number of GiB ("1.5"); ValueError."""
    spec = str(text).strip()
    try:
        if spec.endswith("%"):
            share = float(spec[:-1])
            if not 0 <= share < 100:
                raise ValueError
            return int(usable * share / 100), f"{share:g}% of usable memory, {format_bytes(int(usable * share / 100))}"
        gib = float(spec.removesuffix("GiB").removesuffix("GB"))
        if not 0 <= gib < 1 << 20:
            raise ValueError
        return int(gib * (1 << 30)), format_bytes(int(gib * (1 << 30)))
    except ValueError:
        raise FitError(f"--margin {text!r}: give a share of usable memory (5%) or GiB (1.5), at least 0") from None


# ============================================================================ the ways in
def fit(target: Any, arg: str, *, gpu: Any = None, capacity_gb: float | None = None, policies: Any = None,
        lo: int = 1, hi: int | None = None, steps: int | None = None, timeout: float | None = None,
        progress: Callable[[str], None] | None = None, quiet: bool = True, margin: str | float = 0,
        debug: bool = False, context_mb: float | None = None, calibration_file: Any = None) -> FitResult:
    """The largest value of `arg` that fits the card, per policy. target: a script's argv
    (["train.py", "--x", "1"]: the script runs with --arg set) or a callable taking the value
    (called as target(value) under prediction). steps/timeout: per trial, as amem predict's.
    margin: usable memory to leave free, "5%" or GiB (`amem fit` defaults to DEFAULT_MARGIN; 0 here).
    debug: amem's own failure in a trial prints its traceback (trial.predict)."""
    from . import api
    from . import script as script_mod
    from .whatif import trial

    card = api.resolve_gpu(gpu, capacity_gb, context_mb, calibration_file)
    chosen = api.resolve_policies(policies)
    kept, kept_text = margin_bytes(margin, card.usable) if margin else (0, "none")
    steps = script_mod.DEFAULT_STEPS if steps is None else steps
    timeout = script_mod.DEFAULT_TIMEOUT if timeout is None else timeout

    def predict_at(value: int) -> Any:
        if callable(target):
            body, name = (lambda run: target(value)), f"{getattr(target, '__qualname__', 'code')}({arg}={value})"
        else:
            argv = with_value(list(target), arg, value)
            body, name = trial.script_body(argv, steps, timeout), f"script {' '.join(argv)}"
        return trial.predict(body, api.predicting, card, chosen, name, debug=debug)

    return search(predict_at, arg, card, [p.name for p in chosen], lo, hi, progress, quiet, kept, kept_text)


# ============================================================================ two arguments
@dataclass
class Frontier:
    """The largest `arg` that fits at each value of a second argument `across`, per policy: the frontier
    of what fits over the two (e.g. batch size x context length). A column whose search has no answer
    (the run does not fit, or fails, even at `lo`) holds the one line saying why."""
    arg: str
    across: str
    values: list[int]
    fits: list[FitResult | None]
    why: list[str | None]
    seconds: float = 0.0

    def largest(self, policy: str) -> list[int | None]:
        """The largest `arg` that fits at each value of `across` (None: not even `lo`)."""
        return [next((p.largest for p in f.policies if p.policy == policy), None) if f else None for f in self.fits]

    def to_dict(self) -> dict:
        return {"arg": self.arg, "across": self.across, "seconds": round(self.seconds, 3),
                "frontier": [{"value": v, "fit": f.to_dict() if f else None, "why": w}
                             for v, f, w in zip(self.values, self.fits, self.why)]}

    def write_json(self, path: Any) -> Any:
        import json

        from ..atomic_write import write_text

        return write_text(path, json.dumps(self.to_dict(), indent=1))


def frontier(target: Any, arg: str, across: str, values: list[int], **options: Any) -> Frontier:
    """fit() of `arg` at each value of `across`: a script's argv gets --ACROSS set as fit sets --ARG; a
    callable is called as target(value, across_value). Options: fit()'s."""
    if not values or any(v < 1 for v in values) or across == arg:
        raise FitError(f"--across {across}: give a second argument, other than --arg, with values >= 1")
    started, fits, why = time.perf_counter(), [], []
    for x in values:
        at = (lambda v, x=x: target(v, x)) if callable(target) else with_value(list(target), across, x)
        if options.get("progress"):
            options["progress"](f" --{across} {x}:")
        try:
            fits.append(fit(at, arg, **options))
            why.append(None)
        except FitError as err:
            fits.append(None)
            why.append(str(err))
    return Frontier(arg, across, list(values), fits, why, time.perf_counter() - started)
