"""Checkpoints under prediction: torch.load(..., map_location="cuda") makes one CUDA storage per
saved storage (torch.storage._to: torch.UntypedStorage(nbytes, device="cuda"), which the caching
allocator rounds up to 512 bytes), and torch.save names a fake CUDA storage's device as CUDA's, so
loading the file back brings it to CUDA as a GPU run's checkpoint does."""
import re
import sys

import pytest

from helpers import run_command

torch = pytest.importorskip("torch")

SCRIPT = """
import sys
import torch

path = sys.argv[1]
w = torch.randn(1000, 1000)
torch.save({"w": w, "row": w[3], "b": torch.arange(10), "h": [torch.ones(300, dtype=torch.bfloat16)]}, path + ".cpu")

def loaded(location):
    before = torch.cuda.memory_allocated()
    ck = torch.load(path + ".cpu", map_location=location)
    grew = torch.cuda.memory_allocated() - before
    print("loaded", repr(location), grew, ck["w"].device, ck["row"].device, ck["h"][0].dtype,
          ck["row"].untyped_storage().nbytes())
    return ck

for location in ("cuda", torch.device("cuda:0"), {"cpu": "cuda:0"}):
    loaded(location)
ck = loaded(lambda storage, where: storage.cuda())
model = torch.nn.Linear(1000, 1000).cuda()
model.load_state_dict({"weight": ck["w"], "bias": ck["w"][0]})
torch.save(model.state_dict(), path + ".cuda")
before = torch.cuda.memory_allocated()
back = torch.load(path + ".cuda")
print("back", back["weight"].device, torch.cuda.memory_allocated() - before)
seen = []
torch.load(path + ".cuda", map_location=lambda storage, where: seen.append(where) or storage)
print("where", *seen)
"""


def test_a_checkpoint_loads_onto_cuda_one_storage_each_and_saves_as_cuda(tmp_path):
    script = tmp_path / "checkpoint.py"
    script.write_text(SCRIPT)
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--", "python", str(script),
                        str(tmp_path / "ck")], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("loaded")]
    assert len(lines) == 4, proc.stdout
    # w and its row share one storage (4,000,000 bytes -> 4,000,256); arange(10): 80 -> 512; 300 bf16: 600 -> 1024
    expected = [str(4_000_256 + 512 + 1024), "cuda:0", "cuda:0", "torch.bfloat16", "4000000"]
    assert all(line[-5:] == expected for line in lines), lines
    # saved from fake CUDA tensors: loaded back to CUDA (weight 4,000,256 + bias 4,000 -> 4,096) ...
    assert "back cuda:0 4004352" in proc.stdout, proc.stdout
    # ... because the file names CUDA as a GPU run's does (map_location sees each storage's location)
    assert "where cuda:0 cuda:0" in proc.stdout, proc.stdout
    assert not (tmp_path / "ck.cuda").exists()   # saved from fake tensors: removed as the prediction ended


SAFETENSORS = """
import sys
import torch
from safetensors.torch import load_file, save_file

model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 10)).cuda().to(torch.bfloat16)
save_file(dict(model.state_dict()), sys.argv[1])
print("saved", sorted((k, tuple(v.shape), str(v.dtype), bool(v.any())) for k, v in load_file(sys.argv[1]).items()))
before = torch.cuda.memory_allocated()
back = load_file(sys.argv[1], device="cuda")
print("loaded", sorted((k, tuple(v.shape), str(v.device)) for k, v in back.items()), torch.cuda.memory_allocated() - before)
"""


def test_a_safetensors_file_of_fake_tensors_is_written_whole(tmp_path):
    """safetensors reads each tensor's bytes from its address; a fake tensor's is no memory of the
    process (this crashed it: a segmentation fault in diffusers' save_pretrained). The file holds
    zeros of the right shapes and dtypes (read back by the script), and is said to."""
    pytest.importorskip("safetensors")
    script, path = tmp_path / "save.py", tmp_path / "model.safetensors"
    script.write_text(SAFETENSORS)
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--", "python", str(script),
                        str(path)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (note,) = [line for line in proc.stdout.splitlines() if "safetensors save of fake tensors" in line]
    assert "their values are zeros" in note and not re.search(r" x\d+$", note), note   # once a save, not once a tensor
    saved = next(line for line in proc.stdout.splitlines() if line.startswith("saved"))
    assert saved == "saved " + str(sorted([("0.weight", (1000, 1000), "torch.bfloat16", False),
                                           ("0.bias", (1000,), "torch.bfloat16", False),
                                           ("1.weight", (10, 1000), "torch.bfloat16", False),
                                           ("1.bias", (10,), "torch.bfloat16", False)])), saved
    assert not path.exists()   # removed as the prediction ended (saved_files.py)
    # loaded back onto CUDA: one storage each (2,000,000 -> 2,000,384; 2,000 -> 2,048; 20,000 -> 20,480; 20 -> 512)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("loaded"))
    assert line.split()[-1] == str(2_000_384 + 2_048 + 20_480 + 512), line


def test_an_optimizer_resumed_from_a_real_checkpoint_on_cuda_reads_its_step(tmp_path):
    """accelerate resumes with map_location="cuda": AdamW's `step` became a fake CUDA tensor read
    as the stand-in 0, and its bias correction divided by zero (ZeroDivisionError, read as the
    script's failure). A small storage moved to CUDA keeps its bytes as a known value, and the
    tensor torch.load builds on it (`set_`) reads them."""
    import amem_alloc

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    torch.save(opt.state_dict(), tmp_path / "opt.pt")   # a real run's, on the CPU: step 1
    steps = []

    def resume():
        m = torch.nn.Linear(4, 4).cuda()
        o = torch.optim.AdamW(m.parameters(), lr=1e-3)
        o.load_state_dict(torch.load(tmp_path / "opt.pt", map_location="cuda"))
        steps.append(o.state_dict()["state"][0]["step"].item())
        m(torch.randn(2, 4, device="cuda")).sum().backward()
        o.step()
        steps.append(o.state_dict()["state"][0]["step"].item())

    result = amem_alloc.predict(resume, gpu="H100", policies=["torch"])
    assert steps == [1.0, 2.0]
    assert not [n for n in result.notes if "item()" in n["what"]], result.notes
