"""amem_alloc/predict/engine/fake_backward.py: the engine's walk in Python (used while AOTAutograd
traces a compiled region's joint graph without a GPU) gives torch's own gradients, on the CPU,
for graphs mixing torch's C++ nodes and Python autograd.Functions (a HOP's autograd op, as
FlexAttention's, is one), including an output whose gradient never arrives (materialized as zeros,
as the engine's PyNode does)."""
import pytest

torch = pytest.importorskip("torch")

from amem_alloc.predict.engine import fake_backward  # noqa: E402


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        return grad * 3


class _TwoOutputs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, x * 5

    @staticmethod
    def backward(ctx, first, second):   # `second` arrives as zeros when that output is unused
        assert second is not None
        return first * 2 + second * 5


def _graph(x, w):
    a, _unused = _TwoOutputs.apply(x @ w)
    b, c = _TwoOutputs.apply(torch.tanh(x))
    return (_Scale.apply(a) + b * c).sum()


def test_the_walk_gives_torchs_gradients_through_python_functions():
    torch.manual_seed(0)
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    want = torch.autograd.grad(_graph(x, w), (x, w))
    got = fake_backward.grad(_graph(x, w), (x, w))
    assert all(torch.allclose(g, h) for g, h in zip(got, want)), (got, want)
