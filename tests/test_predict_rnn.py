"""Recurrent layers under prediction (rules/rnn.py): moving an LSTM to CUDA packs its weights into
cuDNN's one flat buffer, as flatten_parameters does on the GPU (the parameters become views of it,
their own storages die), and running one says that cuDNN's RNN kernel is not modelled."""
import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict.rules import rnn  # noqa: E402

INPUT, HIDDEN, LAYERS = 256, 512, 2


def _weights_bytes() -> int:
    per_layer = [4 * HIDDEN * (INPUT if layer == 0 else HIDDEN) + 4 * HIDDEN * HIDDEN + 2 * 4 * HIDDEN
                 for layer in range(LAYERS)]
    return sum(per_layer) * 4   # fp32


def test_an_lstm_moved_to_cuda_holds_its_weights_in_one_flat_buffer():
    seen = {}

    def build():
        lstm = torch.nn.LSTM(INPUT, HIDDEN, LAYERS).cuda()
        seen["storages"] = {p.untyped_storage().data_ptr() for p in lstm.parameters()}
        seen["live"] = torch.cuda.memory_allocated()
        return lstm
    prediction = amem_alloc.predict(build, gpu="H100")
    assert len(seen["storages"]) == 1   # every weight a view of the one buffer
    assert seen["live"] == _weights_bytes()   # the separate copies died
    assert prediction.row("torch").peak_allocated == 2 * _weights_bytes()   # the buffer beside them, once


def test_running_an_lstm_on_cuda_is_noted_as_not_modelled():
    def step():
        lstm = torch.nn.LSTM(INPUT, HIDDEN, LAYERS).cuda()
        out, _ = lstm(torch.randn(16, 4, INPUT, device="cuda"))
        out.sum().backward()
    prediction = amem_alloc.predict(step, gpu="H100")
    notes = [n for n in prediction.notes if n["what"] == rnn.KERNEL_NOTE.format(name="LSTM")]
    assert len(notes) == 1 and notes[0]["kind"] == "not-modelled", prediction.notes
