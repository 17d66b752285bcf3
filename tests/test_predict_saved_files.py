"""Checkpoints a predicted script saves (amem_alloc/predict/engine/saved_files.py): a save of fake
tensors never overwrites a file that was there before the prediction (a real run's checkpoint in
the same folder): it goes to a scratch copy, which later loads of that path read, and the output
says so; a new path is written where the script names it, noted; real data is saved as it is."""
from __future__ import annotations

import glob
import os
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


def test_a_new_checkpoint_is_written_where_the_script_names_it_and_said_so(tmp_path):
    path = tmp_path / "out" / "ckpt.pt"
    path.parent.mkdir()

    def train():
        model, state = _model_state()
        torch.save(state, path)
        torch.save(state, path)   # saved again: its own file, written again in place
        assert sorted(torch.load(path)["model"]) == ["bias", "weight"]

    result = amem_alloc.predict(train, gpu="H100", policies=["torch"])
    assert path.exists()
    assert _notes(result).count(saved_files.NEW_NOTE.format(path=path)) == 1


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

    result = amem_alloc.predict(program, gpu="H100")
    assert not [n for n in _notes(result) if "was there before" in n], _notes(result)
    with torch._C.DisableTorchFunction():
        assert torch.load(path, map_location="cpu")["epoch"] == 2


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
    assert saved_files.BUFFER_NOTE.format(what=str(tmp_path / "direct.pt")) in stand_ins, stand_ins
    assert [n for n in stand_ins if "was there before" in n] == [saved_files.REWRITTEN_NOTE.format(path=old)]
    sites = [n["where"] for n in result.notes if n["what"] == saved_files.REWRITTEN_NOTE.format(path=old)]
    assert sites and os.path.basename(sites[0]).startswith("test_predict_saved_files.py:"), sites
