"""The temporaries one CUDA kernel takes from the caching allocator, in the kernel's order.

Design note
-----------
A CUDA kernel's host code often allocates work buffers (`at::empty` locals, cub's temporary
storage, a cuDNN workspace) that no output shows, and frees them when the host function returns.
The recorder asks the rules before each CUDA op (`kernels.before_op`); a rule describes the
kernel's temporaries on a `Scratch`: `take(nbytes)` allocates one, `give(key)` frees one the
kernel drops before it returns, and whatever is still held is freed by the recorder once the op
has run and its outputs are recorded. So the buffers that live together on CUDA live together
here. What this cannot show is an output allocated *between* two temporaries: the op's outputs
are recorded after all of the rule's allocations, so a temporary freed before the kernel
allocates its last output (a convolution's data-gradient workspace) is freed before that output
exists here.

Each temporary is named `op:what` in the record (`AllocInfo.op`), and an estimated size (one no
source fixes) is also reported as a note (`estimate`).
"""
from __future__ import annotations

from .. import notes


class Scratch:
    def __init__(self, session, op: str):
        self.session, self.op = session, op
        self.held: list[int] = []

    def take(self, nbytes: int, what: str) -> int | None:
        """Allocates `nbytes` for the kernel's `what`; None for 0 bytes (torch records nothing)."""
        nbytes = int(nbytes)
        if nbytes <= 0:
            return None
        key = self.session.storages.alloc_extra(nbytes, f"{self.op}:{what}")
        self.held.append(key)
        return key

    def give(self, key: int | None) -> None:
        """Frees a temporary the kernel drops before it returns."""
        if key is not None and key in self.held:
            self.held.remove(key)
            self.session.storages.on_free(key)

    def estimate(self, nbytes: int, what: str, why: str) -> int | None:
        """`take` for a size no source fixes; the user sees it as an estimate note."""
        notes.record(notes.ESTIMATE, f"{what} ({why})", nbytes=int(nbytes))
        return self.take(nbytes, what)


def nbytes(shape, dtype) -> int:
    """Bytes of a dense tensor of `shape` and `dtype`."""
    n = 1
    for d in shape:
        n *= int(d)
    return n * dtype.itemsize


def round_up(x: int, m: int) -> int:
    return (int(x) + m - 1) // m * m


def ceil_div(x: int, m: int) -> int:
    return (int(x) + m - 1) // m
