"""A predicted script that runs `nvidia-smi` on a machine with none gets a stand-in answering for
the predicted cards (shims/nvidia_smi.py), noted at the script's line; a machine's own nvidia-smi
is left to answer; the stand-in's answers are nvidia-smi's formats (nvidia_smi_standin.py)."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict.shims import nvidia_smi  # noqa: E402

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the stand-in is a POSIX shell script")


def _standin(*args, count=2):
    cards = {"name": "NVIDIA H100 80GB HBM3", "total_mib": 81082, "capability": "9.0", "count": count}
    env = dict(os.environ, **{nvidia_smi.CARDS_ENV: json.dumps(cards)})
    return subprocess.run([sys.executable, "-I", "-S", str(nvidia_smi.STANDIN), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_standin_answers_a_query_as_nvidia_smi_formats_it():
    out = _standin("--query-gpu=index,name,memory.used,memory.free", "--format=csv")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["index, name, memory.used [MiB], memory.free [MiB]",
                                       "0, NVIDIA H100 80GB HBM3, 0 MiB, 81082 MiB",
                                       "1, NVIDIA H100 80GB HBM3, 0 MiB, 81082 MiB"]
    out = _standin("--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "1")
    assert out.stdout.split() == ["81082"]
    assert _standin("-L").stdout.count("GPU ") == 2
    assert "81082MiB" in _standin().stdout   # the table


def test_the_standin_refuses_a_field_nvidia_smi_does_not_know_and_says_what_it_does_not_answer():
    out = _standin("--query-gpu=memory.fre", "--format=csv")
    assert out.returncode == 2 and 'Field "memory.fre" is not a valid field' in out.stderr
    out = _standin("topo", "-m")
    assert out.returncode == 0 and out.stdout == "" and "topo -m" in out.stderr


def _logs_the_machine():
    table = subprocess.run(["nvidia-smi"], stdout=subprocess.PIPE, text=True, check=True).stdout
    free = subprocess.check_output("nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits",
                                   shell=True, text=True)
    torch.zeros(1 << 20, device="cuda")
    return table, free


def test_a_script_running_nvidia_smi_on_a_machine_without_one_is_answered_for_the_predicted_card(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))   # no nvidia-smi there
    got = {}
    prediction = amem_alloc.predict(lambda: got.update(zip(("table", "free"), _logs_the_machine())), gpu="H100")
    assert "NVIDIA H100 80GB HBM3" in got["table"] and "stand-in" in got["table"]
    assert int(got["free"]) == prediction.gpu.total_memory >> 20
    standins = [n for n in prediction.notes if n["what"] == nvidia_smi.NOTE]
    assert len(standins) == 2 and all(n["kind"] == "stand-in" for n in standins), prediction.notes
    lines = {n["where"].rsplit(":", 1)[1] for n in standins}
    first = _logs_the_machine.__code__.co_firstlineno
    assert lines == {str(first + 1), str(first + 2)}
    assert os.environ["PATH"] == str(tmp_path) and nvidia_smi.CARDS_ENV not in os.environ   # given back


def test_the_machines_own_nvidia_smi_answers_and_nothing_is_noted(monkeypatch, tmp_path):
    own = tmp_path / "nvidia-smi"
    own.write_text("#!/bin/sh\necho the machine owns one\n")
    own.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    got = []
    prediction = amem_alloc.predict(
        lambda: got.append(subprocess.run(["nvidia-smi"], stdout=subprocess.PIPE, text=True).stdout), gpu="H100")
    assert got == ["the machine owns one\n"]
    assert not [n for n in prediction.notes if n["what"] == nvidia_smi.NOTE]


def test_the_standins_folder_is_removed_when_the_prediction_ends(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None   # tempfile reads TMPDIR again
    try:
        seen = []
        amem_alloc.predict(lambda: seen.append(os.environ["PATH"].split(os.pathsep)[0]), gpu="H100")
    finally:
        tempfile.tempdir = None
    assert os.path.basename(seen[0]).startswith(nvidia_smi.FOLDER_PREFIX)
    assert not os.path.exists(seen[0])
