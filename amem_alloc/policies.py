"""Allocator policies by name: the one table that `amem replay` and `amem compare` read.

Design note
-----------
A policy is a real configuration of the C++ core (an AMEM_CONF string), never Python-side
logic, so the same name means the same decisions in a replay on the sim backend and on a GPU.
Names starting with "torch" are PyTorch's own allocator on a GPU (the conf string goes into
PYTORCH_CUDA_ALLOC_CONF, whose syntax AMEM_CONF shares); without a GPU the core emulates them,
which is faithful because amem's defaults are torch's policy (docs/torch_policy.md). The other
names run amem (AMEM_ENABLE=1, AMEM_POLICY=amem-defaults, AMEM_CONF=conf: the conf string
is always relative to the core's defaults, which are torch's policy). `conf:<AMEM_CONF string>` names an ad-hoc amem
configuration, e.g. `conf:max_split_size_mb:256`.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from . import _C

CONF_PREFIX = "conf:"

# name -> (AMEM_CONF string, what it is and why it is here)
POLICIES: dict[str, tuple[str, str]] = {
    "torch": ("", "PyTorch's native caching allocator, default settings (2 MiB / 20 MiB segments, "
                  "best fit per stream, split and merge)"),
    "torch-expandable": ("expandable_segments:True", "PyTorch's allocator with expandable_segments:True: one "
                         "segment per stream and pool that grows in 2 MiB / 20 MiB pages"),
    "amem": ("expandable_segments:True,cross_stream_reuse:handover,large_page_mb:10,fine_pages_mb:128,"
             "map_ahead:2,page_reclaim_age:4,page_reclaim_min_mb:32", "amem's policy, what amem_alloc.enable() uses: "
             "expandable segments whose large pool grows by 2 MiB pages over its first 128 MiB (where steady "
             "growth by equal tensors under 10 MiB maps room for two more at once) and by 10 MiB "
             "pages after; a block freed on one stream serves another at once (the consumer waits on the freeing "
             "stream's event, no host sync); and before a request of 32 MiB or more maps new pages above the "
             "peak, idle free pages are unmapped first (one device sync); the combination that measured best on "
             "the shared traces, the workloads and their predicted programs (docs/policies.md)"),
    "amem-noahead": ("expandable_segments:True,cross_stream_reuse:handover,large_page_mb:10,fine_pages_mb:128,"
                     "page_reclaim_age:4,page_reclaim_min_mb:32", "the amem policy before map_ahead (every growth "
                     "of the fine part maps exactly what the request needs)"),
    "amem-coarse": ("expandable_segments:True,cross_stream_reuse:handover,large_page_mb:10,page_reclaim_age:4,"
                    "page_reclaim_min_mb:32", "the amem policy before fine pages (10 MiB pages from a "
                    "segment's start)"),
    "amem-noreclaim": ("expandable_segments:True,cross_stream_reuse:handover,large_page_mb:10", "the amem policy "
                       "before page reclaim (10 MiB pages and cross-stream handover)"),
    "amem-defaults": ("", "amem with its option defaults, which are torch's policy: the same decisions, plus "
                      "amem's accounting"),
    "amem-roundup4": ("roundup_power2_divisions:4", "amem rounding each request up to the next quarter of its "
                      "power-of-two interval, so varying shapes reuse the same block sizes"),
    "amem-expandable-roundup4": ("expandable_segments:True,roundup_power2_divisions:4", "both: one growing "
                                 "segment per stream and pool, and quarter-power-of-two size classes"),
    # amem's mechanisms, each on its own (csrc/core/options.h documents each option)
    "amem-xstream-wait": ("cross_stream_reuse:wait", "torch's policy, plus: a block freed on one stream serves "
                          "another once the freeing stream's event completed"),
    "amem-xstream-handover": ("cross_stream_reuse:handover", "torch's policy, plus: a block freed on one stream "
                              "serves another at once, that stream made to wait on the freeing one"),
    "amem-expandable-xstream": ("expandable_segments:True,cross_stream_reuse:handover", "expandable segments "
                                "with cross-stream handover"),
    "amem-pages2": ("expandable_segments:True,large_page_mb:2", "expandable segments whose large pool grows "
                    "and shrinks by 2 MiB pages instead of 20 MiB"),
    "amem-onepool": ("expandable_segments:True,large_page_mb:2,small_pool:False", "2 MiB pages, and small "
                     "requests share the large pool's pages instead of a separate 2 MiB-page pool"),
    "amem-fine": ("expandable_segments:True,fine_pages_mb:128", "expandable segments whose large pool maps "
                  "its first 128 MiB in 2 MiB pages and 20 MiB pages after (the page grows with the segment)"),
    "amem-reclaim": ("expandable_segments:True,page_reclaim_age:0", "expandable segments that unmap idle free "
                     "pages before mapping new ones"),
}
DEFAULT_COMPARE = ("torch", "torch-expandable", "amem", "amem-roundup4", "amem-expandable-roundup4")


@dataclass(frozen=True)
class Policy:
    name: str
    conf: str          # AMEM_CONF (or PYTORCH_CUDA_ALLOC_CONF for native policies)
    description: str

    @property
    def native(self) -> bool:
        """On a GPU, whether this is torch's own allocator rather than amem."""
        return self.name == "torch" or self.name.startswith("torch-")


