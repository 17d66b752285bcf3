"""An op the program defines with torch.library.custom_op runs its registered fake kernel under
prediction, which makes only the op's outputs: the output says the temporaries its implementation
makes on the GPU are not counted (modded-nanogpt's FP8 matmul: its records' real H100 peaks are
9-16% above the prediction, benchmarks/RESULTS.md)."""
import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict.engine.recorder import CUSTOM_OP_FAKE  # noqa: E402

MiB = 1 << 20


@torch.library.custom_op("amem_test::scaled_copy", mutates_args=())
def _scaled_copy(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).float().half()   # temporaries on the GPU: x * 2, its float copy


@_scaled_copy.register_fake
def _(x):
    return torch.empty_like(x, dtype=torch.half)


def test_a_custom_op_is_its_fake_kernels_outputs_and_is_said():
    def program():
        x = torch.empty(MiB, dtype=torch.half, device="cuda")   # 2 MiB
        return _scaled_copy(x)                                    # 2 MiB out
    prediction = amem_alloc.predict(program, gpu="H100")
    assert prediction.row("torch").peak_allocated == 4 * MiB
    assert [n["kind"] for n in prediction.notes if n["what"] == CUSTOM_OP_FAKE.format(op="amem_test::scaled_copy")] \
        == ["not-modelled"], prediction.notes


def test_torchs_own_primitives_are_not_taken_for_a_programs_custom_op():
    """torch 2.14 defines its prims with custom_op (a compiled graph that falls back op by op runs
    them): they are torch's primitives, their outputs all they make, and nothing is said of them."""
    from amem_alloc.predict.engine.recorder import _is_custom_op

    assert _is_custom_op(torch.ops.amem_test.scaled_copy.default)
    assert not _is_custom_op(torch.ops.prims.convert_element_type.default)
    assert not _is_custom_op(torch.ops.aten.add.Tensor)
