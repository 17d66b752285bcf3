"""Private pools (Note [private pools]): what CUDA graph capture and MemPool use. Requests on
streams a scope's filter takes are served from that pool only; its blocks come back to it; its
memory goes back at the first release of cached memory after release_pool (never at once: a replay
may still run); during capture nothing synchronizes."""
import pytest

from amem_alloc import Allocator, OutOfMemoryError

MiB = 1 << 20
GRAPH = (1, 7)


def pool_of(a, address):
    for seg in a.segments():
        if any(b.address == address for b in seg.blocks):
            return tuple(seg.segment_pool_id)
    raise AssertionError("address not found")


def make(**kw):
    return Allocator("sim", debug_checks=True, **kw)


def test_scoped_requests_go_to_the_private_pool_and_others_do_not():
    a = make()
    a._core.begin_allocate_to_pool(GRAPH, [5])
    inside = a.malloc(3 * MiB, stream=5)
    other = a.malloc(3 * MiB, stream=6)           # not taken by the filter: shared pool
    a._core.end_allocate_to_pool(GRAPH)
    after = a.malloc(1000, stream=5)              # scope closed: shared pool again
    assert pool_of(a, inside) == GRAPH
    assert pool_of(a, other) == (0, 0) and pool_of(a, after) == (0, 0)


def test_private_blocks_are_reused_only_by_their_pool():
    a = make()
    a._core.begin_allocate_to_pool(GRAPH, [0])
    p = a.malloc(2 * MiB)
    a._core.end_allocate_to_pool(GRAPH)
    a.free(p)                                     # back to the private pool, still cached
    q = a.malloc(2 * MiB)                         # shared request: a new segment, not p's block
    assert q != p and pool_of(a, q) == (0, 0)
    a._core.begin_allocate_to_pool(GRAPH, [0])    # the graph replays / captures again
    r = a.malloc(2 * MiB)
    a._core.end_allocate_to_pool(GRAPH)
    assert r == p                                 # same address as before: what graph replay needs


def test_release_pool_returns_its_memory_and_the_pool_goes_away():
    a = make()
    a._core.begin_allocate_to_pool(GRAPH, [0])
    p, q = a.malloc(25 * MiB), a.malloc(100)
    a._core.end_allocate_to_pool(GRAPH)
    a.free(p)
    reserved = a.memory_stats()["reserved_bytes.all.current"]
    a._core.release_pool(GRAPH)                   # a replay may still run: nothing goes back yet
    assert a.memory_stats()["reserved_bytes.all.current"] == reserved
    a.empty_cache()                               # now p's cached segment goes back
    assert a.memory_stats()["reserved_bytes.all.current"] == reserved - 26 * MiB
    assert a._core.private_pool_count == 1        # q still lives in it
    a.free(q)
    a.empty_cache()
    assert a._core.private_pool_count == 0 and a.memory_stats()["reserved_bytes.all.current"] == 0


def test_a_pool_used_twice_is_released_after_both_release_it():
    a = make()
    for _ in range(2):
        a._core.begin_allocate_to_pool(GRAPH, [0])
        a._core.end_allocate_to_pool(GRAPH)
    p = a.malloc(10)
    a.free(p)
    a._core.release_pool(GRAPH)
    a.empty_cache()
    assert a._core.private_pool_count == 1        # one user left
    a._core.release_pool(GRAPH)
    assert a._core.private_pool_count == 1        # freeable, released lazily
    a.empty_cache()
    assert a._core.private_pool_count == 0


def test_no_synchronizing_release_during_capture():
    a = make(limit_bytes=40 * MiB)
    p = a.malloc(30 * MiB, stream=1)
    a.free(p)                                     # 30 MiB cached in the shared pool, for stream 1
    a._core.begin_allocate_to_pool(GRAPH, [0])
    with pytest.raises(OutOfMemoryError):         # would need the cache released: not while capturing
        a.malloc(20 * MiB)
    a._core.end_allocate_to_pool(GRAPH)
    a.malloc(20 * MiB)                            # after capture: stream 1's cache is released, retried
    assert a.memory_stats()["num_alloc_retries"] == 1


def test_record_stream_frees_during_capture_wait_for_its_end():
    a = make()
    a._core.begin_allocate_to_pool(GRAPH, [0])
    p = a.malloc(4096)
    a.record_stream(p, 3)
    a.free(p)
    states = lambda: [b.state for s in a.segments() for b in s.blocks]
    assert "active_pending_free" in states()      # no event may be recorded during capture
    a._core.end_allocate_to_pool(GRAPH)
    a.malloc(10)                                  # events processed after capture: p is reusable
    assert "active_pending_free" not in states()


def test_the_shared_pool_id_is_refused():
    with pytest.raises(ValueError, match="shared pool"):
        make()._core.begin_allocate_to_pool((0, 0), [0])
