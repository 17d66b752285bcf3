"""The reference-model property test (tests/test_reference_model.py) earns its keep only if a
disagreement comes back as a short sequence. Here a bug is planted in the model — it forgets to
merge a freed block with a free block before it — and the same state machine must catch it and
report one of the shortest sequences that show it: two mallocs, then frees of the first block and of
the second (the second should merge with both neighbours; the model merges one) — as rules, or done
by the machine's teardown, which frees every block in order.
"""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from reference_model import ReferenceAllocator
from test_reference_model import DETERMINISTIC, CoreMatchesModel


class MergesOnlyForward(ReferenceAllocator):
    def _merge_around(self, segment, index):  # the planted bug: the previous block is never merged
        blocks = segment.blocks
        if index + 1 < len(blocks) and not blocks[index + 1].allocated:
            blocks[index].size += blocks.pop(index + 1).size


class PlantedBug(CoreMatchesModel):
    def __init__(self):
        super().__init__()
        self.pair.model = MergesOnlyForward(limit_bytes=self.LIMIT)


def test_a_planted_model_bug_is_caught_and_shrunk_to_four_steps_at_most():
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(PlantedBug, settings=settings(DETERMINISTIC, report_multiple_bugs=False))
    report = "\n".join(getattr(info.value, "__notes__", []))  # what hypothesis prints for the user
    calls = [line.strip() for line in report.splitlines() if line.strip().startswith("state.")]
    steps = [c for c in calls if not c.startswith(("state.agree(", "state.teardown("))]
    kinds = [s.split("(")[0] for s in steps]
    assert kinds in (["state.malloc"] * 2, ["state.malloc"] * 2 + ["state.free"] * 2), report
    assert calls[-1] == "state.teardown()", report
