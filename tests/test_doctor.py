"""amem is never silently off: an editable install now carries the start-up hook that makes
AMEM_ENABLE and AMEM_TRACE act in any process, `import amem_alloc` says when AMEM_ENABLE=1 is set
but the hook did not run, and `amem doctor` reports what is installed, which torch, whether the
hook is active, and whether a GPU and its virtual memory management are usable."""
import io
import subprocess
import sys
import zipfile

import pytest

from amem_alloc import __version__, doctor

from helpers import ROOT, environment_without_amem, run_python


def run_doctor():
    out = io.StringIO()
    rc = doctor.main(out)
    return rc, out.getvalue()


def test_doctor_reports_the_package_the_hook_torch_and_the_gpu(monkeypatch):
    for name in doctor.ENV:
        monkeypatch.delenv(name, raising=False)
    rc, text = run_doctor()
    lines = text.splitlines()
    assert lines[0].startswith(f"ok   amem_alloc {__version__} from ") and "extension _C" in lines[0]
    assert any("start-up hook" in ln for ln in lines)
    assert any(ln.startswith("ok   torch ") and "pluggable allocator API is there" in ln for ln in lines)
    assert any("GPU" in ln for ln in lines)
    assert (rc == 0) == text.rstrip().endswith("no problem found")


def test_doctor_flags_amem_enable_without_the_hook(monkeypatch):
    monkeypatch.setattr(doctor, "hook_path", lambda: None)
    monkeypatch.setenv("AMEM_ENABLE", "1")
    rc, text = run_doctor()
    bad = [ln for ln in text.splitlines() if ln.startswith("!!")]
    assert rc == 1 and len(bad) == 1 and "start-up hook amem_alloc_autoenable.pth is not installed" in bad[0]
    assert "pip install --no-build-isolation -e ." in bad[0]


def test_doctor_flags_bad_trace_and_conf_settings(monkeypatch):
    monkeypatch.setenv("AMEM_TRACE", "t.pickle")
    monkeypatch.setenv("AMEM_TRACE_FLUSH", "soon")
    monkeypatch.setenv("AMEM_CONF", "max_split_size_mb:5")
    rc, text = run_doctor()
    bad = [ln for ln in text.splitlines() if ln.startswith("!!")]
    assert rc == 1 and any("AMEM_TRACE_FLUSH" in ln for ln in bad) and any("max_split_size_mb" in ln for ln in bad)


def test_doctor_is_a_verb_of_amem():
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "doctor"], capture_output=True, text=True,
                          timeout=120, env=environment_without_amem(),
                          cwd=ROOT)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr
    assert f"amem_alloc {__version__} from" in proc.stdout and "found" in proc.stdout


def test_import_says_when_amem_enable_is_ignored():
    proc = run_python("""
        import os
        os.environ["AMEM_ENABLE"] = "1"     # set after start-up: the hook never saw it
        import amem_alloc
        print("enabled", amem_alloc.is_enabled())
    """)
    assert "enabled False" in proc.stdout
    assert proc.stderr.strip().splitlines() == [
        "amem: AMEM_ENABLE=1 is ignored in this process: the start-up hook (amem_alloc_autoenable.pth) did not run, "
        "so amem is torch's allocator only if the script calls amem_alloc.enable() or runs under `amem run`; "
        "`amem doctor` says how to install the hook"]


@pytest.mark.skipif(doctor.hook_path() is None, reason="the start-up hook is not installed in this environment")
def test_with_the_hook_installed_import_says_nothing():
    proc = run_python("import amem_alloc; print('enabled', amem_alloc.is_enabled())", env={"AMEM_ENABLE": "1"})
    assert "enabled True" in proc.stdout and proc.stderr.strip() == "", proc.stderr


def test_an_editable_wheel_carries_the_start_up_hook(tmp_path):
    """PEP 660's build_editable (what `pip install -e .` calls): its wheel once held only the editable
    finder, so AMEM_ENABLE did nothing and said nothing; now the hook is at the wheel's root."""
    pytest.importorskip("pybind11")
    code = ("import sys; from setuptools import build_meta; "
            f"print(build_meta.build_editable({str(tmp_path)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = tmp_path / proc.stdout.strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    assert "amem_alloc_autoenable.pth" in names, names
    assert zipfile.ZipFile(wheel).read("amem_alloc_autoenable.pth") == (ROOT / "amem_alloc" /
                                                                        "amem_alloc_autoenable.pth").read_bytes()
