"""CUDA memory that reference cycles hold dies when Python's collector runs, not when the program
drops it (engine/collector.py): a collection Python starts by itself is noted where the memory was
allocated, with what it freed; one the program asks for (gc.collect()) frees at a known point and is
not noted."""
import gc
import os
import sysconfig

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict.engine.collector import RAN  # noqa: E402
from amem_alloc.predict.notes import frames_site  # noqa: E402

MiB = 1 << 20


class Node:
    pass


def _cycle_holding(nbytes: int) -> None:
    node = Node()
    node.me = node                                                       # a reference cycle
    node.out = torch.empty(nbytes, dtype=torch.uint8, device="cuda")    # the line the note names
    del node


def _steps(asked: bool) -> None:
    for _ in range(3):
        _cycle_holding(8 * MiB)
        if asked:
            gc.collect()
        else:
            junk = [{} for _ in range(100_000)]   # Python's collector runs by itself
            del junk


def _collector_notes(prediction) -> list[dict]:
    return [n for n in prediction.notes if n["what"] == RAN]


def test_memory_an_automatic_collection_frees_is_noted_where_it_was_allocated():
    prediction = amem_alloc.predict(_steps, False, gpu="H100")
    notes = _collector_notes(prediction)
    assert len(notes) == 1 and notes[0]["kind"] == "not-modelled", prediction.notes
    line = _cycle_holding.__code__.co_firstlineno + 3
    assert notes[0]["where"].endswith(f"test_predict_collector.py:{line}"), notes
    assert notes[0]["bytes"] == 8 * MiB and notes[0]["count"] == 3, notes
    assert prediction.row("torch").peak_allocated < 3 * 8 * MiB   # each freed before the next was made


def test_a_collection_the_program_asks_for_is_not_noted():
    prediction = amem_alloc.predict(_steps, True, gpu="H100")
    assert _collector_notes(prediction) == [], prediction.notes
    assert prediction.row("torch").peak_allocated == 8 * MiB
    assert gc.collect is not None and getattr(gc.collect, "__name__", "") == "collect"   # given back after


def test_a_site_from_recorded_frames_names_the_users_line_by_the_library_line_below_it():
    user, library = "/home/u/train.py", os.path.join(sysconfig.get_paths()["purelib"], "transformers", "trainer.py")
    assert frames_site(((user, 12, "main"),)) == f"{user}:12"
    assert frames_site(((library, 2301, "step"), (user, 42, "main"))) == f"{user}:42 (via transformers/trainer.py:2301)"
    assert frames_site(()) == "?"
