"""One program under several allocator policies: the one evaluation and the one row every command prints.

Design note
-----------
`amem replay` (replay/trace.py), `amem compare` (compare/child.py, compare/table.py) and `amem
predict` (predict/analysis/prediction.py) all ask the same question of a program: per policy, the peaks,
the fragmentation at the peak, the device calls, and whether it fits a device. `evaluate` answers
it through the C++ loop on the sim backend (program.run), one PolicyRow per policy; the row is
plain data (`to_dict`, `from_dict`), so a row computed in `amem compare`'s child process crosses
to the parent as JSON and prints with the same cells.

A device capacity is judged in one of two ways, both meaning "runs there without a failed
allocation":

* under the capacity (amem replay): the replay runs on a device of that size; `ooms` counts the
  requests that fail there, and a failing policy also gets `unlimited_peak_reserved`, what it
  reserves with no limit;
* by the smallest capacity (amem predict, `search_min_capacity=True`): the replay runs unlimited
  (the peaks are what the policy reserves when memory is plenty) and `min_capacity` is searched,
  in 2 MiB steps, between peak allocated (nothing smaller works) and the unlimited peak reserved
  (which works by construction). On a limited device a failed request first frees the cache and
  retries, as torch does, so min_capacity can be below the unlimited peak reserved; the search
  assumes that more memory never hurts, which holds for these policies.

The table's cells are named once (COLUMNS); each command picks its columns.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Iterable

from .. import policies as policies_mod
from ..introspection import format_bytes
from . import program as replay

MIN_CAPACITY_STEP = 2 << 20   # min_capacity's resolution: the small pool's segment size


@dataclass
class PolicyRow:
    """One policy's figures on one program."""

    policy: str
    conf: str
    description: str
    peak_allocated: int
    peak_reserved: int
    allocated_at_peak: int             # the most allocated while reserved stood at its peak
    device_mallocs: int                # cudaMalloc calls and page mappings
    device_frees: int                  # cudaFree calls and page unmappings
    ooms: int = 0                      # requests that failed under `capacity` (ran under it)
    capacity: int = 0                  # the device judged against, in bytes (0: none)
    min_capacity: int | None = None    # the smallest device it runs on (searched), in bytes
    unlimited_peak_reserved: int | None = None  # where it failed under the capacity: its need without one
    ops: int = 0                       # requests replayed
    seconds: float = 0.0               # the C++ loop's time
    timeline: list = field(default_factory=list)  # (request, allocated, reserved) samples

    @property
    def fragmentation_at_peak(self) -> float:
        """1 - allocated / reserved when reserved peaked."""
        return 1 - self.allocated_at_peak / self.peak_reserved if self.peak_reserved else 0.0

    @property
    def fits(self) -> bool | None:
        """Whether it runs on `capacity` without a failed allocation (None: no capacity)."""
        if not self.capacity:
            return None
        return self.min_capacity <= self.capacity if self.min_capacity is not None else self.ooms == 0

    @property
    def headroom(self) -> int | None:
        """capacity - peak reserved (negative while it fits: it survives by emptying its cache)."""
        return self.capacity - self.peak_reserved if self.capacity else None

    @property
    def spare(self) -> int | None:
        """capacity - min capacity: what is left of the device at the smallest size the run needs
        (negative: by how much it does not fit); None without both."""
        return self.capacity - self.min_capacity if self.capacity and self.min_capacity is not None else None

    def to_dict(self) -> dict:
        return dict(asdict(self), fragmentation_at_peak=self.fragmentation_at_peak, fits=self.fits,
                    headroom=self.headroom, spare=self.spare)

    @classmethod
    def from_dict(cls, data: dict) -> "PolicyRow":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


# ============================================================================ evaluating
def policy_row(program: replay.Program, policy: policies_mod.Policy, capacity: int = 0, *,
               search_min_capacity: bool = False, max_samples: int = 2000) -> PolicyRow:
    """One policy on `program`, judged against `capacity` (0: none); see the design note for the two ways."""
    limit = 0 if search_min_capacity else capacity
    run = replay.run(program, policy.conf, limit_bytes=limit, max_samples=max_samples)
    row = PolicyRow(policy.name, policy.conf, policy.description, run.peak_allocated, run.peak_reserved,
                    run.allocated_at_peak, run.device_mallocs, run.device_frees, run.failed_allocs, capacity,
                    ops=run.ops, seconds=run.seconds, timeline=[list(s) for s in run.timeline])
    if search_min_capacity and len(program):
        row.min_capacity = min_capacity(program, policy.conf, run.peak_allocated, run.peak_reserved)
    elif search_min_capacity:
        row.min_capacity = 0
    if limit and run.failed_allocs:
        row.unlimited_peak_reserved = replay.run(program, policy.conf, max_samples=2).peak_reserved
    return row


