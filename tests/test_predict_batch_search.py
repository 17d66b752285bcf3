"""Scripts that choose their batch by running out of memory (amem_alloc/predict/batch_search.py):
a prediction never runs out, so accelerate's `find_executable_batch_size` stays at the batch it
starts with and Lightning's batch size finder settles on its largest trial. Neither is modelled;
the prediction says so once, at the user's line, in its notes and, where it changes what the
verdict means, under the verdict."""
import json
import subprocess
import sys
import textwrap

import pytest

from helpers import environment_without_amem

pytest.importorskip("torch")

ACCELERATE = textwrap.dedent("""
    import torch
    from accelerate.utils import find_executable_batch_size

    model = torch.nn.Linear(4096, 4096).cuda()
    optimizer = torch.optim.AdamW(model.parameters())


    @find_executable_batch_size(starting_batch_size={batch})
    def train(batch_size):
        for step in range(3):
            model(torch.randn(batch_size, 4096, device="cuda")).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()


    train()
""")


def _predict(tmp_path, name: str, text: str, timeout=300):
    script = tmp_path / name
    script.write_text(text)
    js = tmp_path / "p.json"
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--steps", "0", "--json",
                           str(js), "--", "python", str(script)], env=environment_without_amem(), capture_output=True,
                          text=True, timeout=timeout, cwd=tmp_path)   # (Lightning's finder writes its checkpoint here)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(js.read_text())


def _verdict_tail(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("Verdict for"))
    return lines[start:]


@pytest.mark.parametrize("batch, fits", [(1 << 21, False), (8, True)])
def test_accelerates_retry_on_a_smaller_batch_is_said_with_the_batch_predicted(tmp_path, batch, fits):
    pytest.importorskip("accelerate")
    proc, data = _predict(tmp_path, "train.py", ACCELERATE.format(batch=batch))
    said = [n for n in data["notes"] if "find_executable_batch_size" in n["what"]]
    assert len(said) == 1 and said[0]["kind"] == "not-modelled", data["notes"]
    assert f"the batch it started with, {batch};" in said[0]["what"]
    assert said[0]["where"].startswith("train.py:17 (via accelerate/utils/memory.py:")
    verdict = data["verdict"]
    assert all(r["fits"] == fits for r in verdict["policies"])
    assert verdict["batch_search"] == {"what": said[0]["what"], "where": said[0]["where"], "grows": False}
    under = [line for line in _verdict_tail(proc.stdout) if line.startswith("  not modelled: accelerate's")]
    assert len(under) == (0 if fits else 1), _verdict_tail(proc.stdout)   # said under the verdict where it matters


def test_a_script_without_a_batch_search_says_none(tmp_path):
    proc, data = _predict(tmp_path, "plain.py", ACCELERATE.format(batch=8).replace(
        "@find_executable_batch_size(starting_batch_size=8)", "").replace("train()", "train(8)"))
    assert data["verdict"]["batch_search"] is None
    assert not any("never runs out" in n["what"] for n in data["notes"])


LIGHTNING = textwrap.dedent("""
    import torch
    import lightning as L
    from lightning.pytorch.tuner import Tuner
    from torch.utils.data import DataLoader, TensorDataset


    class Model(L.LightningModule):
        def __init__(self, batch_size=2):
            super().__init__()
            self.batch_size = batch_size
            self.net = torch.nn.Linear(256, 256)

        def training_step(self, batch, i):
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(1 << 12, 256)), batch_size=self.batch_size)


    model = Model()
    trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False)
    Tuner(trainer).scale_batch_size(model, mode="power", max_trials=4)
    print("batch chosen", model.batch_size)
    trainer.fit(model)
""")


def test_lightnings_batch_size_finder_is_said_once_and_the_run_goes_on(tmp_path):
    """Its trials all pass under prediction (2, 4, 8, 16: 16 chosen); the note is said once
    (not per trial), under the verdict whether or not it fits. The finder restores its checkpoint
    and tears down with `module.cpu()`, which once failed inside amem (test_predict_known.py)."""
    pytest.importorskip("lightning")
    proc, data = _predict(tmp_path, "finder.py", LIGHTNING, timeout=600)
    assert "batch chosen 16" in proc.stdout
    said = [n for n in data["notes"] if "batch size finder" in n["what"]]
    assert len(said) == 1 and said[0]["where"].startswith("finder.py:27 (via lightning/"), said
    assert data["verdict"]["batch_search"]["grows"] is True
    assert any(line.startswith("  not modelled: Lightning's batch size finder") for line in _verdict_tail(proc.stdout))
