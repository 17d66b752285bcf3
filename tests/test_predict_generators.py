"""CUDA random generators under prediction (amem_alloc/predict/shims/generators.py): programs that
keep their own RNG streams read and set CUDA generators' states (Megatron's tensor-parallel RNG
tracker reads torch.cuda.default_generators, empty where no GPU was found: an IndexError reported
as the script's), or make a CUDA generator of their own (torch's asks the driver)."""
import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402

MiB = 1 << 20


def test_default_generators_keep_the_seed_and_offset_a_program_sets():
    seen = {}

    def program():
        generators = torch.cuda.default_generators
        seen["count"] = len(generators)
        g = generators[0]
        g.manual_seed(1234)
        state = g.get_state()
        seen["state"] = (state.dtype, tuple(state.shape), g.initial_seed(), str(g.device))
        g.set_offset(8)
        saved = g.graphsafe_get_state()
        g.manual_seed(5)
        g.graphsafe_set_state(saved)
        seen["restored"] = (g.initial_seed(), g.get_offset())
        torch.cuda.manual_seed(42)   # torch.cuda's functions and the generators agree
        seen["via torch.cuda"] = (torch.cuda.initial_seed(), g.initial_seed())
        theirs = torch.cuda.random.get_rng_state()   # Megatron reaches them by this path
        torch.cuda.random.set_rng_state(state)
        seen["set back"] = (g.initial_seed(), theirs.shape)
        return torch.empty(MiB, device="cuda")
    amem_alloc.predict(program, gpu="H100", device_count=2)
    assert seen["count"] == 2
    assert seen["state"] == (torch.uint8, (16,), 1234, "cuda:0")   # CUDAGeneratorImpl's seed and offset
    assert seen["restored"] == (1234, 8)
    assert seen["via torch.cuda"] == (42, 42)
    assert seen["set back"] == (1234, torch.Size([16]))


def test_a_cuda_generator_of_the_programs_own_draws_on_fake_tensors():
    seen = {}

    def program():
        g = torch.Generator(device="cuda")
        seen["kind"] = (isinstance(g, torch.Generator), str(g.device), isinstance(torch.Generator(), torch.Generator))
        g.manual_seed(7)
        x = torch.randn(MiB, device="cuda", generator=g)        # 4 MiB
        perm = torch.randperm(1024, device="cuda", generator=g)  # 8 KiB
        seen["cpu"] = torch.Generator().device.type
        return x, perm
    prediction = amem_alloc.predict(program, gpu="H100")
    assert seen["kind"] == (True, "cuda:0", True) and seen["cpu"] == "cpu"
    assert prediction.row("torch").peak_allocated >= 4 * MiB
    assert torch.Generator(device="cpu").device.type == "cpu"   # torch's own again after the prediction
    assert type(torch.Generator()) is torch._C.Generator


def test_a_tensor_made_from_cuda_scalars_reads_them_as_item_does():
    """`torch.tensor([[norm, ...]])` of CUDA scalars (Megatron's local multi_tensor_l2norm) copies
    each value: known ones are read, unknown ones stand in as `.item()` does (one note)."""
    seen = {}

    def program():
        norms = [torch.randn(1024, device="cuda").norm() for _ in range(3)]
        total = torch.norm(torch.tensor([norms]))
        known = torch.tensor([torch.ones((), device="cuda") * 3, torch.ones((), device="cuda") * 4])
        seen["values"] = (total.device.type, known.tolist())
        return total
    prediction = amem_alloc.predict(program, gpu="H100")
    assert seen["values"] == ("cpu", [3.0, 4.0])
    assert [n["what"] for n in prediction.notes if n["kind"] == "stand-in"] == ["item() of a CUDA tensor: 0.0"]


def test_seeding_a_cuda_generator_leaves_the_cpu_generators_stream_alone():
    def program():
        torch.cuda.default_generators[0].seed()
        torch.cuda.seed_all()
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    amem_alloc.predict(program, gpu="H100")
    assert torch.equal(torch.rand(4), expected)
