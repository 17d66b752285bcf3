"""What a what-if costs at run time, in words, from its JSON (predict/whatif/answers.py's "recompute"):
said the same by `amem predict`'s text and its report's verdict panel."""
from __future__ import annotations


def _flops(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e6:.1f} MFLOP"


def cost_text(w: dict) -> str:
    """What a what-if costs at run time, from its JSON."""
    r = w.get("recompute")
    if not r:
        return "no recompute"
    stack = f"{r['blocks']} blocks of {r['stack']}" + (f" in segments of {r['blocks_per_segment']}"
                                                      if r["blocks_per_segment"] > 1 else "")
    share = r["share_of_step"]
    pct = f", about +{share:.0%} of the step's compute (backward taken as 2x forward)" if share is not None else ""
    return f"recomputes up to {_flops(r['flops'])} over the predicted run ({stack}){pct}"
