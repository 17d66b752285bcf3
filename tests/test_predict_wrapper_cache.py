"""Inductor's wrappers kept between predictions (amem_alloc/predict/engine/wrapper_cache.py): a
compiled graph predicted again reads its wrapper back instead of lowering it, and the prediction is
the same, allocation for allocation; another card, another graph or a damaged entry is lowered
again."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._inductor.compile_fx")

from amem_alloc.predict.engine import wrapper_cache  # noqa: E402
from amem_alloc.predict.engine.session import FakeCudaSession  # noqa: E402

H100 = dict(capability=(9, 0), device_name="NVIDIA H100 80GB HBM3")
A100 = dict(capability=(8, 0), device_name="NVIDIA A100-SXM4-80GB")


def step(card: dict, rows: int = 512):
    """A compiled MLP's training step (forward and backward graphs) on `card`."""
    s = FakeCudaSession(**card)
    with s:
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
        run = torch.compile(model)
        run(torch.randn(rows, 256, device="cuda")).square().mean().backward()
    return s


def allocations(s) -> list:
    """The recorded run as sizes in order (each op's kind and size, and what made it)."""
    return [(kind, size, s.infos[key].op) for kind, key, size, _ in s.ops]


def kept(s) -> list:
    return [g["wrappers_kept"] for r in s.compile_regions for g in r["graphs"]]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "wrappers"
    monkeypatch.setenv("AMEM_COMPILE_CACHE", str(folder))
    return folder


def test_a_graph_predicted_again_reads_its_wrappers_back_and_predicts_the_same(cache):
    first = step(H100)
    assert first.compile_regions[0]["status"].startswith("predicted as compiled (inductor)")
    assert kept(first) == [0] and len(list(cache.glob("*.json"))) == 2   # forward and backward kept
    again = step(H100)
    assert kept(again) == [2]
    assert again.compile_regions[0]["status"] == first.compile_regions[0]["status"]
    assert allocations(again) == allocations(first) and len(allocations(first)) > 10


def test_another_card_or_another_shape_is_lowered_again(cache):
    step(H100)
    assert kept(step(A100)) == [0]            # the card is in the key
    assert kept(step(H100, rows=384)) == [0]  # so are the inputs' sizes
    assert len(list(cache.glob("*.json"))) == 6


def test_a_damaged_entry_is_lowered_again_and_rewritten(cache):
    first = step(H100)
    for entry in cache.glob("*.json"):
        entry.write_text(entry.read_text()[:100])   # as a full disk or a killed writer would leave it
    again = step(H100)
    assert kept(again) == [0] and allocations(again) == allocations(first)
    assert all(json.loads(e.read_text())["format"] == wrapper_cache.FORMAT for e in cache.glob("*.json"))
    assert kept(step(H100)) == [2]


def test_off_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("AMEM_COMPILE_CACHE", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kept(step(H100)) == [0] and kept(step(H100)) == [0]
    assert not list(tmp_path.rglob("*.json"))


def test_entries_are_written_whole_and_the_oldest_dropped(cache, monkeypatch):
    monkeypatch.setattr(wrapper_cache, "MAX_ENTRIES", 3)
    for n in range(5):
        wrapper_cache.store(f"{n:064x}", wrapper_cache.Entry(f"# wrapper {n}", [[4, 1], None]))
    names = sorted(p.name for p in cache.iterdir())
    assert len(names) == 3 and not [n for n in names if n.startswith(".")]   # no temporaries left
    assert wrapper_cache.load(f"{4:064x}") == wrapper_cache.Entry("# wrapper 4", [[4, 1], None])
    assert wrapper_cache.load(f"{9:064x}") is None


def test_a_folder_that_cannot_be_written_is_no_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("AMEM_COMPILE_CACHE", str(blocker / "wrappers"))   # under a file: mkdir fails
    s = step(H100)
    assert kept(s) == [0] and s.compile_regions[0]["status"].startswith("predicted as compiled (inductor)")
