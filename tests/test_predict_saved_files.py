"""Checkpoints a predicted script saves (amem_alloc/predict/engine/saved_files.py): a save of fake
tensors never overwrites a file that was there before the prediction (a real run's checkpoint in
the same folder): it goes to a scratch copy, which later loads of that path read, and the output
says so; a new path is written where the script names it, noted; real data is saved as it is."""
from __future__ import annotations

import glob
import os
import shutil
import tempfile

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict.engine import saved_files  # noqa: E402


def _notes(result) -> list[str]:
    return [n["what"] for n in result.notes if n["kind"] == "stand-in"]


def _saved_bytes(obj) -> bytes:
    """torch.save into a buffer, as ultralytics and Lightning save a checkpoint before writing it."""
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _model_state():
    model = torch.nn.Linear(64, 32).cuda()
    return model, {"model": model.state_dict(), "step": 3}


def test_a_checkpoint_that_was_there_is_untouched_and_loads_read_the_copy(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"a real run's checkpoint")
    seen = {}

    def train():
        model, state = _model_state()
        torch.save(state, path)
        back = torch.load(path, map_location="cuda")
        seen["keys"], seen["shape"] = sorted(back["model"]), tuple(back["model"]["weight"].shape)
        seen["on"], seen["size"] = back["model"]["weight"].device.type, os.path.getsize(path)

    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "amem-saved-*")))
    result = amem_alloc.predict(train, gpu="H100", policies=["torch"])
    assert path.read_bytes() == b"a real run's checkpoint"
    assert seen == {"keys": ["bias", "weight"], "shape": (32, 64), "on": "cuda", "size": len(b"a real run's checkpoint")}
    assert saved_files.KEPT_NOTE.format(path=path) in _notes(result)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "amem-saved-*"))) == before   # the copy is gone


def test_a_new_checkpoint_is_written_where_the_script_names_it_said_so_and_removed_at_the_end(tmp_path):
    """Left after the prediction (at b1c26e5), a file of zeros would be what a real run resuming
    from the newest checkpoint in that folder loads."""
    path = tmp_path / "out" / "ckpt.pt"
    path.parent.mkdir()
    seen = {}

    def train():
        model, state = _model_state()
        torch.save(state, path)
        torch.save(state, path)   # saved again: its own file, written again in place
        seen["keys"], seen["there"] = sorted(torch.load(path)["model"]), os.path.exists(path)

    result = amem_alloc.predict(train, gpu="H100", policies=["torch"])
    assert seen == {"keys": ["bias", "weight"], "there": True}
    assert _notes(result).count(saved_files.NEW_NOTE.format(path=path)) == 1
    assert not path.exists() and path.parent.is_dir()   # the folder was there before: it stays


