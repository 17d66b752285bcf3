"""Threads under prediction (amem_alloc/predict/engine/threads.py). The program's own threads run
with the session's modes: their CUDA work is fake and counted. transformers 5 moves a
checkpoint's tensors to the device in a thread pool, which reached the real CUDA ("Found no
NVIDIA driver"); under prediction it loads on the program's thread, each tensor moved once."""
import sys

import pytest

from helpers import run_command

torch = pytest.importorskip("torch")

LOAD = """
import sys, torch
from transformers import LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained(sys.argv[1], device_map="cuda", dtype=torch.bfloat16)
print("device", next(model.parameters()).device)
print("allocated", torch.cuda.memory_allocated())
"""


def test_from_pretrained_onto_cuda_loads_each_weight_once(tmp_path):
    pytest.importorskip("transformers")
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


# ---------------------------------------------------------------------------- the program's own threads
MiB = 1 << 20


def test_a_tensor_made_in_the_programs_thread_is_counted():
    """It was fake but unseen: 'meta' to the thread and missing from the peak, silently."""
    import threading

    import amem_alloc

    seen = []

    def program():
        t = torch.empty(1 * MiB, device="cuda")                    # 4 MiB
        def work():
            seen.append(t.repeat(64).device)                       # 256 MiB, in the thread
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()

    prediction = amem_alloc.predict(program, gpu="H100")
    assert [d.type for d in seen] == ["cuda"]
    assert prediction.row("torch").peak_allocated == 260 * MiB


def test_a_thread_pools_work_is_counted_and_its_copies_to_the_host_run():
    """A server's pool, a plotting thread bringing a batch to the host (ultralytics)."""
    from concurrent.futures import ThreadPoolExecutor

    import amem_alloc

    shapes = []

    def program():
        weight = torch.empty(1024, 1024, device="cuda")            # 4 MiB
        def request(n):
            out = torch.ones(n, 1024, device="cuda") @ weight      # n x 4 KiB in, n x 4 KiB out
            shapes.append(tuple(out.cpu().numpy().shape))
            return out
        with ThreadPoolExecutor(2) as pool:
            held = list(pool.map(request, [1024, 2048]))           # 4 + 8 MiB kept
        return held

    prediction = amem_alloc.predict(program, gpu="H100")
    assert sorted(shapes) == [(1024, 1024), (2048, 1024)]
    assert prediction.row("torch").peak_allocated >= (4 + 12) * MiB


def test_a_thread_outliving_the_prediction_passes_its_calls_through():
    import threading

    import amem_alloc

    go, done, results = threading.Event(), threading.Event(), []

    def program():
        t = torch.empty(4, device="cuda")
        def late():
            go.wait(60)
            try:
                results.append((t + 1).shape)
            except Exception as e:   # noqa: BLE001  (the test reads what happened)
                results.append(e)
            done.set()
        threading.Thread(target=late, daemon=True).start()

    amem_alloc.predict(program, gpu="H100")
    go.set()
    assert done.wait(60)
    assert results == [torch.Size([4])]
    assert torch._C._len_torch_function_stack() == 0
