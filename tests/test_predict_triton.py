"""A Triton kernel the program launches itself runs nothing under prediction (engine/triton_launches.py):
the program goes on where Triton would stop for want of a driver, the memory is what the caller's
torch allocations are, a tensor the kernel was given no longer reads as a known value, and each
launch is noted at the program's line."""
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import amem_alloc  # noqa: E402
from amem_alloc.predict.engine import triton_launches  # noqa: E402

MiB = 1 << 20


@triton.jit
def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"])
@triton.jit
def _double(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def _program(read: list):
    x = torch.randn(MiB, device="cuda")                       # 4 MiB
    out = torch.empty_like(x)                                 # 4 MiB: the caller's, as on the GPU
    _add[(triton.cdiv(x.numel(), 1024),)](x, x, out, x.numel(), BLOCK=1024)
    _double[lambda meta: (triton.cdiv(out.numel(), meta["BLOCK"]),)](out, out.numel())
    counts = torch.zeros(4, device="cuda")                    # a known value (zeros) ...
    read.append(counts.sum().item())
    _add[(1,)](counts, counts, counts, 4, BLOCK=1024)         # ... written by a kernel: no longer known
    read.append(counts.sum().item())
    return out


def test_launches_run_nothing_the_callers_tensors_are_the_memory_and_each_is_noted():
    read = []
    prediction = amem_alloc.predict(_program, read, gpu="H100")
    assert prediction.row("torch").peak_allocated == 8 * MiB + 2 * 512   # x, out; counts and its sum (512 B each)
    launches = [n for n in prediction.notes if n["what"].startswith("Triton kernel")]
    assert {n["what"] for n in launches} == {triton_launches.NOTE.format(name="_add"),
                                             triton_launches.NOTE.format(name="_double")}
    assert all(n["kind"] == "stand-in" for n in launches)
    first = _program.__code__.co_firstlineno
    assert {_line(n) for n in launches} == {first + 3, first + 4, first + 7}
    reads = [n for n in prediction.notes if n["what"].startswith("item()")]
    assert read == [0.0, 0.0] and len(reads) == 1, prediction.notes   # the known zeros read without a note
    assert _line(reads[0]) == first + 8


def _line(note) -> int:
    """The program's line a note names ("file.py:12 (via library/file.py:34)")."""
    return int(note["where"].split(" (via ")[0].rsplit(":", 1)[1])


def test_launching_is_given_back_to_triton_after_the_prediction():
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    before = (JITFunction.run, Autotuner.run)
    amem_alloc.predict(_program, [], gpu="H100")
    assert (JITFunction.run, Autotuner.run) == before
