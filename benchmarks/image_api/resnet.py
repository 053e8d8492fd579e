"""ResNet-50 (v1.5: the stride of a downsampling bottleneck sits on its 3x3 convolution) written out in torch, so
the benchmark builds the real architecture and size (25.6M parameters) without torchvision, whose wheel here is
built for CUDA. Weights are random: only the cost of a forward pass matters."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

LAYERS = (3, 4, 6, 3)  # bottlenecks per stage
WIDTHS = (64, 128, 256, 512)
EXPANSION = 4


class Bottleneck(nn.Module):
    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        outputs = width * EXPANSION
        self.body = nn.Sequential(
            nn.Conv2d(inputs, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, outputs, 1, bias=False), nn.BatchNorm2d(outputs),
        )  # fmt: skip
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), nn.BatchNorm2d(outputs)
            )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


def resnet50(classes: int = 1000) -> nn.Module:
    stages: list[nn.Module] = []
    channels = 64
    for index, (blocks, width) in enumerate(zip(LAYERS, WIDTHS)):
        for block in range(blocks):
            stride = 2 if index > 0 and block == 0 else 1
            stages.append(Bottleneck(channels, width, stride))
            channels = width * EXPANSION
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
        *stages,
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes),
    )  # fmt: skip


def export_onnx(path: Path) -> Path:
    """Write ResNet-50 as ONNX with a variable batch dimension (input `INPUT` [N,3,224,224], output `LOGITS`)."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = resnet50().eval()
    example = torch.randn(1, 3, 224, 224)
    partial = path.with_suffix(".partial")
    torch.onnx.export(
        model, (example,), str(partial), input_names=["INPUT"], output_names=["LOGITS"],
        dynamic_axes={"INPUT": {0: "batch"}, "LOGITS": {0: "batch"}}, opset_version=17, dynamo=False,
    )  # fmt: skip
    partial.rename(path)
    return path
