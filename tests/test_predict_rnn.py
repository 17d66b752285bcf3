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


@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_a_packed_sequence_keeps_its_lengths_on_the_host_and_packs_its_rows(enforce_sorted):
    """pack_padded_sequence with host lengths (as torch requires them) stopped the script ("'lengths'
    argument should be a 1D CPU int64 tensor, but got 1D meta Long tensor"): the lengths were moved
    onto the fake device. The packed data holds one row per real step (sum of the lengths), the
    batch sizes stay on the host, and the LSTM runs forward and backward on it and pads back."""
    lengths = [10, 8, 5, 3] if enforce_sorted else [5, 10, 3, 8]
    seen = {}

    def step():
        lstm = torch.nn.LSTM(INPUT, HIDDEN, batch_first=True, bidirectional=True).cuda()
        x = torch.randn(4, 10, INPUT, device="cuda", requires_grad=True)
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), batch_first=True,
                                                         enforce_sorted=enforce_sorted)
        seen["data"], seen["batch_sizes"] = tuple(packed.data.shape), packed.batch_sizes
        out, _ = lstm(packed)
        padded, back = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        seen["padded"], seen["lengths"] = tuple(padded.shape), back.tolist()
        padded.sum().backward()
        seen["grad"] = tuple(x.grad.shape)

    amem_alloc.predict(step, gpu="H100", policies=["torch"])
    assert seen["data"] == (sum(lengths), INPUT)
    assert seen["batch_sizes"].device.type == "cpu" and seen["batch_sizes"].tolist() == [4, 4, 4, 3, 3, 2, 2, 2, 1, 1]
    assert seen["padded"] == (4, 10, 2 * HIDDEN)
    assert seen["lengths"] == lengths or not enforce_sorted   # (unsorted: put back by a fake index, a stand-in)
    assert seen["grad"] == (4, 10, INPUT)
