"""Reports in a real headless browser (Debian's chromium, every network feature off).

`render_pages` loads several report pages in ONE chromium launch: a harness page frames them and
copies each framed page's DOM, after its script ran, into its own text. The tests use it on a
few traces; run this file to check every shared trace and to write a screenshot of each page:

    PYTHONPATH=$PWD python tests/report_browser.py OUT_DIR [TRACE ...]   # default: ../shared/traces/*

It prints one line per page (plots drawn, segments mapped, OOM panels) and exits 1 on a problem.
"""
from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--virtual-time-budget=20000"]

HARNESS = """<!DOCTYPE html><html><head><script>
function copyFrame(f, i) {{
  var pre = document.createElement("pre");
  pre.id = "page-" + i;
  try {{ pre.textContent = f.contentDocument.documentElement.outerHTML; }}
  catch (err) {{ pre.textContent = "UNREADABLE " + err; }}
  document.body.appendChild(pre);
}}
</script></head><body>{frames}</body></html>"""
# Each frame names its handler in its own onload attribute: a listener added by a script after the
# frames can miss a frame that loaded while the parser yielded (seen on a loaded CI machine).


def _chromium(args: list[str], profile: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    argv = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


def render_pages(pages: list[Path], workdir: Path) -> list[str]:
    """The DOM of each page after its script ran, from one chromium launch."""
    frames = "".join(f'<iframe onload="copyFrame(this, {i})" src="{html.escape(p.resolve().as_uri())}"></iframe>'
                     for i, p in enumerate(pages))
    harness = workdir / "harness.html"
    harness.write_text(HARNESS.format(frames=frames))
    out = _chromium(["--allow-file-access-from-files", "--dump-dom", harness.resolve().as_uri()],
                    workdir / "chromium-profile").stdout
    doms = []
    for i in range(len(pages)):
        match = re.search(rf'<pre id="page-{i}">(.*?)</pre>', out, re.S)
        if match is None:
            raise AssertionError(f"the browser never loaded {pages[i]}")
        dom = html.unescape(match.group(1))
        if dom.startswith("UNREADABLE"):
            raise AssertionError(f"{pages[i]}: {dom[:300]}")
        doms.append(dom)
    return doms


SCREEN = (1280, 900)   # the first screen: a laptop's browser window

LAYOUT_HARNESS = """<!DOCTYPE html><html><head><script>
function measure(f, i, selectors) {{
  var out = {{}}, doc = f.contentDocument;
  selectors.forEach(function (s) {{
    var e = doc.querySelector(s);
    if (e) {{ var r = e.getBoundingClientRect(); out[s] = [r.top, r.bottom, r.width]; }}
  }});
  out.scrollHeight = doc.documentElement.scrollHeight;
  var pre = document.createElement("pre");
  pre.id = "layout-" + i;
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}}
</script></head><body style="margin:0">{frames}</body></html>"""


def layout(pages: list[Path], selectors: list[list[str]], workdir: Path, screen: tuple = SCREEN) -> list[dict]:
    """Where each selector's first element lies when its page is shown in a window of `screen`
    (CSS pixels from the top: [top, bottom, width]), and the page's whole height; one launch."""
    import json

    w, h = screen
    frames = "".join(f'<iframe style="width:{w}px;height:{h}px;border:0;display:block" '
                     f'onload=\'measure(this, {i}, {html.escape(json.dumps(sel))})\' '
                     f'src="{html.escape(p.resolve().as_uri())}"></iframe>'
                     for i, (p, sel) in enumerate(zip(pages, selectors)))
    harness = workdir / "layout.html"
    harness.write_text(LAYOUT_HARNESS.format(frames=frames))
    out = _chromium(["--allow-file-access-from-files", f"--window-size={w + 40},{h}", "--dump-dom",
                     harness.resolve().as_uri()], workdir / "chromium-profile").stdout
    found = []
    for i, page in enumerate(pages):
        match = re.search(rf'<pre id="layout-{i}">(.*?)</pre>', out, re.S)
        if match is None:
            raise AssertionError(f"the browser never measured {page}")
        found.append(json.loads(html.unescape(match.group(1))))
    return found


def png_size(png: Path) -> tuple[int, int]:
    """(width, height) from a PNG's header."""
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{png} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def screenshot(page: Path, png: Path, workdir: Path, height: int = 6000) -> Path:
    _chromium([f"--window-size=1280,{height}", f"--screenshot={png}", page.resolve().as_uri()],
              workdir / "chromium-profile")
    return png


# ---------------------------------------------------------------------------- reading the DOM
def start_tag(dom: str, element_id: str) -> str:
    match = re.search(rf'<(?:div|section)[^>]*\bid="{re.escape(element_id)}"[^>]*>', dom)
    assert match, f"no element {element_id}"
    return match.group(0)


def attribute(tag: str, name: str) -> str | None:
    match = re.search(rf'\b{name}="([^"]*)"', tag)
    return match.group(1) if match else None


def svg_of(dom: str, element_id: str) -> str:
    """The <svg> inside the element with this id."""
    start = dom.index(start_tag(dom, element_id))
    return dom[dom.index("<svg", start):dom.index("</svg>", start)]


def check_page(dom: str, data: dict) -> dict:
    """Every plot of every device drawn, every segment mapped, OOM markers over the lines and their
    panels shown. Returns what it counted."""
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert attribute(body, "data-error") is None, attribute(body, "data-error")
    expected = 0
    for dev in data["devices"]:
        d = dev["device"]
        for kind, paths in (("timeline", "2"), ("fragmentation", "1")):
            tag = start_tag(dom, f"{kind}-{d}")
            assert attribute(tag, "data-drawn") == "true" and attribute(tag, "data-paths") == paths, tag
        seg = start_tag(dom, f"segmap-{d}")
        assert attribute(seg, "data-drawn") == "true"
        assert int(attribute(seg, "data-segments")) == dev["segmap"]["segments"], seg
        expected += 3
        if dev["stacked"]["bands"]:
            stacked = start_tag(dom, f"stacked-{d}")
            assert attribute(stacked, "data-bands") == str(len(dev["stacked"]["bands"])), stacked
            legend = dom[dom.index(start_tag(dom, f"stacked-legend-{d}")):]
            assert legend.count('class="band-name"') >= len(dev["stacked"]["bands"])
            expected += 1
        cats = dev.get("stacked_categories")
        if cats and cats["bands"]:
            assert attribute(start_tag(dom, f"stacked-cat-{d}"), "data-bands") == str(len(cats["bands"]))
            expected += 1
        assert start_tag(dom, f"held-{d}")
        timeline = svg_of(dom, f"timeline-{d}")
        for k, _ in enumerate(dev["ooms"]):
            assert start_tag(dom, f"oom-{d}-{k}")
            # drawn after (over) the lines, inside the plot area, with its label
            assert timeline.rindex('class="plot-line"') < timeline.index('class="oom-marker"')
            marker = timeline[timeline.index('class="oom-marker"'):]
            x = float(re.search(r'<line x1="([\d.]+)"', marker).group(1))
            assert x < 944 - 10, f"the OOM marker sits on the plot's right edge (x={x})"
            assert "OOM " in marker
    assert attribute(body, "data-plots-drawn") == str(expected)
    return {"plots": expected, "segments": sum(dev["segmap"]["segments"] for dev in data["devices"]),
            "ooms": sum(len(dev["ooms"]) for dev in data["devices"])}


def main(argv: list[str]) -> int:
    from amem_alloc import load_snapshot, write_report
    from amem_alloc.report.data import report_data

    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    from test_snapshot import shared_traces

    traces = [Path(a) for a in argv[1:]] or shared_traces()
    if not traces:
        print("no traces: pass their paths, or put them in ../shared/traces")
        return 2
    pages = [write_report(t, out / f"{t.stem}.html") for t in traces]
    doms = render_pages(pages, out)
    failed = 0
    for trace, page, dom in zip(traces, pages, doms):
        try:
            counts = check_page(dom, report_data(load_snapshot(trace), replay_ooms=False))
            png = screenshot(page, out / f"{trace.stem}.png", out)
            print(f"ok   {trace.name}: {counts['plots']} plots, {counts['segments']} segments mapped, "
                  f"{counts['ooms']} OOM panels; screenshot {png}")
        except AssertionError as err:
            failed += 1
            print(f"FAIL {trace.name}: {err}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
