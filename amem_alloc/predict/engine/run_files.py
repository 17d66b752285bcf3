"""The files one run of a prediction made, out of sight of its other runs until they would see them.

Design note
-----------
One command can run the script several times: each chosen rank of a distributed job in turn, and
once more per what-if trial. Under torchrun the ranks start together, so a rank's first look at
its output folder finds it as it was before the job; run in turn, rank 1 would find everything
rank 0 wrote by its end: HF's example scripts then stop ("Output directory ... already exists and
is not empty") or resume from rank 0's checkpoint, a program no real rank runs. A what-if trial is
a run of a changed job, which would not find the first run's checkpoints either.

So each run's new files and folders (saved_files.py tells them: made, opened for writing, saved
from fake tensors, moved into place; caches aside, which later runs reuse as they are) are moved
into a scratch folder as the run ends, each stamped with how many collectives its rank had made
when it appeared. A later rank of the same job gets another rank's path back (a copy) as it
enters the collective after the one that path followed: rank 0 saves a checkpoint, all ranks meet
at a barrier, every rank loads it (torch's DDP tutorial), and rank 1 finds it there, as under
torchrun, but does not find what rank 0 wrote after its last collective. A file found inside a new
folder that the audit events did not tell (written by a library's native code) counts as made at
its run's end. Copies a rank got back are removed at its end; what a trial's runs made is never
given back to another trial.

Ranks recorded at the same time in forked workers (recording.py: the first and the last rank of a
larger job start together) share their job's level, inherited: its scratch folder, where each
rank's paths are listed as it ends (`index-<rank>-<pid>`) for the others to find, and a board in
shared memory with each running rank's count of collectives. At a barrier a rank waits for the
ranks running beside it to reach that barrier too (as NCCL's barrier does), so that what they
wrote before it is on the disk, or listed; a rank that makes no progress for `PATIENCE_S` is no
longer waited for. A worker sends the paths its ranks made to the process it records for
(`take_out`, `adopt`), whose later ranks find them.

When the whole prediction ends (saved_files.whole_prediction), every rank's paths are put back where
the script wrote them, the lowest run's where two wrote the same path, before the checkpoints of
zeros among them are removed; of the runs that are no rank, only the first's (the others are
what-if trials, runs of a changed job: their logs and images are no run's the user makes); a level nested in another (a trial's ranks) hands its runs' paths
to that level instead, so that a later trial does not find them.

Collectives are counted as the fake process group sees them (collectives.py); where a stand-in
answers for a collective a rank would have made (object_collectives.py) it counts as torch's code
would. Not modelled: the order of two ranks' writes between the same two collectives (a race in a
real job too); waiting at collectives other than barriers; a rank recorded before another never
finds what that one writes (each rank writes its part, a barrier, rank 0 reads them all: rank 0,
recorded first, finds only its own).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import mmap
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ... import atomic_write
from .. import scratch

PATIENCE_S = 120.0   # a rank not seen to move for this long is not waited for at barriers
_POLL_S = 0.005
_SLOTS = 4096        # ranks the board holds (a higher rank is neither waited for nor waits)
_SLOT = struct.Struct("<qq")   # collectives made, state
_RUNNING, _ENDED = 1, 2
_INDEX = "index-"


@dataclass
class MadePath:
    path: str            # where the script made it
    stamp: int           # collectives its rank had made when it appeared
    kept: str | None     # where it waits (None: a folder, made again where needed)
    rank: int | None     # the rank whose run made it (None: a run that is not a rank of a job)
    run: int             # the n-th run of its level
    pid: int             # the process that moved it aside
    own: bool = True     # made by a run of this level (not handed over by a nested one)


@dataclass
class _Run:
    rank: int | None
    collectives: int = 0
    got_back: list = field(default_factory=list)   # paths copied back from other ranks, in order
    restoring: bool = False
    made: dict = field(default_factory=dict)       # at its end: its new paths (path -> stamp or None)
    number: int = 0                                 # the n-th run of its level
    waiting: list = field(default_factory=list)     # other ranks' paths not given back yet, latest stamp first
    given: set = field(default_factory=set)         # (rank, path) of those given back
    version: int = -1                               # the level's paths `waiting` was made from
    handed: bool = False                            # ended in a nested level, handed to this one


class _Board:
    """Each rank's collectives and state, in memory shared with the workers forked later."""

    def __init__(self) -> None:
        self.memory = mmap.mmap(-1, _SLOTS * _SLOT.size)

    def set(self, rank: int | None, collectives: int, state: int) -> None:
        if rank is not None and 0 <= rank < _SLOTS:
            _SLOT.pack_into(self.memory, rank * _SLOT.size, collectives, state)

    def get(self, rank: int) -> tuple[int, int]:
        return _SLOT.unpack_from(self.memory, rank * _SLOT.size)

    def running(self) -> list[int]:
        return [r for r in range(_SLOTS) if self.get(r)[1] == _RUNNING]


