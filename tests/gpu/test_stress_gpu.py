"""GPU stress: random kernels write and verify blocks across four streams, under amem and, as the
reference, under torch's native allocator. Each run is a fresh process (amem must be enabled
before CUDA starts). Run with `make test-gpu` on a machine with a GPU; skipped elsewhere.

Every tensor is allocated on a random stream and filled there with a value unique to it; other
streams (after waiting for the last write) add to it and check it, each check delayed on the GPU
by a random spin (torch.cuda._sleep) so it runs late. Before a tensor is freed, the streams that
used it are ordered before its reuse in one of two ways:

* `wait_stream`: the allocation stream waits for every stream that used the tensor, then the
  tensor is freed. Correct with any caching allocator: blocks are reused only on their own
  stream, and that stream's later work now runs after the other streams' checks.
* `record_stream`: tensor.record_stream(s) for every other stream that used it, then free. This
  checks amem's record_stream hook (amem_record_stream -> CachingAllocator::record_stream): the
  block must not be handed out again until those streams' events complete. Without the hook a
  freed block would be reused at once, the late checks would read the next tenant's values and
  `bad` would be non-zero.

A reuse before a late check has run changes the value that check reads, so `bad` counts every
premature reuse. At checkpoints, no two live tensors may overlap in device memory; at the end,
under amem, every byte is back (allocated 0; reserved 0 after empty_cache) and the walker passes.
"""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import run_python  # noqa: E402

pytestmark = pytest.mark.gpu

STRESS = r"""
import json, random, sys
allocator, ordering, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
if allocator == "amem":
    import amem_alloc
    amem_alloc.enable()
import torch

rng = random.Random(20261122)
streams = [torch.cuda.Stream() for _ in range(4)]
SIZES = [4, 512, 4096, 100_000, 1 << 20, (1 << 20) + 4, 3 << 20, 12 << 20, 40 << 20]  # bytes
MAX_HELD = 48
SPIN = 200_000  # GPU cycles, at most, that a check or a write waits before it runs


class Held:
    def __init__(self, tensor, owner, value):
        self.tensor, self.owner, self.value = tensor, owner, value
        self.writer = owner      # the stream holding the last write
        self.users = {owner}     # every stream that touched it


held, pending_checks = [], []
stats = {"bad": 0, "checks": 0, "rewrites": 0, "allocs": 0, "frees": 0, "overlap_checks": 0}


def alloc(tag):
    s = rng.choice(streams)
    with torch.cuda.stream(s):
        t = torch.empty(max(1, rng.choice(SIZES) // 4), dtype=torch.int32, device="cuda")
        t.fill_(tag)
    held.append(Held(t, s, tag))
    stats["allocs"] += 1


def rewrite(h):
    s = rng.choice(streams)
    s.wait_stream(h.writer)
    with torch.cuda.stream(s):
        torch.cuda._sleep(rng.randrange(SPIN))
        h.tensor.add_(1)
    h.value += 1
    h.writer = s
    h.users.add(s)
    stats["rewrites"] += 1


def verify(h):
    s = rng.choice(streams)
    s.wait_stream(h.writer)
    with torch.cuda.stream(s):
        torch.cuda._sleep(rng.randrange(SPIN))  # runs late: a premature reuse would show here
        pending_checks.append(torch.ne(h.tensor, h.value).any())
    h.users.add(s)
    stats["checks"] += 1


def release(h):
    verify(h)
    for u in h.users - {h.owner}:
        if ordering == "record_stream":
            h.tensor.record_stream(u)
        else:
            h.owner.wait_stream(u)
    h.tensor = None  # the last reference: the block goes back to the allocator now
    stats["frees"] += 1


def settle():
    torch.cuda.synchronize()
    stats["bad"] += sum(int(c.item()) for c in pending_checks)
    pending_checks.clear()
    spans = sorted((h.tensor.data_ptr(), h.tensor.numel() * 4) for h in held)
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert a + n <= b, f"live tensors overlap: {a:#x}+{n} > {b:#x}"
    stats["overlap_checks"] += 1


for step in range(1, steps + 1):
    r = rng.random()
    if held and (r < 0.30 or len(held) >= MAX_HELD):
        release(held.pop(rng.randrange(len(held))))
    elif held and r < 0.50:
        rewrite(rng.choice(held))
    elif held and r < 0.65:
        verify(rng.choice(held))
    else:
        alloc(step)
    if step % 500 == 0:
        settle()
    if step % 2000 == 0:
        torch.cuda.empty_cache()  # release cached memory while blocks wait on other streams
while held:
    release(held.pop())
settle()
torch.cuda.empty_cache()
if allocator == "amem":
    s = amem_alloc.memory_stats(0)
    amem_alloc._C.cuda_check_valid(0)
    stats.update(allocated_after=s["allocated_bytes.all.current"], active_after=s["active_bytes.all.current"],
                 reserved_after_empty=s["reserved_bytes.all.current"], valid=True)
else:
    stats.update(allocated_after=torch.cuda.memory_allocated(), active_after=0,
                 reserved_after_empty=torch.cuda.memory_reserved(), valid=True)
print(json.dumps(stats))
"""


def _json(proc):
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("ordering", ["wait_stream", "record_stream"])
@pytest.mark.parametrize("allocator", ["amem", "native"])
def test_random_kernels_across_streams_never_see_another_tensors_bytes(allocator, ordering):
    out = _json(run_python(STRESS, args=[allocator, ordering, "3000"], timeout=900))
    assert out["bad"] == 0, f"{out['bad']} checks read bytes another tensor wrote: {out}"
    # The counts follow from the seed alone (1473 checks, 562 rewrites, 1010 allocations for 3000
    # steps; a settle every 500 steps and one at the end).
    assert out["checks"] > 1400 and out["rewrites"] > 500 and out["overlap_checks"] == 3000 // 500 + 1, out
    assert out["allocs"] == out["frees"], out
    assert out["allocated_after"] == 0 and out["active_after"] == 0, out
    assert out["reserved_after_empty"] == 0 and out["valid"], out