def get(name: str) -> Policy:
    """The policy called `name`, or an ad-hoc `conf:<AMEM_CONF>`; ValueError naming the choices."""
    if name.startswith(CONF_PREFIX):
        conf = name[len(CONF_PREFIX):]
        _C.canonical_config(conf)  # raises ValueError naming the bad key or value
        return Policy(name, conf, f"amem with AMEM_CONF={conf!r}")
    if name not in POLICIES:
        near = difflib.get_close_matches(name, list(POLICIES), n=1)  # near_names.py's wording; a leaf imports no unit
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"unknown policy {name!r}{hint}; choose one of {', '.join(POLICIES)} "
                         f"or {CONF_PREFIX}<AMEM_CONF string>")
    conf, description = POLICIES[name]
    return Policy(name, conf, description)


def parse_list(text: str) -> list[Policy]:
    """'torch,amem' -> policies; 'all' -> every named policy. Ad-hoc confs may contain commas,
    so a `conf:` entry must come last and takes the rest of the text."""
    if text.strip() == "all":
        return [get(n) for n in POLICIES]
    head, sep, tail = text.partition(CONF_PREFIX)
    names = [n.strip() for n in head.split(",") if n.strip()]
    out = [get(n) for n in names]
    if sep:
        out.append(get(CONF_PREFIX + tail))
    if not out:
        raise ValueError("no policy given")
    return out


def from_settings(settings: dict | None, expandable: bool = False) -> Policy:
    """The policy that emulates a native run, from a snapshot's `allocator_settings` (torch's
    settings dict; missing in older files) and whether its trace mapped expandable segments."""
    settings = settings or {}
    parts = []
    if settings.get("expandable_segments") or expandable:
        parts.append("expandable_segments:True")
    mss = settings.get("max_split_size", -1)
    if isinstance(mss, int) and 0 < mss < 1 << 62:
        parts.append(f"max_split_size_mb:{mss >> 20}")
    divisions = settings.get("roundup_power2_divisions") or {}
    if isinstance(divisions, dict) and any(divisions.values()):
        parts.append("roundup_power2_divisions:[" + ",".join(f"{k}:{v}" for k, v in divisions.items()) + "]")
    conf = ",".join(parts)
    for name, (known, _) in POLICIES.items():
        if known == conf and name.startswith("torch"):
            return get(name)
    return get(CONF_PREFIX + conf)


def describe() -> str:
    """The table as text, for `amem replay --help` and docs."""
    width = max(len(n) for n in POLICIES)
    return "\n".join(f"{n:<{width}}  {conf or '(defaults)':<52} {desc}" for n, (conf, desc) in POLICIES.items())