class Level:
    """One whole prediction (or a nested one): its runs' paths, and the run going on."""

    def __init__(self, folder: str) -> None:
        self.folder = folder                # where its runs' files wait, and ranks' lists of them
        self.paths: list[MadePath] = []
        self.runs = 0
        self.kept = 0                       # files moved aside by this process (their names)
        self.run: _Run | None = None
        self.ended: list[_Run] = []         # runs ended whose paths are still where they made them
        self.next_rank: int | None = None   # the rank the next run is (rank_run)
        self.board = _Board()
        self.listed: dict[str, list[MadePath]] = {}   # other processes' ranks' lists, by file
        self.listed_at = 0                  # the folder's modification time when they were read
        self.given_up: set[int] = set()     # ranks no longer waited for
        self.version = 0                    # changes with the paths another rank could be given

    # -- the run going on --
    def start(self, rank: int | None) -> None:
        if rank is not None:   # recorded again (roots_first): its earlier recording's paths go
            self._drop([p for p in self.paths if p.own and p.rank == rank])
        self.run = _Run(rank, number=self.runs)
        self.runs += 1
        self.board.set(rank, 0, _RUNNING)

    def synced(self, count: int = 1, barrier: bool = False) -> None:
        """The run's rank enters `count` collectives (a barrier: it waits for the ranks running
        beside it); other ranks' paths made before the matching one come back."""
        run = self.run
        if run is None:
            return
        run.collectives += count
        if run.rank is None:
            return
        self.board.set(run.rank, run.collectives, _RUNNING)
        if barrier:
            self._wait_for_others(run)
        self._read_lists(barrier)
        if run.version != self.version:   # a collective costs a comparison, not a walk of every path
            run.waiting = sorted(self._others(run.rank), key=lambda p: p.stamp, reverse=True)
            run.version = self.version
        run.restoring = True
        try:
            while run.waiting and run.waiting[-1].stamp < run.collectives:
                p = run.waiting.pop()
                if (p.rank, p.path) not in run.given:
                    run.given.add((p.rank, p.path))
                    self._give_back(p, run)
        finally:
            run.restoring = False

    def end(self, made: dict[str, int | None]) -> None:
        """The run ended: `made` (path -> stamp, None where not told) stays where it is until another
        run starts (set_aside); the copies it got back go."""
        run, self.run = self.run, None
        if run is None:
            return
        for path in reversed(run.got_back):   # a folder holding its own new paths stays for now
            _remove(path)
        run.made = made
        self.ended.append(run)
        self.board.set(run.rank, run.collectives, _ENDED)

    def set_aside(self) -> None:
        """The paths of the runs ended, moved aside (another run is to start), once the ranks
        running beside them in other workers have ended: a rank that found a path after a barrier
        reads it whenever it likes, and moved it would be gone until that rank's next collective
        gave it back (rank 2 of 3 missed rank 0's checkpoint after their barrier)."""
        if any(run.made and run.rank is not None for run in self.ended):
            self._wait_for_ranks_beside()
        for run in self.ended:
            for path, stamp in _everything_within(run.made, run.collectives):
                self._keep(path, stamp, run)
            for path in sorted((p for p in run.made if os.path.isdir(p) and not os.path.islink(p)), reverse=True):
                _remove_empty(path)
            for path in reversed(run.got_back):   # folders it got back that held its own paths
                _remove(path)
            if run.rank is not None:
                self._list(run.rank)
        self.ended = []

    # -- the level's end --
    def hand_to(self, outer: "Level") -> None:
        if self.paths:   # more than one run: the last one's too, each path with its rank and run
            self.set_aside()
        for p in self.paths:
            p.own = False   # another job's: never given to the outer level's ranks, always put back
        outer.paths.extend(self.paths)
        for run in self.ended:   # a level of one run: its paths stay where they are, another job's
            run.handed = True
        outer.ended.extend(self.ended)
        outer.version += 1
        self.paths, self.ended = [], []

    def put_back(self) -> None:
        """Every path where the script made it, the lowest run's first (a level of one run: nothing
        was moved)."""
        if self.paths:
            self.set_aside()
        for p in sorted(self._kept_for_the_user(), key=lambda p: (p.rank if p.rank is not None else -1, p.run,
                                                                  p.path.count(os.sep))):
            if p.kept is None:
                with contextlib.suppress(OSError):
                    os.makedirs(p.path, exist_ok=True)
            elif not os.path.lexists(p.path):
                with contextlib.suppress(OSError):
                    os.makedirs(os.path.dirname(p.path), exist_ok=True)
                    shutil.move(p.kept, p.path)
        self.paths, self.ended = [], []

    # -- helpers --
    def _kept_for_the_user(self) -> list[MadePath]:
        """What goes back: every rank's paths, and of the runs that are no rank only the first's:
        the others are what-if trials, runs of a changed job the user never runs (Lightning's
        event files of six runs in one log folder)."""
        runs = [p.run for p in self.paths if p.own and p.rank is None]
        first = min(runs, default=None)
        return [p for p in self.paths if not (p.own and p.rank is None and p.run != first)]

    def _others(self, rank: int) -> list[MadePath]:
        """Other ranks' paths: this process's, and those listed by ranks recorded in other processes."""
        listed = [p for paths in self.listed.values() for p in paths]
        return [p for p in (*self.paths, *listed) if p.own and p.rank is not None and p.rank != rank]

    def _read_lists(self, always: bool) -> None:
        """The lists of ranks recorded in other processes, read again where the folder changed, and
        at each barrier (its time may not have: a clock tick is coarser than two writes)."""
        try:
            changed = os.stat(self.folder).st_mtime_ns
        except OSError:
            return
        if always or changed != self.listed_at:
            self.listed_at = changed
            self.version += 1
            for name in os.listdir(self.folder):
                if name.startswith(_INDEX) and not name.endswith(f"-{os.getpid()}"):
                    with contextlib.suppress(OSError, ValueError, TypeError):
                        with open(os.path.join(self.folder, name), encoding="utf-8") as f:
                            self.listed[name] = [MadePath(**p) for p in json.load(f)]

    def _list(self, rank: int) -> None:
        """`rank`'s paths listed for the ranks recorded in other processes (written whole)."""
        name = os.path.join(self.folder, f"{_INDEX}{rank}-{os.getpid()}")
        with contextlib.suppress(OSError):   # atomic_write's temporary is hidden ("."): never read as a list
            atomic_write.write_text(name, json.dumps([dataclasses.asdict(p) for p in self.paths if p.rank == rank]))

    def _wait_for_others(self, run: _Run) -> None:
        """Until every other running rank has entered this barrier (or ended, or stopped moving)."""
        self._wait_until(lambda collectives: collectives >= run.collectives, skip=run.rank)

    def _wait_for_ranks_beside(self) -> None:
        """Until every rank running in another process has ended (or stopped moving)."""
        self._wait_until(lambda collectives: False)

    def _wait_until(self, reached: Callable[[int], bool], skip: int | None = None) -> None:
        """Until each running rank (but `skip`) has ended or `reached(its collectives)`; one not
        seen to make a collective for PATIENCE_S is given up on (never waited for again)."""
        for other in self.board.running():
            if other == skip or other in self.given_up:
                continue
            seen, since = self.board.get(other)[0], time.monotonic()
            while True:
                collectives, state = self.board.get(other)
                if state != _RUNNING or reached(collectives):
                    break
                if collectives != seen:
                    seen, since = collectives, time.monotonic()
                elif time.monotonic() - since > PATIENCE_S:
                    self.given_up.add(other)
                    break
                time.sleep(_POLL_S)

    def _keep(self, path: str, stamp: int, run: _Run) -> None:
        kept = None
        if not os.path.isdir(path) or os.path.islink(path):
            self.kept += 1
            kept = os.path.join(self.folder, f"{os.getpid()}-{self.kept}")
            try:
                shutil.move(path, kept)
            except OSError:
                return   # left where it is, seen by later runs as before
        self.paths.append(MadePath(path, stamp, kept, run.rank, run.number, os.getpid(), own=not run.handed))
        self.version += 1

    def _give_back(self, p: MadePath, run: _Run) -> None:
        if os.path.lexists(p.path):
            return
        folder = p.path if p.kept is None else os.path.dirname(p.path)
        missing = []
        while folder and not os.path.lexists(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        try:
            for folder in reversed(missing):
                os.mkdir(folder)
                run.got_back.append(folder)
            if p.kept is not None:
                shutil.copy2(p.kept, p.path, follow_symlinks=False)
                run.got_back.append(p.path)
        except OSError:
            return

    def _drop(self, paths: list[MadePath]) -> None:
        for p in paths:
            if p.kept is not None and p.pid == os.getpid():
                _remove(p.kept)
        self.paths = [p for p in self.paths if p not in paths]
        self.version += 1


_LEVELS: list[tuple[Level, int]] = []   # whole predictions running, innermost last, with their process


def _current() -> Level | None:
    return _LEVELS[-1][0] if _LEVELS else None


@contextlib.contextmanager
def level() -> Iterator[Level]:
    """A whole prediction's paths: put back at its end, or handed to the level around it."""
    outermost = _LEVELS[0][0].folder if _LEVELS else None
    here = Level(tempfile.mkdtemp(dir=outermost) if outermost else scratch.make("runs"))
    _LEVELS.append((here, os.getpid()))
    try:
        yield here
    finally:
        _LEVELS.pop()
        outer = _LEVELS[-1] if _LEVELS else None
        if outer is not None and outer[1] == os.getpid():
            here.hand_to(outer[0])
        else:
            here.put_back()
        if not _LEVELS:   # every level's folder is inside the outermost's
            shutil.rmtree(here.folder, ignore_errors=True)


@contextlib.contextmanager
def rank_run(rank: int) -> Iterator[None]:
    """The run inside is `rank`'s (its collectives bring other ranks' paths back)."""
    here = _current()
    if here is None:
        yield
        return
    previous, here.next_rank = here.next_rank, rank
    try:
        yield
    finally:
        here.next_rank = previous


def run_started() -> None:
    """A run of the script begins (saved_files.install): what the runs before it made is set aside."""
    set_aside()
    here = _current()
    if here is not None:
        here.start(here.next_rank)


def set_aside() -> None:
    """The paths of every run ended in this process, moved aside (a run is to start, here or in
    workers about to be forked)."""
    for lvl, pid in _LEVELS:
        if pid == os.getpid():
            lvl.set_aside()


def run_ended(made: dict[str, int | None]) -> None:
    here = _current()
    if here is not None:
        here.end(made)


def synced(count: int = 1, barrier: bool = False) -> None:
    """The rank running enters `count` collectives (a barrier: it waits for those beside it)."""
    here = _current()
    if here is not None:
        here.synced(count, barrier)


def expect(ranks: list[int]) -> None:
    """`ranks` start at the same time (in this process and forked workers): the first to reach a
    barrier waits for the others even before they start."""
    here = _current()
    if here is not None:
        for rank in ranks:
            here.board.set(rank, 0, _RUNNING)


def now() -> int:
    """Collectives the run going on has made (its paths' stamps)."""
    here = _current()
    return here.run.collectives if here is not None and here.run is not None else 0


def restoring() -> bool:
    """Paths are being given back (what the audit events then tell is not the script's)."""
    here = _current()
    return bool(here is not None and here.run is not None and here.run.restoring)


def take_out() -> list[MadePath]:
    """The paths this process's runs made in the level, taken from it (a forked worker sends them
    to the process it records for, whose later ranks find them and which puts them back)."""
    here = _current()
    if here is None:
        return []
    here.set_aside()
    mine = [p for p in here.paths if p.pid == os.getpid()]
    here.paths = [p for p in here.paths if p.pid != os.getpid()]
    return mine


def adopt(paths: list[MadePath]) -> None:
    """Paths a forked worker's ranks made (take_out), as this level's runs'."""
    here = _current()
    if here is not None:
        here.paths.extend(paths)
        here.version += 1


def _everything_within(made: dict[str, int | None], last: int) -> list[tuple[str, int]]:
    """Each path in `made` that is there and each file or folder inside a folder of it, with its
    stamp (`last` where not told), shallowest first."""
    out: dict[str, int] = {}
    for path, stamp in made.items():
        if not os.path.lexists(path):
            continue
        out.setdefault(path, last if stamp is None else stamp)
        if os.path.isdir(path) and not os.path.islink(path):
            for root, dirs, files in os.walk(path):
                for name in dirs + files:
                    inside = os.path.join(root, name)
                    told = made.get(inside)
                    out.setdefault(inside, last if told is None else told)
    return sorted(out.items(), key=lambda item: item[0].count(os.sep))


def _remove(path: str) -> None:
    """A file, or a folder left empty (what else is inside is not ours to remove)."""
    if os.path.isdir(path) and not os.path.islink(path):
        _remove_empty(path)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


def _remove_empty(folder: str) -> None:
    """`folder` and the folders inside it, where nothing else is left in them."""
    for root, _dirs, _files in os.walk(folder, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(root)
