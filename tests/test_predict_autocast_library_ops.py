"""Libraries' own autocast kernels (engine/autocast.py, FP32_THEN_BACK / FP32_ONLY): torchvision's
RoI ops run in float32 under CUDA autocast and give the input's dtype back, as its AutocastCUDA
kernels do (torchvision/csrc/ops/autocast/roi_align_kernel.cpp). Without them a detection model
under `--amp` stopped with the op's own dtype check ("Expected tensor for input to have the same
type as tensor for rois"), read as the script's failure."""
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import amem_alloc  # noqa: E402

MiB = 1 << 20


def _roi_align(seen):
    features = torch.randn(2, 256, 64, 64, device="cuda", dtype=torch.float16)   # 4 MiB
    boxes = torch.tensor([[0, 0.0, 0.0, 32.0, 32.0]] * 128, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        out = torchvision.ops.roi_align(features, boxes, (7, 7), spatial_scale=1.0)
    seen.append(out.dtype)


def test_roi_align_under_autocast_runs_in_float32_and_returns_the_inputs_dtype():
    seen = []
    prediction = amem_alloc.predict(_roi_align, seen, gpu="H100")
    assert seen == [torch.float16]
    # the float32 copy of the features (8 MiB) lives while the op runs, beside the 4 MiB of half ones
    assert prediction.row("torch").peak_allocated >= 12 * MiB


def test_nms_under_autocast_takes_half_boxes():
    seen = []

    def program():
        boxes = torch.rand(64, 4, device="cuda", dtype=torch.float16) * 10
        boxes[:, 2:] += boxes[:, :2]
        scores = torch.rand(64, device="cuda", dtype=torch.bfloat16)
        with torch.autocast("cuda", dtype=torch.float16):
            keep = torchvision.ops.nms(boxes, scores, 0.5)
        seen.append(keep.dtype)

    amem_alloc.predict(program, gpu="H100")
    assert seen == [torch.int64]
