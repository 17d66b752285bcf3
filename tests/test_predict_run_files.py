"""The files one run of a prediction made, out of the other runs' sight until they would see them
(amem_alloc/predict/engine/run_files.py): ranks recorded in turn find another rank's files only
after the collective that followed them, what-if trials never, and all are back at the end."""
from __future__ import annotations

import glob
import os
import tempfile

import pytest

from amem_alloc.predict.engine import run_files

torch = pytest.importorskip("torch")


def _scratch() -> set[str]:
    """This process's scratch folders for the runs' files (scratch.py names them by process)."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), f"amem-runs-{os.getpid()}-*")))


def _write(path, text="x") -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def test_a_rank_finds_another_ranks_paths_after_the_collective_that_followed_them(tmp_path):
    out = tmp_path / "out"
    before = _scratch()
    with run_files.level():
        with run_files.rank_run(0):
            run_files.run_started()
            os.mkdir(out)                                   # before any collective
            run_files.synced()
            first = _write(out / "first.txt", "rank 0")    # after one
            run_files.synced(2)
            late = _write(out / "late.txt")                 # after its last (three)
            native = _write(out / "sub" / "native.bin")     # not told (a library's native writer)
            run_files.run_ended({str(out): 0, first: 1, late: 3})
        assert out.exists()   # where it was made until another run starts

        with run_files.rank_run(1):
            run_files.run_started()
            seen = [sorted(os.listdir(out)) if out.exists() else None]   # out of this rank's sight
            for _ in range(3):   # the collectives rank 0 made
                run_files.synced()
                seen.append(sorted(os.listdir(out)) if out.exists() else None)
            own = _write(out / "rank1.txt")
            run_files.run_ended({own: 3})
        assert seen == [None, [], ["first.txt"], ["first.txt"]]
        assert sorted(os.listdir(out)) == ["rank1.txt"]   # the copies it got back are gone
        run_files.set_aside()
        assert not out.exists()
    assert (out / "first.txt").read_text() == "rank 0"   # the lowest rank's where two wrote a path
    assert sorted(os.listdir(out)) == ["first.txt", "late.txt", "rank1.txt", "sub"]
    assert os.path.exists(native)
    assert _scratch() == before


def test_a_rank_writing_a_path_it_got_back_keeps_its_own_and_the_first_ranks_is_put_back(tmp_path):
    path = tmp_path / "log.txt"
    with run_files.level():
        for rank in (0, 1):
            with run_files.rank_run(rank):
                run_files.run_started()
                run_files.synced()
                found = path.exists()
                _write(path, f"rank {rank}")
                run_files.run_ended({str(path): 1})
            assert not found
    assert path.read_text() == "rank 0"


def test_a_nested_level_hands_its_runs_paths_on_and_a_later_run_does_not_see_them(tmp_path):
    """Ranks of one job, then another job's: each runs from where the first started."""
    path = tmp_path / "out" / "checkpoint-1" / "model.pt"
    found = []
    with run_files.level():
        for job in range(2):
            with run_files.level(), run_files.rank_run(0):
                run_files.run_started()
                found.append(path.exists())
                _write(path, f"job {job}")
                run_files.run_ended({str(tmp_path / "out"): 0, str(path): 0})
    assert found == [False, False]
    assert path.read_text() == "job 0"


def test_what_if_trials_start_where_the_first_run_did_and_only_its_files_stay(tmp_path):
    """A trial is a run of a changed job: it finds none of the first run's files, and its own
    (Lightning's event files, one per run, in one log folder) are not the user's to keep."""
    logs = tmp_path / "logs"
    found = []
    with run_files.level():
        for run in range(3):   # the prediction, then two trials
            run_files.run_started()
            found.append(sorted(os.listdir(logs)) if logs.exists() else None)
            events = _write(logs / f"events.{run}")
            run_files.run_ended({str(logs): 0, events: 0})
    assert found == [None, None, None]
    assert sorted(os.listdir(logs)) == ["events.0"]


