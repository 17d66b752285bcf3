"""Sparse tensors on the GPU are amem's stated limit (engine/storages.py, refuse_sparse): a fake
tensor is a dense meta storage, so a sparse gradient (nn.Embedding/EmbeddingBag(sparse=True)), a
conversion or a constructor on CUDA stops the prediction with one line naming the user's line and
what to change, not torch's "Cannot access storage of SparseTensorImpl" read as amem's bug. The
user's own CPU sparse tensors run as they do."""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict.notes import NotModelledError  # noqa: E402

from helpers import ROOT, environment_without_amem  # noqa: E402


def _sparse_gradient():
    emb = torch.nn.EmbeddingBag(1000, 16, mode="sum", sparse=True).cuda()
    idx = torch.randint(0, 1000, (64,), device="cuda")
    emb(idx, torch.arange(0, 64, 16, device="cuda")).sum().backward()


def _conversion():
    torch.randn(8, 8, device="cuda").to_sparse()


def _constructor():
    torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2), device="cuda")


@pytest.mark.parametrize("program", [_sparse_gradient, _conversion, _constructor])
def test_a_sparse_tensor_on_the_gpu_stops_with_amems_line_at_the_users_line(program):
    with pytest.raises(NotModelledError, match="sparse tensors on the GPU") as raised:
        amem_alloc.predict(program, gpu="H100")
    assert os.path.basename(raised.value.where).startswith("test_predict_sparse.py:"), raised.value.where


def test_the_users_cpu_sparse_tensors_run_as_they_do():
    def program():
        x = torch.randn(4, 4).to_sparse()
        assert x.is_sparse and torch.sparse.mm(x, torch.eye(4)).shape == (4, 4)
        torch.empty(256, device="cuda")

    assert amem_alloc.predict(program, gpu="H100").row("torch").peak_allocated == 1024


def test_the_command_line_says_it_in_one_line_with_status_4(tmp_path):
    script = tmp_path / "emb.py"
    script.write_text(textwrap.dedent("""\
        import torch
        emb = torch.nn.Embedding(1000, 16, sparse=True).cuda()
        emb(torch.randint(0, 1000, (64,), device="cuda")).sum().backward()
    """))
    env = environment_without_amem()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--", "python", str(script)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr and "please report" not in proc.stderr
    assert f"{script}:3: sparse tensors on the GPU" in proc.stderr.strip().splitlines()[-1], proc.stderr