def test_the_folders_a_prediction_made_for_a_checkpoint_go_with_it(tmp_path):
    """A Trainer makes `checkpoint-N/` (here under a temporary name, renamed into place), writes its
    config beside the weights: the whole folder goes, a folder that was there stays, and so do
    files the prediction wrote that hold no fake tensor outside those folders."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("the user's")

    def train():
        model, state = _model_state()
        staging = out / "runs" / "tmp-checkpoint-1"
        os.makedirs(staging)
        (staging / "config.json").write_text("{}")
        torch.save(state, staging / "model.pt")
        os.rename(staging, out / "runs" / "checkpoint-1")
        (out / "log.txt").write_text("step 1")
        assert sorted(os.listdir(out / "runs" / "checkpoint-1")) == ["config.json", "model.pt"]

    amem_alloc.predict(train, gpu="H100", policies=["torch"])
    assert sorted(os.listdir(out)) == ["log.txt", "mine.txt"]


def test_the_files_saved_go_after_the_what_if_trials_which_do_not_see_them(tmp_path):
    """The end is the whole prediction's; a what-if trial is a run of the changed job from where the
    first run started (run_files.py): it does not find the checkpoint the first run saved (found,
    HF's Trainer would resume from it, a program the changed job does not run)."""
    path = tmp_path / "ckpt.pt"
    found = []

    def train():
        found.append(path.exists())
        model, state = _model_state()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(8, 64, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        torch.save(state, path)

    amem_alloc.predict(train, gpu="H100", policies=["torch"], what_if="grads=set-to-none")
    assert found == [False, False]
    assert not path.exists()


def test_real_data_is_saved_over_a_file_as_the_script_asks(tmp_path):
    path = tmp_path / "stats.pt"
    path.write_bytes(b"old")

    def prepare():
        torch.save({"mean": torch.tensor([0.5, 0.25]), "count": 7}, path)

    result = amem_alloc.predict(prepare, gpu="H100", policies=["torch"])
    loaded = torch.load(path)
    assert torch.equal(loaded["mean"], torch.tensor([0.5, 0.25])) and loaded["count"] == 7
    assert not any(str(path) in what for what in _notes(result))


def test_a_safetensors_file_that_was_there_is_untouched(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"a real run's weights")
    seen = {}

    def train():
        model, _ = _model_state()
        st.save_file(model.state_dict(), str(path))
        seen["keys"] = sorted(st.load_file(str(path), device="cuda"))

    result = amem_alloc.predict(train, gpu="H100", policies=["torch"])
    assert path.read_bytes() == b"a real run's weights" and seen["keys"] == ["bias", "weight"]
    assert saved_files.KEPT_NOTE.format(path=path) in _notes(result)


def test_a_saved_fake_tensor_holds_zeros_in_a_file_and_in_a_buffer(tmp_path):
    """torch.save copies a fake storage into a fresh host buffer: that buffer kept whatever the host
    allocator's memory held (NaN and inf among it: ultralytics, reloading its last.pt, called the
    checkpoint corrupted). Inside a save the unknown values are zeros."""
    import io

    loaded = []

    def program():
        for _ in range(8):   # host memory of the same size, freed with non-zero bytes in it
            junk = torch.full((4096,), float("nan"))
            del junk
        weight = torch.randn(4096, device="cuda") * 3
        buffer = io.BytesIO()
        torch.save({"w": weight}, buffer)
        buffer.seek(0)
        loaded.append(torch.load(buffer, map_location="cpu")["w"])
        torch.save({"w": weight}, tmp_path / "w.pt")
        loaded.append(torch.load(tmp_path / "w.pt", map_location="cpu")["w"])

    amem_alloc.predict(program, gpu="H100")
    with torch._C.DisableTorchFunction():
        assert [t.device.type for t in loaded] == ["cpu", "cpu"]
        assert all(t.shape == (4096,) and torch.count_nonzero(t) == 0 for t in loaded)


def test_a_file_the_script_wrote_itself_is_saved_over_where_it_names_it(tmp_path):
    """ultralytics writes last.pt from a byte buffer (`open(path, "wb")`), then saves it again
    with torch.save: that second save went to a scratch copy, noted as a file "there before the
    prediction", and the user's folder kept the first write."""

    path = tmp_path / "last.pt"

    def program():
        weight = torch.randn(64, device="cuda")
        with open(path, "wb") as f:
            f.write(_saved_bytes({"w": weight}))
        torch.save({"w": weight, "epoch": 2}, path)
        epochs.append(torch.load(path, map_location="cpu")["epoch"])

    epochs = []
    result = amem_alloc.predict(program, gpu="H100")
    assert not [n for n in _notes(result) if "was there before" in n], _notes(result)
    assert epochs == [2] and not path.exists()


def test_a_save_into_a_buffer_and_a_file_rewritten_from_it_are_noted(tmp_path):
    """Failed at 9534256 (nothing said): Lightning saves a checkpoint into a BytesIO and writes it
    through an fsspec transaction (a temporary file moved into place); the file held zeros for
    every value, and a `last.ckpt` of a real run in the same folder was replaced, with no note."""

    old, new = tmp_path / "last.ckpt", tmp_path / "epoch=0.ckpt"
    old.write_bytes(b"a real run's checkpoint")

    def program():
        weight = torch.randn(64, device="cuda")
        saved = _saved_bytes({"w": weight})
        with open(new, "wb") as f:
            f.write(saved)
        handle, temporary = tempfile.mkstemp(dir=tmp_path)   # as fsspec's transaction writes a file
        os.write(handle, saved)
        os.close(handle)
        os.replace(temporary, old)
        with open(tmp_path / "direct.pt", "wb") as f:
            torch.save({"w": weight}, f)

    result = amem_alloc.predict(program, gpu="H100")
    stand_ins = _notes(result)
    assert saved_files.BUFFER_NOTE.format(what="a buffer (BytesIO)") in stand_ins, stand_ins
    assert [n for n in stand_ins if "was there before" in n] == [saved_files.REWRITTEN_NOTE.format(path=old)]
    sites = [n["where"] for n in result.notes if n["what"] == saved_files.REWRITTEN_NOTE.format(path=old)]
    assert sites and os.path.basename(sites[0]).startswith("test_predict_saved_files.py:"), sites
    # the new files hold zeros: the one written from the buffer (its size) and the one the script
    # opened and saved into are removed as files saved by path are (left at 20be2be: Lightning's
    # checkpoints stayed, all weights zero); the file that was there is the script's to have rewritten
    for path in (new, tmp_path / "direct.pt"):
        assert saved_files.NEW_NOTE.format(path=path) in stand_ins, stand_ins
        assert not path.exists()
    assert old.exists()


def test_new_files_the_script_writes_from_a_run_without_values_are_named_once(tmp_path, monkeypatch):
    """diffusers' DreamBooth writes its class images (made by a pipeline whose values a prediction
    does not compute) into a folder a real run then takes as done: the new files that stay are
    named in one note at the script's line; a file that was there and a cache's are not."""
    (tmp_path / "old.txt").write_text("there before")
    cache = tmp_path / "cache"

    def program():
        os.makedirs(tmp_path / "class_images")
        for i in range(5):
            with open(tmp_path / "class_images" / f"{i}.jpg", "wb") as f:
                f.write(b"\0" * 16)
        with open(tmp_path / "old.txt", "a") as f:
            f.write("more")
        os.makedirs(cache)
        (cache / "downloaded.bin").write_bytes(b"real")

    monkeypatch.setenv("HF_HOME", str(cache))
    result = amem_alloc.predict(program, gpu="H100", policies=["torch"])
    created = [n for n in result.notes if "new file" in n["what"]]
    assert len(created) == 1 and created[0]["what"].startswith("the script wrote 5 new files outside caches ("), created
    assert str(tmp_path / "class_images" / "0.jpg") in created[0]["what"] and "and 2 more" in created[0]["what"]
    assert "old.txt" not in created[0]["what"] and "downloaded" not in created[0]["what"]
    assert os.path.basename(created[0]["where"]).startswith("test_predict_saved_files.py:")


def test_python_source_the_run_writes_and_imports_is_code_not_a_file_of_values(tmp_path):
    """PyTorch Geometric writes each layer's generated module to the temporary folder and imports
    it: it holds no value of the run, and the note telling the user to check or remove files
    written without values named it. A file the run writes and does not import is still named."""
    import importlib.util
    import sys

    def program():
        source = tmp_path / "generated_layer.py"
        source.write_text("def propagate(x):\n    return x\n")
        spec = importlib.util.spec_from_file_location("generated_layer", source)
        module = importlib.util.module_from_spec(spec)
        sys.modules["generated_layer"] = module
        spec.loader.exec_module(module)
        (tmp_path / "written.py").write_text("not imported")

    try:
        result = amem_alloc.predict(program, gpu="H100", policies=["torch"])
    finally:
        sys.modules.pop("generated_layer", None)
    created = [n["what"] for n in result.notes if "new file" in n["what"]]
    assert len(created) == 1 and created[0].startswith("the script wrote 1 new file outside caches ("), created
    assert "written.py" in created[0] and "generated_layer" not in created[0]


def test_a_checkpoint_moved_over_a_file_that_was_there_puts_it_back_and_its_copies_go(tmp_path):
    """timm's CheckpointSaver saves to a temporary file, os.replace()s it onto last.pth, then links
    and copies it to other names. At 5d2e06d a real run's last.pth in that folder was replaced by
    zeros, and the link and the copy, zeros too, stayed after the prediction."""
    last = tmp_path / "last.pth"
    last.write_bytes(b"a real run's checkpoint")
    seen = {}

    def train():
        model, state = _model_state()
        torch.save(state, tmp_path / "tmp.pth")
        os.replace(tmp_path / "tmp.pth", last)
        seen["loads"] = sorted(torch.load(last)["model"])
        os.link(last, tmp_path / "best.pth")
        shutil.copy2(last, tmp_path / "copy.pth")
        seen["names"] = sorted(os.listdir(tmp_path))

    result = amem_alloc.predict(train, gpu="H100", policies=["torch"])
    assert seen == {"loads": ["bias", "weight"], "names": ["best.pth", "copy.pth", "last.pth"]}
    assert sorted(os.listdir(tmp_path)) == ["last.pth"] and last.read_bytes() == b"a real run's checkpoint"
    assert saved_files.ASIDE_NOTE.format(path=last) in _notes(result)
    assert saved_files.NEW_NOTE.format(path=tmp_path / "copy.pth") in _notes(result)
