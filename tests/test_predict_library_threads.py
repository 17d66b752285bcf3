"""Libraries that would do CUDA work in threads of their own (amem_alloc/predict/engine/
library_threads.py): transformers 5 moves a checkpoint's tensors to the device in a thread pool,
where the session's thread-local modes are not, and reached the real CUDA ("Found no NVIDIA
driver"); under prediction it loads on the program's thread, each tensor moved once."""
import sys

import pytest

from helpers import run_command

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LOAD = """
import sys, torch
from transformers import LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained(sys.argv[1], device_map="cuda", dtype=torch.bfloat16)
print("device", next(model.parameters()).device)
print("allocated", torch.cuda.memory_allocated())
"""


def test_from_pretrained_onto_cuda_loads_each_weight_once(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "tiny")
    # what CUDA's caching allocator holds once the model is on the GPU: one block per weight of the
    # checkpoint and per buffer (the rotary embedding's inverse frequencies), each rounded up to 512 bytes
    tensors = [*model.parameters(), *model.buffers()]
    weights = sum(-(-t.numel() * t.element_size() // 512) * 512 for t in tensors)
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--", "python", str(script),
                        str(tmp_path / "tiny")], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "device cuda:0" in proc.stdout
    assert f"allocated {weights}" in proc.stdout, (weights, proc.stdout[:400])
