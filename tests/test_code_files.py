"""Which files are the user's (code_files.py): a package pip installed into a folder of its own
(`pip install --target DIR`, used through PYTHONPATH) is a library, as in site-packages; a
plain folder on PYTHONPATH (the user's own modules) stays the user's."""
import subprocess
import sys

from helpers import environment_without_amem, ROOT


def _ask(tmp_path, pythonpath: list) -> list:
    code = ("import sys; from amem_alloc import code_files as c; "
            "print([c.is_user_file(p) for p in sys.argv[1:]], [c.short_path(p) for p in sys.argv[1:]])")
    env = environment_without_amem()
    env["PYTHONPATH"] = ":".join([*map(str, pythonpath), str(ROOT)])
    files = [str(tmp_path / "target" / "somelib" / "core.py"), str(tmp_path / "mine" / "helpers.py")]
    out = subprocess.run([sys.executable, "-c", code, *files], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_a_package_installed_with_target_is_a_library_and_a_plain_folder_the_users(tmp_path):
    (tmp_path / "target" / "somelib").mkdir(parents=True)
    (tmp_path / "target" / "somelib" / "core.py").write_text("")
    (tmp_path / "target" / "somelib-1.0.dist-info").mkdir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "helpers.py").write_text("")
    line = _ask(tmp_path, [tmp_path / "target", tmp_path / "mine"])
    assert line.startswith("[False, True]") and "'somelib/core.py'" in line, line


def test_call_site_skips_as_many_frames_as_its_callers_ask(tmp_path, monkeypatch):
    """call_site(skip)'s count is what every note's caller relies on: 2 names the line that called
    the function asking, 3 the line above. A refactor that shifted it by a frame named "?" for a
    spawned child's CUDA use (CI, 2026-11-29)."""
    (tmp_path / "usermod.py").write_text(
        "from amem_alloc.predict.notes import call_site\n"
        "def asks(skip): return call_site(skip)\n"
        "def calls(skip): return asks(skip)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import usermod
    here = str(tmp_path / "usermod.py")
    assert usermod.calls(1) == f"{here}:2"   # call_site's own frame is amem's: passed over
    assert usermod.calls(2) == f"{here}:2"
    assert usermod.calls(3) == f"{here}:3"


def test_a_file_the_script_runs_as_a_script_is_the_programs_code(tmp_path):
    """torchtune's `tune run` runs its recipe, installed beside torchtune, with runpy.run_path: notes
    named torchtune's config wrapper as the user's line ("at torchtune/config/_parse.py:99 (via
    recipes/full_finetune_single_device.py:701)") and the recipe's line as a library's."""
    (tmp_path / "target" / "recipes").mkdir(parents=True)
    (tmp_path / "target" / "recipes-1.0.dist-info").mkdir()
    recipe = tmp_path / "target" / "recipes" / "recipe.py"
    recipe.write_text("from amem_alloc import code_files\nprint('recipe is the user\\'s:', code_files.is_user_file(__file__))\n")
    (tmp_path / "cli.py").write_text("import runpy, sys\nrunpy.run_path(sys.argv[1], run_name='__main__')\n")
    code = ("import sys; from amem_alloc.user_script import run; "
            "sys.exit(run(sys.argv[1], sys.argv[2:]))")
    env = environment_without_amem()
    env["PYTHONPATH"] = ":".join([str(tmp_path / "target"), str(ROOT)])
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cli.py"), str(recipe)], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "recipe is the user's: True" in out.stdout, out.stdout


def test_a_folder_holding_the_libraries_never_counts_as_the_programs_package(monkeypatch):
    """Counting the folder a script runs from as the program's package (runpy) would make every library
    under it the user's code where the virtual environment is inside the project (./.venv): the
    folders that are or hold a library folder never count."""
    import os
    import torch
    from amem_alloc import code_files

    monkeypatch.setattr(code_files, "_RUN_AS_PROGRAM", [])
    site = os.path.dirname(os.path.dirname(torch.__file__))
    for folder in (site, os.path.dirname(site), os.path.dirname(torch.__file__)):
        code_files.run_as_program(folder)
    assert code_files._RUN_AS_PROGRAM == [] and not code_files.is_user_file(torch.__file__)
