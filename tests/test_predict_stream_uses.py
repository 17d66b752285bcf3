"""record_stream under prediction (amem_alloc/predict/engine/stream_uses.py): a storage used on another
stream is freed when that stream is synchronised with, as the caching allocator's events allow."""
import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.replay import ALLOC, FREE  # noqa: E402

MiB = 1 << 20


def _events(run):
    """(kind, key) of the recorded program, allocations of 1 MiB and more only."""
    sizes = {key: size for kind, key, size, _ in run.recording.ops if kind == ALLOC}
    return [(kind, key) for kind, key, _, _ in run.recording.ops if sizes.get(key, 0) >= MiB]


def test_a_free_waits_for_the_stream_it_was_used_on():
    with amem_alloc.predicting(policies="torch") as run:
        side = torch.cuda.Stream()
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        x.record_stream(side)
        del x
        held = run.session.stream_uses.pending()
        y = torch.empty(MiB, dtype=torch.uint8, device="cuda")   # cannot reuse x's block yet
        torch.cuda.current_stream().wait_stream(side)
        after_wait = run.session.stream_uses.pending()
        del y
    assert (held, after_wait) == (1, 0)
    (_, x_key), (_, y_key) = _events(run)[:2]
    assert _events(run)[:4] == [(ALLOC, x_key), (ALLOC, y_key), (FREE, x_key), (FREE, y_key)]
    assert run.result.row("torch").peak_allocated == 2 * MiB


def test_record_on_its_own_stream_frees_at_once():
    with amem_alloc.predicting(policies="torch") as run:
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        x.record_stream(torch.cuda.current_stream())
        del x
        assert run.session.stream_uses.pending() == 0


def test_an_event_wait_and_the_end_of_the_run_release_held_frees():
    with amem_alloc.predicting(policies="torch") as run:
        side = torch.cuda.Stream()
        a = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        a.record_stream(side)
        b.record_stream(side)
        del a
        event = side.record_event()
        torch.cuda.current_stream().wait_event(event)
        assert run.session.stream_uses.pending() == 0
        del b
        assert run.session.stream_uses.pending() == 1
    frees = [k for kind, k in _events(run) if kind == FREE]
    assert len(frees) == 2   # b's free completes when the prediction ends


def test_an_event_completes_only_the_frees_held_before_it_was_recorded():
    """wait_event: its stream's frees held before the event; Event.synchronize (the CPU blocks, as
    FSDP1's limit_all_gathers rate limiter does): those of every stream held before it."""
    with amem_alloc.predicting(policies="torch") as run:
        side, other = torch.cuda.Stream(), torch.cuda.Stream()
        a, b, c = (torch.empty(MiB, dtype=torch.uint8, device="cuda") for _ in range(3))
        a.record_stream(side)
        c.record_stream(other)
        b.record_stream(side)
        del a, c
        event = side.record_event()
        del b                                       # held after the event was recorded
        torch.cuda.current_stream().wait_event(event)
        after_wait = run.session.stream_uses.pending()       # a released; c (other stream), b held
        event.synchronize()
        after_sync = run.session.stream_uses.pending()       # c released too; b still held
    assert (after_wait, after_sync) == (2, 1)


def test_bundled_fsdp_workload_predicts():
    """It called record_stream with a torch.cuda.Stream stand-in ("unknown parameter type")."""
    run = amem_alloc.predicting(policies="torch")
    with run:
        from amem_alloc import workloads
        workloads.get("fsdp")(1, 1, "cuda", 0, None)
    streams = {stream for kind, _, _, stream in run.recording.ops if kind == ALLOC}
    assert len(streams) == 2 and run.result.row("torch").peak_allocated > 0


def test_a_stream_used_as_a_context_manager_is_current_inside_the_block():
    """Failed at 9534256 ("'FakeStream' object does not support the context manager protocol",
    read as the script's failure): torch.Stream is a context manager since torch 2.7, and
    transformers' offloaded KV cache prefetches with `with self.prefetch_stream:`."""
    seen = {}

    def program():
        side = torch.cuda.Stream()
        generic = torch.Stream()
        with side:
            seen["inside"] = torch.cuda.current_stream() == side
            with generic:
                seen["nested"] = torch.cuda.current_stream() == generic
            seen["back"] = torch.cuda.current_stream() == side
            torch.empty(1 << 20, device="cuda")
        seen["after"] = torch.cuda.current_stream() == torch.cuda.default_stream()

    with amem_alloc.predicting(policies="torch") as run:
        program()
    assert seen == {"inside": True, "nested": True, "back": True, "after": True}
    streams = [stream for kind, _, size, stream in run.recording.ops if kind == ALLOC and size == 4 * MiB]
    assert len(streams) == 1 and streams[0] != 0, streams   # allocated on the side stream
