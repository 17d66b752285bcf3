"""bitsandbytes' paged optimizers under prediction (amem_alloc/predict/engine/bitsandbytes_paged.py):
their state in CUDA managed memory is counted as allocated on the GPU and said so; before, the
library's C code asked the driver for managed memory and ended the process with no prediction.
bitsandbytes is not a dependency of amem: these tests skip where it is not installed."""
import json
import sys
import textwrap

import pytest

from helpers import run_command

pytest.importorskip("torch")
pytest.importorskip("bitsandbytes")

SCRIPT = textwrap.dedent("""
    import torch
    import bitsandbytes as bnb

    m = torch.nn.Linear(1024, 1024, bias=False).cuda()    # 1,048,576 elements: paged (>= 100,000)
    opt = bnb.optim.PagedAdamW8bit(m.parameters())
    for _ in range(2):
        m(torch.randn(8, 1024, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    print("state", sorted((k, tuple(v.shape), str(v.dtype), getattr(v, "is_paged", False))
                          for k, v in opt.state[m.weight].items() if torch.is_tensor(v) and v.dim()))
""")


def test_a_paged_8bit_adamw_state_is_counted_on_the_gpu_and_noted(tmp_path):
    """PagedAdamW8bit (torchtune's single-device default): two uint8 states of the weight's size,
    each paged, as bitsandbytes makes them (`is_paged`), counted on the GPU, and one note per call
    site naming managed memory with the bytes of one buffer; the blockwise absmax states
    (float32, one per 256 elements) are ordinary allocations."""
    script = tmp_path / "paged.py"
    script.write_text(SCRIPT)
    out = tmp_path / "p.json"
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--json", str(out),
                        "--", "python", str(script)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = next(line for line in proc.stdout.splitlines() if line.startswith("state ["))
    for entry in ("('state1', (1024, 1024), 'torch.uint8', True)", "('state2', (1024, 1024), 'torch.uint8', True)",
                  "('absmax1', (4096,), 'torch.float32', False)", "('absmax2', (4096,), 'torch.float32', False)"):
        assert entry in state, state
    data = json.loads(out.read_text())
    paged = [n for n in data["notes"] if n["what"].startswith("bitsandbytes paged optimizer state")]
    assert len(paged) == 1 and paged[0]["kind"] == "not-modelled" and paged[0]["count"] == 2, paged
    assert paged[0]["bytes"] == 1024 * 1024, paged
    assert data["policies"][0]["peak_allocated"] >= 2 * 1024 * 1024 + 2 * 4096 * 4 + 4 * 1024 * 1024