def evaluate(program: replay.Program, policies: Iterable[policies_mod.Policy], capacity: int = 0, *,
             search_min_capacity: bool = False, max_samples: int = 2000) -> list[PolicyRow]:
    """Every policy on `program`, in order: peaks, fragmentation, device calls, and where a capacity
    is given whether it fits (under it, or by the smallest capacity with search_min_capacity)."""
    return [policy_row(program, p, capacity, search_min_capacity=search_min_capacity, max_samples=max_samples)
            for p in policies]


def _runs_on(program_bytes: bytes, conf: str, limit: int) -> bool:
    return replay.replay_program(program_bytes, conf, 1, limit)["failed_allocs"] == 0


def min_capacity(program: replay.Program, conf: str, peak_allocated: int, peak_reserved: int) -> int:
    """The smallest device (a multiple of 2 MiB) the program runs on without a failed allocation."""
    data, step = program.to_bytes(), MIN_CAPACITY_STEP
    lo = max(1, -(-peak_allocated // step))          # in steps; nothing below peak allocated works
    hi = max(lo, -(-peak_reserved // step))
    while not _runs_on(data, conf, hi * step):       # safety: should not happen (hi ran unlimited)
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if _runs_on(data, conf, mid * step):
            hi = mid
        else:
            lo = mid + 1
    return hi * step


# ============================================================================ the table
def _bytes(value: Any) -> str:
    return value if isinstance(value, str) else "n/a" if value is None else format_bytes(value)


def _share(value: Any) -> str:
    return value if isinstance(value, str) else "n/a" if value is None else f"{value:.1%}"


def _seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    return f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def _ops_per_second(row: dict) -> str:
    if "ops_per_second" in row:  # a row that is not a replay (the native trace's): its own text
        return row["ops_per_second"]
    rate = row["ops"] / row["seconds"] if row["seconds"] > 0 else float("inf")
    return f"{rate / 1e6:.2f}M"


def _fits(row: dict) -> str:
    if row.get("fits") is None:
        return "n/a"
    return ("yes*" if row["headroom"] < 0 else "yes") if row["fits"] else "NO"


def signed_bytes(n: int | None) -> str:
    return "n/a" if n is None else format_bytes(n) if n >= 0 else "-" + format_bytes(-n)


# header -> the cell of a row (a PolicyRow's to_dict(), plus what the command adds: pid, seconds_per_step)
COLUMNS: dict[str, Callable[[dict], str]] = {
    "configuration": lambda r: r["policy"],
    "policy": lambda r: r["policy"],
    "peak allocated": lambda r: _bytes(r["peak_allocated"]),
    "peak reserved": lambda r: _bytes(r["peak_reserved"]),
    "min capacity": lambda r: _bytes(r.get("min_capacity")),
    "needs": lambda r: _bytes(r.get("min_capacity")),          # the one "needs" figure: the min capacity
    "spare": lambda r: signed_bytes(r.get("spare")),           # capacity less what it needs
    "fits": _fits,
    "headroom": lambda r: signed_bytes(r.get("headroom")),
    "frag. at peak": lambda r: _share(r["fragmentation_at_peak"]),
    "device mallocs": lambda r: str(r["device_mallocs"]),
    "device frees": lambda r: str(r["device_frees"]),
    "OOMs": lambda r: str(r["ooms"]),
    "ops/s": _ops_per_second,
    "time/step": lambda r: _seconds(r.get("seconds_per_step")),
    "pid": lambda r: str(r.get("pid")),
}


def cells(row: dict, columns: tuple[str, ...]) -> list[str]:
    """One row's cells; a row whose run failed (`error`) says so in place of its figures."""
    if row.get("error"):
        return [row["policy"], "failed: " + row["error"][:60]] + [""] * (len(columns) - 2)
    return [COLUMNS[c](row) for c in columns]


def format_table(rows: Iterable[dict], columns: tuple[str, ...]) -> list[str]:
    """The rows (PolicyRow.to_dict(), or dicts with the same keys) as aligned text lines, headers first:
    the first column left-aligned, the figures right-aligned."""
    return align([list(columns)] + [cells(r, columns) for r in rows])


def align(rows: list[list[str]], text_columns: int = 1) -> list[str]:
    """Rows of cells (headers first) as text lines: the first column left-aligned (and the last
    `text_columns - 1`: words, not figures), the rest right-aligned."""
    n = len(rows[0])
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    left = {0} | set(range(n - text_columns + 1, n))
    return ["  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def format_markdown(rows: Iterable[dict], columns: tuple[str, ...]) -> str:
    rows = list(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cells(r, columns)) + " |" for r in rows])
