"""One rank's recorded program, and every chosen rank recorded: in this process, or in forked
worker processes when the machine has the cores.

Design note
-----------
A rank's recording (`Recording`) is what its analysis needs and nothing live: its RecordedRun
(run.py: the program, what each storage is, the notes, the target, the live policy, how long it
took), the steps its script made, and its signature (equal programs, equal signatures). Recording is most of a
distributed prediction's time, and ranks are independent (each runs the whole script on its own
fake world). With W > 1 usable cores and more than two ranks, the first rank is recorded here,
which builds once what every rank's run shares in torch (its lazily imported modules, its
first-call caches: DTensor's sharding propagation cache alone is most of a first FSDP2 rank's
time; the script's libraries each rank imports afresh, fresh_libraries.py); then W worker
processes are forked from this one (multiprocessing's "fork" start method: all of that is
inherited, nothing is rebuilt) and take the other ranks one at a time, each sending its
`Recording` back (pickled). The ranks come out in rank order, as the serial loop gives them, and
every chosen rank is recorded; nothing is inferred from another rank. Before forking, the objects
that exist are frozen out of the garbage collector (gc.freeze), so the workers' collections do
not walk them.

A worker computes its CPU tensors on one intra-op thread, as each process does under torchrun
(OMP_NUM_THREADS=1), and as it must: the OpenMP thread team this process may have started does not
survive fork, and a parallel CPU kernel in the child would wait for it forever (torch's DataLoader
workers do the same).

The workers are plain, non-daemonic processes (a script may start its own, e.g. a DataLoader's
workers; ChildWatch in api.py guards those as in one process). A rank whose script fails in a
worker fails the prediction as it would in order: the lowest failing rank's exception is raised
here once every rank below it is recorded (its attributes and message carried back; the
traceback the script printed was printed by the worker). A worker that dies without answering
(a crash, a kill) leaves its ranks to be recorded here, in this process.
"""
from __future__ import annotations

import gc
import hashlib
import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator


_POLL_S = 1.0   # how often the parent checks that its workers are alive while it waits


@dataclass
class Recording:
    rank: int
    run: Any            # the rank's RecordedRun (predict/run.py)
    steps: int          # optimizer steps the script made (with those written out)
    signature: str = ""
    written_out: int = 0   # steps repeating the last one run, written out instead (repeat.py)
    ended_by: str | None = None   # why the script stopped after its steps (script.py's ENDED_BY), or None
    backward_steps: bool = False   # the script made no optimizer: its steps were its backward passes
    roots_read: frozenset = frozenset()   # ranks whose broadcast values it read, unknown (collectives.py)

    def __post_init__(self) -> None:
        self.signature = self.signature or program_signature(self.run.ops, self.run.markers)

    @property
    def seconds(self) -> float:
        """The rank's recording, wall time."""
        return self.run.seconds


def program_signature(ops: list[tuple], markers: list[tuple]) -> str:
    """A digest of a recorded program that is equal for equal allocation sequences (each op's kind,
    key, size, and its stream numbered by first use, since stream ids differ between runs)."""
    streams: dict[int, int] = {}
    h = hashlib.blake2b(digest_size=16)
    for kind, key, size, stream in ops:
        s = streams.setdefault(stream, len(streams)) if kind == 0 else 0
        h.update(f"{kind},{key},{size},{s};".encode())
    h.update(repr(list(markers)).encode())
    return h.hexdigest()


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def record_all(ranks: list[int], record: Callable[[int], Recording], workers: int | None = None,
               together: bool = False) -> Iterator[Recording]:
    """Each rank's Recording, in rank order; `record(rank)` runs one rank. workers: processes to
    record in (None: the usable cores; 1: this process, in turn). together: the workers start
    before the first rank is recorded here, all at once (a few ranks, where waiting for a warm
    first rank would take longer than building the shared state in each)."""
    workers = usable_cores() if workers is None else workers
    if workers <= 1 or len(ranks) < 2 or not _can_fork() or (len(ranks) == 2 and not together):
        for rank in ranks:
            yield record(rank)
        return
    if together:
        from ..engine import run_files

        run_files.expect(ranks[:1])   # starting with the workers' first ranks: they meet at barriers
        pool = _Pool(ranks[1:], record, min(workers - 1, len(ranks) - 1))
        try:   # rank 0 failing here, or the caller stopping early, stops the workers: left running,
            yield record(ranks[0])   # each would wait at exit for its answer to be read, and this
            yield from pool.results()   # process for them (a hang instead of the failure's line)
        finally:
            pool._stop()
        return
    yield record(ranks[0])   # here: what every rank shares is built once, and the workers inherit it
    if not _can_fork():   # rank 0 started threads a forked child cannot have (a compiled model's backward)
        for rank in ranks[1:]:
            yield record(rank)
        return
    gc.collect()
    gc.freeze()   # what exists now is never collected: the workers' collections skip it, its pages stay shared
    try:
        yield from _Pool(ranks[1:], record, min(workers, len(ranks) - 1)).results()
    finally:
        gc.unfreeze()


