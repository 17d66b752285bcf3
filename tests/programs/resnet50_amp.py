"""torchvision ResNet-50 trained with fp16 autocast, GradScaler and SGD with momentum on random
images from a DataLoader."""
import argparse

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark

    images = torch.randn(args.batch * args.steps, 3, args.image, args.image)
    labels = torch.randint(0, args.classes, (args.batch * args.steps,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch, shuffle=True, drop_last=True)

    model = torchvision.models.resnet50(num_classes=args.classes).to(args.device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler(args.device)

    for step, (x, y) in enumerate(loader):
        x, y = x.to(args.device), y.to(args.device)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.float16):
            out = model(x)
            loss = F.cross_entropy(out, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step}: loss {loss.item():.4f} scale {scaler.get_scale():.0f}")


if __name__ == "__main__":
    main()
