"""torch.nn.DataParallel under prediction (engine/data_parallel.py): on the one device predicted its
scatter makes views of the batch (a CPU batch is copied to the device once), the module runs
unreplicated, and the memory is the bare module's; scattering over several devices in one process
stops with one line naming amem's limit."""
import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict.engine import data_parallel  # noqa: E402
from amem_alloc.predict.notes import NotModelledError  # noqa: E402

MiB = 1 << 20


def _step(wrap: bool, batch_on_cpu: bool = False):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 10)).cuda()
    run = torch.nn.DataParallel(model) if wrap else model
    x = torch.randn(256, 1024, device="cpu" if batch_on_cpu else "cuda")
    if batch_on_cpu and not wrap:
        x = x.cuda()
    run(x).square().mean().backward()


def test_data_parallel_on_one_device_takes_the_bare_modules_memory():
    bare = amem_alloc.predict(_step, False, gpu="H100").row("torch")
    wrapped = amem_alloc.predict(_step, True, gpu="H100").row("torch")
    assert wrapped.peak_allocated == bare.peak_allocated > 0
    assert wrapped.peak_reserved == bare.peak_reserved


def test_a_cpu_batch_is_copied_to_the_device_once_as_scatter_copies_it():
    bare = amem_alloc.predict(_step, False, True, gpu="H100").row("torch")
    wrapped = amem_alloc.predict(_step, True, True, gpu="H100").row("torch")
    assert wrapped.peak_allocated == bare.peak_allocated


def test_gather_allocates_the_joined_result_once_on_its_destination():
    def join():
        parts = [torch.empty(3, 1 * MiB // 4, device="cuda"), torch.empty(5, 1 * MiB // 4, device="cuda")]
        out = torch.nn.parallel.comm.gather(parts, dim=0, destination=0)
        assert out.shape == (8, MiB // 4) and out.device.type == "cuda"
    prediction = amem_alloc.predict(join, gpu="H100")
    assert prediction.row("torch").peak_allocated == 16 * MiB   # 8 MiB of parts, 8 MiB joined


def test_several_devices_in_one_process_stop_with_amems_line():
    with pytest.raises(NotModelledError, match="DataParallel over 2 devices in one process"):
        amem_alloc.predict(_step, True, gpu="H100", device_count=2)
    assert torch._C._scatter is not data_parallel.scatter and torch._C._gather is not data_parallel.gather
