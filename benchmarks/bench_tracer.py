"""Overhead of amem_alloc.Tracer on forward+backward of a small 12-layer transformer.

    python benchmarks/bench_tracer.py            # CPU (and the GPU too, where there is one)
    python benchmarks/bench_tracer.py --quick    # a tiny model, a few seconds: checks it runs
    python benchmarks/bench_tracer.py --device cuda --amem   # with amem as the CUDA allocator

One step = forward, loss, backward, zero_grad. Plain and traced steps alternate (plain, traced,
plain, traced, ...) after warm-up, so drift in the machine's speed hits both alike; each figure
is the median of its repetitions, and the ratio is traced median / plain median. A traced step
includes entering and leaving the Tracer (hooks installed and removed every step).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny model, few repetitions (a smoke run)")
    p.add_argument("--device", default=None, help="cpu, cuda, or both (default: cpu, plus cuda if available)")
    p.add_argument("--amem", action="store_true", help="enable amem as the CUDA allocator first")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions of each kind")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: all cores)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.d_model, args.seq, args.batch = 2, 32, 16, 2
        args.reps = args.reps or 3
    args.reps = args.reps or 15
    return args


def _model(args, device):
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(args.d_model, nhead=4, dim_feedforward=4 * args.d_model,
                                             dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=args.layers, enable_nested_tensor=False)
    return model.to(device).train()


def _step(model, x):
    loss = model(x).float().pow(2).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)


def _timed(fn, sync) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def measure(args, device) -> dict:
    import torch

    from amem_alloc import Tracer

    model = _model(args, device)
    x = torch.randn(args.batch, args.seq, args.d_model, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def traced():
        with Tracer(model):
            _step(model, x)

    for _ in range(2):  # warm-up: allocator caches, kernels, dispatch caches
        _step(model, x)
        traced()
    plain_t, traced_t = [], []
    for _ in range(args.reps):
        plain_t.append(_timed(lambda: _step(model, x), sync))
        traced_t.append(_timed(traced, sync))
    plain, trace = statistics.median(plain_t), statistics.median(traced_t)
    return {"device": device, "plain_ms": plain * 1e3, "traced_ms": trace * 1e3, "ratio": trace / plain}


def _devices(args) -> list[str]:
    import torch

    if args.device in ("cpu", "cuda"):
        return [args.device]
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def main(argv=None) -> int:
    args = _parse(argv)
    if args.amem:
        import amem_alloc

        amem_alloc.enable()
    import torch

    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    print(f"amem Tracer overhead: {args.layers}-layer transformer encoder, d_model {args.d_model}, "
          f"seq {args.seq}, batch {args.batch}, {args.reps} alternating repetitions (median)")
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"{torch.get_num_threads()} torch threads"
          + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"))
    print(f"{'device':<8} {'plain ms':>10} {'traced ms':>10} {'ratio':>7}")
    for device in _devices(args):
        r = measure(args, device)
        label = device + (" (amem)" if device == "cuda" and args.amem else "")
        print(f"{label:<8} {r['plain_ms']:>10.2f} {r['traced_ms']:>10.2f} {r['ratio']:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
