"""docs/predict.md's Python example runs as written (it named methods Prediction never had:
`format_text`, `write_report`), with small stand-ins for the names it leaves to the reader."""
import os
import re

import pytest

torch = pytest.importorskip("torch")

from helpers import ROOT  # noqa: E402


def _example() -> str:
    text = (ROOT / "docs" / "predict.md").read_text()
    after = text.split("From Python, for code that builds its model and step itself:", 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_python_example_in_the_docs_runs(tmp_path, capsys):
    def train_step(model, batch):   # the reader's own: here a model and batch made on the fake device
        model = torch.nn.Linear(64, 64).cuda()
        model(torch.randn(8, 64, device="cuda")).sum().backward()

    names = {"train_step": train_step, "model": None, "batch": None,
             "build": lambda: torch.nn.Linear(64, 64),
             "step": lambda m: m(torch.randn(8, 64, device="cuda")).sum().backward()}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(_example(), "docs/predict.md", "exec"), names)
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert out.count("amem predict:") == 2, out[:500]
    assert all((tmp_path / f).stat().st_size > 0 for f in ("p.json", "p.pickle", "p.html"))
