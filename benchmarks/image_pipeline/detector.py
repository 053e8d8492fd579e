"""DETR (ResNet-50 backbone, 6+6 transformer layers, 41.5M parameters) from transformers' own modules with random
weights, exported to ONNX: a real detector architecture without a download (torchvision's wheel here is built for
CUDA and timm is not needed with transformers' ResNet backbone)."""

from __future__ import annotations

from pathlib import Path

import torch

SIZE = 320  # the square the pipeline resizes each photo to
QUERIES = 100  # DETR's object queries: boxes per image
CLASSES = 92  # COCO's 91 ids and DETR's "no object"


class _Outputs(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(pixel_values=image)
        return out.logits, out.pred_boxes


def export_detr(path: Path) -> Path:
    if path.exists():
        return path
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=ResNetConfig(out_features=["stage4"]),
        num_labels=CLASSES - 1, num_queries=QUERIES,
    )  # fmt: skip
    model = _Outputs(DetrForObjectDetection(config).eval())
    partial = path.with_suffix(".partial")
    torch.onnx.export(
        model, (torch.randn(1, 3, SIZE, SIZE),), str(partial), input_names=["PIXELS"], output_names=["LOGITS", "BOXES"],
        dynamic_axes={"PIXELS": {0: "batch"}, "LOGITS": {0: "batch"}, "BOXES": {0: "batch"}}, opset_version=17, dynamo=False,
    )  # fmt: skip
    partial.rename(path)
    return path
