"""`tensor.data = other` between the host and the GPU under prediction (engine/data_setter.py).

Failed at 9534256: a fake CUDA tensor is a meta one, and torch refuses `.data =` between meta and
CPU tensors ("incompatible tensor type"), so FSDP2 without its own loading (accelerate's
`fsdp_cpu_ram_efficient_loading: false`: `buffer.data = buffer.to(device)`) and offloading code
(`p.data = p.data.cpu()`) stopped. On a GPU the object keeps its identity and takes the new data."""
import os
import weakref

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict.notes import NotModelledError  # noqa: E402

MiB = 1 << 20


def test_a_buffer_moved_by_data_keeps_its_identity_and_is_allocated_on_the_gpu():
    seen = {}

    def body():
        m = torch.nn.Linear(8, 8)
        m.register_buffer("table", torch.zeros(MiB))
        m.register_buffer("steps", torch.arange(16.))
        table = m.table
        table.tag = "mine"
        table.data = table.to("cuda")
        m.steps.data = m.steps.to("cuda")
        w = m.weight
        w.data = w.data.to("cuda")
        seen.update(same=m.table is table and m.weight is w, devices=(table.device.type, w.device.type),
                    kind=(type(w).__name__, w.requires_grad), tag=table.tag, value=m.steps[5].item())

    p = amem_alloc.predict(body, gpu="H100")
    assert seen == {"same": True, "devices": ("cuda", "cuda"), "kind": ("Parameter", True), "tag": "mine",
                    "value": 5.0}
    assert 4 * MiB in [i.requested for i in p.infos.values()]


def test_parameters_offloaded_by_data_and_brought_back_train_on_the_gpu():
    seen = {}

    def body():
        m = torch.nn.Linear(1024, 1024, bias=False).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for p in m.parameters():
            p.data = p.data.cpu()
        seen["offloaded"] = (m.weight.device.type, m.weight is opt.param_groups[0]["params"][0])
        for p in m.parameters():
            p.data = p.data.cuda()
        m(torch.randn(4, 1024, device="cuda")).sum().backward()
        opt.step()
        seen["grad"] = m.weight.grad.device.type

    p = amem_alloc.predict(body, gpu="H100")
    assert seen == {"offloaded": ("cpu", True), "grad": "cuda"}
    weights = [i for i in p.infos.values() if i.requested == 4 * MiB]
    assert len(weights) >= 3, weights   # the weight twice (to the GPU, back) and its gradient


def test_a_tensor_torch_cannot_rebind_is_amems_stated_limit_at_the_users_line():
    def body():
        t = torch.zeros(16)
        ref = weakref.ref(t)   # noqa: F841 (held: swap_tensors refuses a tensor with weak references)
        t.data = t.to("cuda")

    with pytest.raises(NotModelledError, match=r"`.data =` moving a tensor between the host and the GPU") as raised:
        amem_alloc.predict(body, gpu="H100")
    assert os.path.basename(raised.value.where).startswith("test_predict_data_setter.py:"), raised.value.where


def test_a_host_gradient_is_set_on_a_host_copy_of_a_fake_tensor_and_back():
    """Failed at 5d2e06d, read as the script's failure: DeepSpeed's ZeRO-1/2 with its optimizer
    offloaded to the CPU gives the host copy of its flat partition (a meta tensor answering "cpu")
    a real host gradient; torch refused ("device type 'cpu' to a tensor with device type 'meta'").
    Devices the program sees as different are still refused, naming those devices."""
    seen = {}

    def body():
        partition = torch.randn(10, device="cuda").cpu()
        partition.grad = torch.zeros(10)
        host = torch.randn(10)
        host.grad = torch.full((10,), 2.0, device="cuda").cpu()   # a known value: the real one
        seen.update(devices=(partition.grad.device.type, host.grad.device.type), value=host.grad.sum().item())
        weight = torch.randn(10, device="cuda").cpu()
        try:
            weight.grad = torch.zeros(10, device="cuda")
        except RuntimeError as e:
            seen["refused"] = str(e).split(". ")[0]

    amem_alloc.predict(body, gpu="H100")
    assert seen == {"devices": ("cpu", "cpu"), "value": 20.0,
                    "refused": "attempting to assign a gradient with device type 'cuda' to a tensor with device type 'cpu'"}
