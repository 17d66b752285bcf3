"""Known values (amem_alloc/predict/engine/known.py): small fake CUDA tensors made from known data keep
their real values, so reads of them give what a GPU gives, with no stand-in; values computed from
unknowable data (random numbers, what an op with an unknown input writes) still get stand-ins."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from amem_alloc.predict.engine.known import MAX_ELEMENTS, MAX_INDEX_ELEMENTS
from amem_alloc.predict.engine.session import FakeCudaSession


def _stand_ins(session) -> list:
    return [n for n in session.notes if n.kind == "stand-in"]


def test_values_made_from_known_data_are_read_as_a_gpu_reads_them():
    with FakeCudaSession() as s:
        pos = torch.arange(6, device="cuda")[None]
        assert pos.device == torch.device("cuda", 0)
        assert (torch.diff(pos, dim=-1) != 1).cumsum(-1)[:, -1].item() == 0
        moved = torch.tensor([3, 1, 2]).cuda()
        assert moved.tolist() == [3, 1, 2] and int(moved.max()) == 3
        assert torch.tensor([[1, 0], [1, 1]], device="cuda").all().item() is False
        assert f"{torch.full((), 2.5, device='cuda') * 2:.2f}" == "5.00"
        assert torch.ones(4, device="cuda").cpu().numpy().tolist() == [1.0] * 4
        buf = torch.empty(3, device="cuda")
        buf.copy_(torch.tensor([7.0, 8.0, 9.0]))   # copy_ writes every element: known from here
        assert buf.sum().item() == 24.0
    assert not _stand_ins(s), list(s.notes)


def test_shapes_from_known_values_are_the_true_shapes():
    with FakeCudaSession() as s:
        x = torch.tensor([0, 2, 0, 5], device="cuda")
        assert x.nonzero().shape == (2, 1)
        assert x[x > 0].tolist() == [2, 5]
        assert torch.unique(x).shape == (3,)
        assert torch.bincount(x).shape == (6,)   # no upper bound, but its inputs are known
    assert not list(s.notes), list(s.notes)


def test_unknown_values_still_get_stand_ins():
    with FakeCudaSession() as s:
        noise = torch.randn(3, device="cuda")                  # random
        assert noise.sum().item() == 0.0
        found_inf = torch.full((1,), 0.0, device="cuda")      # known, then written from an unknown
        assert found_inf.item() == 0.0
        found_inf.add_(noise.sum())
        found_inf.fill_(1.0).add_(noise[:1])
        assert found_inf.item() == 0.0
        big = torch.arange(MAX_ELEMENTS + 1, dtype=torch.float32, device="cuda")   # over the cap: not shadowed
        assert big[-1].item() == 0.0
        garbage = torch.empty(4, device="cuda")               # uninitialised memory
        assert garbage.tolist() == [0.0] * 4
    lines = sorted(n.what for n in _stand_ins(s))
    assert len(lines) == 4, lines   # noise, found_inf once written, big, garbage


def test_integer_tensors_are_shadowed_up_to_a_larger_cap():
    """Indices and masks decide sizes and branches: they are shadowed up to MAX_INDEX_ELEMENTS
    (floating tensors up to MAX_ELEMENTS)."""
    with FakeCudaSession() as s:
        ids = torch.arange(MAX_ELEMENTS * 2, device="cuda")
        assert ids[-1].item() == MAX_ELEMENTS * 2 - 1
        assert (ids % 2 == 0).nonzero().shape == (MAX_ELEMENTS, 1)
        huge = torch.arange(MAX_INDEX_ELEMENTS + 1, device="cuda")
        assert huge[-1].item() == 0   # over the index cap: a stand-in
    assert len(_stand_ins(s)) == 1


def test_strict_does_not_stop_at_a_known_value():
    """--strict stops where a stand-in would be used; a known value needs none."""
    with FakeCudaSession(strict=True) as s:
        assert torch.arange(4, device="cuda").sum().item() == 6
    assert not list(s.notes)
