"""torchvision's Faster R-CNN (ResNet-50 FPN, random init, no download) trained for a few steps on
random images with random boxes: data-dependent shapes (anchor matching, NMS, box sampling)."""
import argparse

import torch
from torchvision.models.detection import fasterrcnn_resnet50_fpn


def random_targets(batch, image, classes, boxes, device):
    targets = []
    for _ in range(batch):
        xy = torch.rand(boxes, 2) * (image / 2)
        wh = torch.rand(boxes, 2) * (image / 2) + 8
        targets.append({"boxes": torch.cat([xy, xy + wh], dim=1).to(device),
                        "labels": torch.randint(1, classes, (boxes,)).to(device)})
    return targets


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image", type=int, default=512)
    parser.add_argument("--classes", type=int, default=5)
    parser.add_argument("--boxes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    model = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=args.classes,
                                    min_size=args.image, max_size=args.image).to(args.device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
    for step in range(args.steps):
        images = [torch.rand(3, args.image, args.image, device=args.device) for _ in range(args.batch)]
        losses = model(images, random_targets(args.batch, args.image, args.classes, args.boxes, args.device))
        loss = sum(losses.values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: " + ", ".join(f"{k} {v.item():.3f}" for k, v in losses.items()))


if __name__ == "__main__":
    main()
