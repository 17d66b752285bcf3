"""`nvidia-smi` under prediction: where the machine has none, a stand-in answers for the predicted
cards, and each run of it is noted at the user's line.

Design note
-----------
Training scripts log `nvidia-smi`'s table (modded-nanogpt's train_gpt.py runs it at start) or
query it to pick a card (`--query-gpu=memory.free --format=csv`). With no GPU here there is no
nvidia-smi, and such a script would stop with FileNotFoundError where on the card it runs on. So
while a prediction runs (`install`, from the CUDA shims' patch set):

* where no `nvidia-smi` is found on PATH, a folder holding one is put first on PATH: a two-line
  shell script running nvidia_smi_standin.py (the standard library only) with this interpreter;
  the predicted cards go to it in $AMEM_NVIDIA_SMI_CARDS. Children (torchrun's ranks) inherit
  both; a rank finding the stand-in on PATH uses it. A machine with its own nvidia-smi keeps it
  (it answers for its own cards, as it would for the script).
* the process's audit events (patching.py's `listen`) show the script start it
  (`subprocess.Popen`, `os.system`, `os.exec*`, `os.posix_spawn`), noted as a stand-in at the
  user's line.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from ...patching import PatchSet, declare
from .. import notes, scratch

PROGRAM = "nvidia-smi"
CARDS_ENV = "AMEM_NVIDIA_SMI_CARDS"
SCRATCH_KIND = "nvidia-smi"
FOLDER_PREFIX = f"{scratch.PREFIX}{SCRATCH_KIND}-"
STANDIN = Path(__file__).with_name("nvidia_smi_standin.py")
NOTE = ("nvidia-smi: amem's stand-in answered for the predicted cards, idle (this machine has no "
        "nvidia-smi); its figures are not the run's")
PATH_CHANGE = declare("os.environ", "PATH", "a folder with a stand-in nvidia-smi first, where the machine has none")
CARDS_CHANGE = declare("os.environ", CARDS_ENV, "the cards the stand-in nvidia-smi answers for")
STARTS = declare("the process's audit events", "subprocess.Popen, os.system, os.exec, os.posix_spawn, os.spawn",
                 "a run of the stand-in nvidia-smi is noted at the script's line")
_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn")


def install(patches: PatchSet, gpu: Any, device_count: int) -> None:
    """The stand-in on PATH (where the machine has no nvidia-smi) and its runs noted, until `patches` close."""
    if os.name != "posix":
        return
    found = shutil.which(PROGRAM)
    if found is not None and not Path(found).parent.name.startswith(FOLDER_PREFIX):
        return   # the machine's own
    if found is None:
        folder = Path(scratch.make(SCRATCH_KIND))
        patches.callback(shutil.rmtree, folder, True)
        _write_program(folder / PROGRAM)
        patches.setenv(PATH_CHANGE, "PATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PATH")])))
        cards = {"name": gpu.name, "total_mib": gpu.total_memory >> 20, "count": device_count,
                 "capability": "{}.{}".format(*gpu.capability)}
        patches.setenv(CARDS_CHANGE, CARDS_ENV, json.dumps(cards))
    patches.listen(STARTS, _EVENTS, _on_event)


def _write_program(path: Path) -> None:
    path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S {shlex.quote(str(STANDIN))} \"$@\"\n")
    path.chmod(0o755)


def _on_event(event: str, args: tuple) -> None:
    if _runs_it(event, args):
        notes.record(notes.STAND_IN, NOTE, where=notes.call_site(3))


def _runs_it(event: str, args: tuple) -> bool:
    """Whether the program started is nvidia-smi (by name, or in a shell's command line)."""
    if event == "os.system":
        command = args[0]
        return PROGRAM in (command.decode(errors="replace") if isinstance(command, bytes) else str(command))
    argv = args[1] if len(args) > 1 else None
    words = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else list(argv or [])
    words = [os.fsdecode(w) if isinstance(w, (bytes, os.PathLike)) else str(w) for w in words]
    if not words:
        return False
    if os.path.basename(words[0]) == PROGRAM:
        return True
    return os.path.basename(words[0]) in ("sh", "bash", "dash") and any(PROGRAM in w for w in words[1:])
