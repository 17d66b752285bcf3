"""Which device amem's torch-style functions read: "cuda" with no index is the current device
(torch.cuda.memory_allocated("cuda") after set_device(1) reads device 1), and a
torch.cuda.device object names its index. Checked without a GPU by standing in for torch's
current-device query."""
import pytest

torch = pytest.importorskip("torch")
from amem_alloc.devices import device_index as _device_index  # noqa: E402


@pytest.fixture
def current_device_1(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


def test_cuda_without_an_index_is_the_current_device(current_device_1):
    assert _device_index("cuda") == 1
    assert _device_index(torch.device("cuda")) == 1
    assert _device_index(None) == 1
    assert _device_index("cuda:0") == 0


def test_a_torch_cuda_device_object_names_its_index():
    assert _device_index(torch.cuda.device(1)) == 1


def test_a_cpu_device_is_refused():
    with pytest.raises(ValueError, match="not a CUDA device"):
        _device_index("cpu")