def test_paths_taken_out_of_a_level_are_adopted_by_another_and_given_to_its_later_ranks(tmp_path):
    """A forked worker's ranks: their paths go to the process it records for (recording.py)."""
    path = tmp_path / "shard-1.pt"
    with run_files.level():
        with run_files.level():   # the worker's own
            with run_files.rank_run(1):
                run_files.run_started()
                _write(path)
                run_files.run_ended({str(path): 0})
            made = run_files.take_out()   # set aside first
        assert [p.path for p in made] == [str(path)] and not path.exists()
        run_files.adopt(made)
        with run_files.rank_run(2):
            run_files.run_started()
            run_files.synced()
            found = path.exists()
            run_files.run_ended({})
        assert found and not path.exists()
    assert path.exists()


# -- scripts, each rank recorded under prediction on the fake process group --

CHECKING = """
import os, sys, torch, torch.distributed as dist
out = sys.argv[1]
if os.listdir(out):   # HF's example scripts: "Output directory ... already exists and is not empty"
    raise ValueError(f"Output directory ({out}) already exists and is not empty")
dist.init_process_group("nccl")
rank = dist.get_rank()
if rank == 0:
    with open(os.path.join(out, "before-barrier.txt"), "w") as f:
        f.write("rank 0")
dist.barrier()
found = os.path.exists(os.path.join(out, "before-barrier.txt"))
dist.barrier()
with open(os.path.join(out, f"after-last-collective-{rank}.txt"), "w") as f:
    f.write(str(rank))
late = any(name.startswith("after-last") and not name.endswith(f"{rank}.txt") for name in os.listdir(out))
kept = torch.empty((64 if found else 1) << 20, dtype=torch.uint8, device="cuda")
extra = torch.empty((16 if late else 0) << 20, dtype=torch.uint8, device="cuda")
"""


def _ranks(tmp_path, world: int, workers: int, ranks: str | None = None):
    from amem_alloc.predict.distributed import launch as launch_mod
    from amem_alloc.predict.distributed.ranks import predict_ranks

    script, out = tmp_path / "checking.py", tmp_path / "out"
    script.write_text(CHECKING)
    out.mkdir()
    chosen = launch_mod.parse_ranks(ranks, world) if ranks else None
    return out, predict_ranks(launch_mod.Launch(world, 1, chosen), [str(script), str(out)], "H100", "torch",
                              steps=1, timeout=120, workers=workers)


def _peak(rank_result) -> int:
    from amem_alloc.replay import ALLOC

    return max(size for kind, _, size, _ in rank_result.prediction.ops if kind == ALLOC)


@pytest.mark.parametrize("world,workers,ranks", [(2, 1, None), (3, 2, "all"), (3, 2, None)],
                         ids=["in-turn", "workers-after-rank-0", "first-and-last-together"])
def test_ranks_recorded_one_after_another_see_the_folder_as_ranks_started_together_would(tmp_path, world, workers,
                                                                                          ranks):
    """Before run_files.py rank 1 found everything rank 0 wrote by its end: the output folder not
    empty (HF's example scripts stop there, "the script failed"); the last rank, recorded in a
    worker at the same time as rank 0, passed the barrier before rank 0 wrote its file. Now each
    rank finds rank 0's file after the barrier that followed it, never another's file written
    after its last collective, and every file is where the script wrote it when the prediction
    ends."""
    before = _scratch()
    out, result = _ranks(tmp_path, world, workers, ranks)
    assert [(r.rank, _peak(r)) for r in result.ranks] == [(r, 64 << 20) for r in range(world)]
    recorded = [r.rank for r in result.ranks if r.recorded]
    assert sorted(os.listdir(out)) == ["after-last-collective-%d.txt" % r for r in recorded] + ["before-barrier.txt"]
    assert _scratch() == before


def test_a_prediction_of_one_run_moves_nothing(tmp_path):
    """Paths are set aside only when another run starts: a prediction of one process leaves the
    files it wrote where they are all along (the same file, not a copy put back)."""
    path = tmp_path / "out" / "log.txt"
    with run_files.level():
        run_files.run_started()
        _write(path)
        inode = os.stat(path).st_ino
        run_files.run_ended({str(tmp_path / "out"): 0, str(path): 0})
        assert os.stat(path).st_ino == inode
    assert os.stat(path).st_ino == inode