def _can_fork() -> bool:
    """Whether a forked worker could record a rank: the platform forks, and torch's autograd has not
    started its device threads here (a compiled model's traced backward starts them; a child forked
    after refuses every backward: "Unable to handle autograd's threading in combination with
    fork-based multiprocessing"). Linux names those threads pt_autograd_N."""
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods() and not _autograd_threads()


def _autograd_threads() -> bool:
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().startswith("pt_autograd_"):
                    return True
        except OSError:
            continue
    return False


# ============================================================================ the workers
class _Pool:
    """Forked workers taking ranks from a queue; their answers, in rank order."""

    def __init__(self, ranks: list[int], record: Callable[[int], Recording], workers: int) -> None:
        import multiprocessing

        from ..engine import run_files

        self.ranks, self.record = ranks, record
        run_files.set_aside()   # what ranks recorded here made: out of the workers' sight (run_files.py)
        run_files.expect(ranks[:workers])   # each worker's first rank starts now: they meet at barriers
        context = multiprocessing.get_context("fork")
        self.todo = context.Queue()
        for rank in ranks:
            self.todo.put(rank)
        for _ in range(workers):
            self.todo.put(None)
        sys.stdout.flush()
        sys.stderr.flush()
        # each worker answers on a pipe of its own, synchronously: a worker that dies leaves no lock
        # held for the others (a queue's writer thread dying mid-write held the queue's lock, and
        # every other worker then waited on it at its exit, and this process on them)
        pipes = [context.Pipe(duplex=False) for _ in range(workers)]
        self.processes = [context.Process(target=_work, args=(self.todo, writer, record), daemon=False)
                          for _, writer in pipes]
        for p in self.processes:
            p.start()
        for _, writer in pipes:
            writer.close()   # the workers hold theirs: a worker's end closing is its death (EOF here)
        self.answering = [reader for reader, _ in pipes]

    def results(self) -> Iterator[Recording]:
        answers: dict[int, tuple[str, Any]] = {}
        try:
            for rank in self.ranks:
                while rank not in answers:
                    if not self._wait(answers):
                        break
                kind, value = answers.pop(rank) if rank in answers else ("here", None)
                if kind == "failed":
                    raise _rebuilt(value) if value is not None else _rerun_here(self.record, rank)
                yield value if kind == "recorded" else self.record(rank)
        finally:
            self._stop()

    def _wait(self, answers: dict[int, tuple[str, Any]]) -> bool:
        """Answers into `answers` (at least one); False when no worker is left to give one."""
        from multiprocessing.connection import wait

        from ..engine import run_files, saved_files

        while self.answering:
            got = False
            for reader in wait(self.answering, timeout=_POLL_S):
                try:
                    rank, kind, value, saved, made = reader.recv()
                except (EOFError, OSError):   # the worker ended (done, or dead)
                    self.answering.remove(reader)
                    reader.close()
                    continue
                saved_files.hand_over(saved)
                run_files.adopt(made)
                answers[rank] = (kind, value)
                got = True
            if got:
                return True
        return False

    def _stop(self) -> None:
        for p in self.processes:
            if p.is_alive():
                p.kill()
        for p in self.processes:
            p.join()
        for reader in self.answering:
            reader.close()
        self.answering = []
        self.todo.cancel_join_thread()


def _rerun_here(record: Callable[[int], Recording], rank: int) -> BaseException:
    """A failed rank whose exception could not be carried back: its failure, recorded here."""
    try:
        record(rank)
    except BaseException as failure:  # noqa: BLE001 - handed on unchanged
        return failure
    return RuntimeError(f"rank {rank} failed in a worker process and not when recorded again")


def _work(todo: Any, answer: Any, record: Callable[[int], Recording]) -> None:
    """A worker: ranks from `todo` recorded, each answer sent on its own pipe (`answer`), with the
    files its ranks saved from fake tensors (the parent removes them as the whole prediction ends)
    and the paths they made, moved aside (run_files.py)."""
    import torch

    from ..engine import run_files, saved_files

    torch.set_num_threads(1)   # OpenMP's thread team does not survive fork (a parallel kernel would hang)
    while (rank := todo.get()) is not None:
        with saved_files.whole_prediction(runs=False) as saved:   # the parent's to remove, as rank 0's (saved_files.py)
            try:
                recording = record(rank)
            except BaseException as failure:  # noqa: BLE001 - carried to the parent, raised there
                answer.send((rank, "failed", _portable(failure), saved, run_files.take_out()))
                return
            made = run_files.take_out()   # the parent's later ranks find them, and it puts them back
        answer.send((rank, "recorded", recording, saved, made))


def _portable(failure: BaseException) -> bytes | None:
    """The exception's class, args and attributes, pickled (None if they cannot be)."""
    try:
        return pickle.dumps((type(failure), failure.args, dict(vars(failure))))
    except Exception:  # noqa: BLE001 - the parent records the rank again instead
        return None


def _rebuilt(state: bytes) -> BaseException:
    cls, args, attrs = pickle.loads(state)
    failure = cls.__new__(cls)
    failure.args = args
    failure.__dict__.update(attrs)
    return failure

