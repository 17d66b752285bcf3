"""benchmarks/RESULTS.md is shared: each benchmark program owns one section between its own
markers and rewrites only that section, keeping everything else as it is; each section says
which processor measured it."""
from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, begin: str, end: str, section: str) -> None:
    """Writes `section` between the markers `begin` and `end` in `path` (appended if absent)."""
    block = f"{begin}\n{section}{end}\n"
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def cpu_model(default: str = "unknown") -> str:
    """The processor's model name from /proc/cpuinfo, or `default` where it names none."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return default
