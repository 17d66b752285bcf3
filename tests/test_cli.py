"""The `amem` command's demo (the README's main job) and config commands."""
import sys
from pathlib import Path

from helpers import run_command

AMEM = str(Path(sys.executable).parent / "amem")


def test_demo_runs_on_sim_and_prints_stats_and_fragmentation():
    proc = run_command([AMEM, "demo", "--steps", "5"])
    assert proc.returncode == 0, proc.stderr
    assert "sim backend" in proc.stdout
    for word in ("allocated", "reserved", "device mallocs", "fragmentation", "at the reserved peak"):
        assert word in proc.stdout


def test_demo_on_host_backend_gives_the_same_figures_as_sim():
    sim = run_command([AMEM, "demo", "--steps", "3", "--backend", "sim"]).stdout.splitlines()
    host = run_command([AMEM, "demo", "--steps", "3", "--backend", "host"]).stdout.splitlines()
    figures = lambda lines: [l for l in lines if l.startswith(("allocated", "reserved", "requested", "segments"))]
    assert figures(sim) and figures(sim) == figures(host)   # same policy, same decisions


def test_config_prints_every_option_and_the_settings_in_effect():
    proc = run_command([AMEM, "config"], env={"AMEM_CONF": "max_split_size_mb:256"})
    assert proc.returncode == 0, proc.stderr
    for name in ("max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold", "debug_checks"):
        assert name in proc.stdout
    assert "max_split_size_mb:256" in proc.stdout


def test_bad_conf_is_a_clear_error_not_a_traceback():
    proc = run_command([AMEM, "config"], env={"AMEM_CONF": "max_split_size_mb:abc"})
    assert proc.returncode == 2
    assert "bad value 'abc' for option 'max_split_size_mb'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_readme_configuration_table_matches_the_options_table():
    import amem_alloc
    from helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    for name, default, doc in amem_alloc.option_table():
        assert f"| `{name}` | {default} |" in readme, f"README's table lacks or misstates {name}"
        assert f"| {doc} |" in readme, f"README's description of {name} is out of date"
