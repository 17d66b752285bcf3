"""The legacy typed-tensor API under prediction (issue 36 item 4; predict/engine/legacy_types.py):
`Tensor.type()` with CUDA types, `torch.cuda.FloatTensor(...)` and friends, `isinstance` against
them, `torch.set_default_tensor_type` and `torch.set_default_device("cuda")`, each allocating what
CUDA would (first principles: the bytes of the tensor made on the device) and leaving torch's
defaults as they were; torchsummary's `summary` runs unchanged (where it is installed), and the
calls it makes run everywhere."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc import replay  # noqa: E402


def _allocs(fn) -> list[tuple[int, str]]:
    """(requested bytes, op) of every CUDA allocation `fn` makes under prediction, and fn's answer."""
    with amem_alloc.predicting(gpu="H200", policies="torch") as run:
        out = fn()
    p = run.result
    return [(size, p.infos[key].op) for kind, key, size, _ in p.ops if kind == replay.ALLOC], out


def test_tensor_type_with_a_cuda_type_copies_to_the_device():
    for target in (torch.cuda.FloatTensor, "torch.cuda.FloatTensor"):
        allocs, out = _allocs(lambda: torch.randn(256, 256).type(target))
        assert allocs == [(256 * 256 * 4, "_to_copy.default")]
    allocs, out = _allocs(lambda: torch.randn(256, 256).type("torch.cuda.HalfTensor"))
    assert allocs == [(256 * 256 * 2, "_to_copy.default")] and out.dtype == torch.float16


def test_tensor_type_answers_as_a_cuda_tensor_and_keeps_a_tensor_of_its_type():
    def body():
        x = torch.zeros(1024, device="cuda")
        same = x.type(torch.cuda.FloatTensor)
        return x.type(), same is x, x.type(torch.FloatTensor).is_cuda, x.type(torch.float16).dtype
    allocs, (name, same, on_cuda, half) = _allocs(body)
    assert name == "torch.cuda.FloatTensor" and same and not on_cuda and half == torch.float16
    assert [n for n, _ in allocs] == [4096, 2048]   # x, and its half copy; the CPU copy is not the GPU's


def test_the_legacy_constructors_make_cuda_tensors():
    def body():
        sized = torch.cuda.FloatTensor(64, 32)
        data = torch.cuda.LongTensor([1, 2, 3])
        empty = torch.cuda.HalfTensor()
        from_size = torch.cuda.DoubleTensor(torch.Size([8]))
        return sized, data, empty, from_size
    allocs, (sized, data, empty, from_size) = _allocs(body)
    assert [n for n, _ in allocs if n] == [64 * 32 * 4, 3 * 8, 8 * 8]
    assert (sized.shape, sized.dtype, data.dtype, empty.numel(), from_size.dtype) == \
        ((64, 32), torch.float32, torch.int64, 0, torch.float64)


def test_isinstance_against_the_legacy_types():
    def body():
        x = torch.zeros(4, device="cuda")
        return (isinstance(x, torch.cuda.FloatTensor), isinstance(x, torch.cuda.HalfTensor),
                isinstance(torch.zeros(4), torch.cuda.FloatTensor), torch.cuda.FloatTensor.dtype,
                torch.cuda.LongTensor.is_cuda)
    _, answers = _allocs(body)
    assert answers == (True, False, False, torch.float32, True)
    assert type(torch.cuda.FloatTensor).__name__ == "tensortype"   # put back after the session


@pytest.mark.parametrize("legacy", [torch.cuda.FloatTensor, "torch.cuda.FloatTensor"], ids=["type", "name"])
def test_set_default_tensor_type_to_cuda_and_back(legacy):
    def body():
        torch.set_default_tensor_type(legacy)
        x = torch.zeros(1024)
        torch.set_default_tensor_type(torch.FloatTensor)
        return x.is_cuda, torch.zeros(8).is_cuda
    allocs, (was_cuda, after) = _allocs(body)
    assert was_cuda and not after and [n for n, _ in allocs] == [4096]


def test_set_default_device_cuda_is_followed_and_undone_at_the_end():
    def body():
        torch.set_default_tensor_type(torch.cuda.DoubleTensor)   # and left so, with the device below
        torch.set_default_device("cuda")
        return torch.zeros(256).is_cuda, torch.get_default_device().type
    allocs, (on_cuda, default) = _allocs(body)
    assert on_cuda and default == "cuda" and [n for n, _ in allocs] == [256 * 8]
    assert torch.get_default_device() == torch.device("cpu") and torch.get_default_dtype() == torch.float32
    assert not torch.zeros(1).is_cuda


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 16 * 16, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _summary_like(model, input_size):
    """What torchsummary's summary does with the legacy API (torchsummary/torchsummary.py 1.5.1)."""
    dtype = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor
    x = [torch.rand(2, *input_size).type(dtype)]
    params = torch.prod(torch.LongTensor(list(model.fc.weight.size())))
    model(*x)
    return x[0].is_cuda, tuple(x[0].shape), int(params)


def test_torchsummarys_calls_run_unchanged():
    allocs, (on_cuda, shape, params) = _allocs(lambda: _summary_like(Net().cuda(), (3, 16, 16)))
    assert on_cuda and shape == (2, 3, 16, 16) and params == 10 * 8 * 16 * 16
    assert (2 * 3 * 16 * 16 * 4, "_to_copy.default") in allocs   # the input, made on the CPU and typed to CUDA


def test_torchsummary_runs_unchanged(capsys):
    torchsummary = pytest.importorskip("torchsummary")
    _allocs(lambda: torchsummary.summary(Net().cuda(), (3, 16, 16)))
    out = capsys.readouterr().out
    assert "Conv2d-1" in out and "Linear-2" in out and f"Total params: {8 * 3 * 9 + 8 + 10 * 8 * 256 + 10:,}" in out
