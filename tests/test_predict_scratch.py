"""Scratch folders: named by the process that made them, and those of ended processes removed."""
from __future__ import annotations

import os
import subprocess
import sys

from amem_alloc.predict import scratch


def _ended_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_runs_folders_are_removed_and_a_live_ones_kept(tmp_path):
    dead, live = _ended_pid(), os.getpid()
    gone = tmp_path / f"amem-children-{dead}-abc"
    gone.mkdir()
    (gone / "report.json").write_text("{}")
    kept = tmp_path / f"amem-children-{live}-def"
    kept.mkdir()
    other_kind = tmp_path / f"amem-saved-{dead}-ghi"
    other_kind.mkdir()
    unnamed = tmp_path / "amem-children-xyz"
    unnamed.mkdir()
    assert scratch.remove_orphans("children", str(tmp_path)) == [str(gone)]
    assert not gone.exists() and kept.exists() and other_kind.exists() and unnamed.exists()


def test_a_file_or_link_by_that_name_is_left(tmp_path):
    dead = _ended_pid()
    (tmp_path / f"amem-saved-{dead}-file").write_text("x")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / f"amem-saved-{dead}-link").symlink_to(target)
    assert scratch.remove_orphans("saved", str(tmp_path)) == []
    assert target.exists()


def test_make_names_the_folder_by_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    folder = scratch.make("nvidia-smi")
    assert os.path.basename(folder).startswith(f"amem-nvidia-smi-{os.getpid()}-") and os.path.isdir(folder)
