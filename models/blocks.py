"""Hand-written torch modules for zoo architectures that transformers does not ship:
MobileNetV3-Large (Howard et al., "Searching for MobileNetV3", Table 1), a YOLO-style
detector (Conv-BN-SiLU, C2f bottleneck stages, SPPF, a decoupled anchor-free detect head) and
a stage of a latent-diffusion UNet (GroupNorm + SiLU ResNet blocks, spatial self-attention).

Imported only by models/zoo.py builders, so torch is needed only when a model is built.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F


def _divisible(v: float, divisor: int = 8) -> int:
    """Round channel counts to a multiple of 8 (the paper's rule; never below 90% of v)."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class SqueezeExcite(nn.Module):
    """Squeeze-and-excite with ReLU then hard-sigmoid gating, as MobileNetV3 uses it."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))
        return x * s


class ConvBNAct(nn.Sequential):
    """Conv2d (no bias) + BatchNorm + optional activation."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
                 act: type[nn.Module] | None = nn.ReLU) -> None:
        layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                                   nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class InvertedResidual(nn.Module):
    """MobileNetV3 bottleneck: 1x1 expand, depthwise kxk, optional SE, 1x1 project."""

    def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, act: type[nn.Module], stride: int) -> None:
        super().__init__()
        self.residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(ConvBNAct(cin, exp, 1, act=act))
        layers.append(ConvBNAct(exp, exp, k, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp, _divisible(exp / 4)))
        layers.append(ConvBNAct(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


# MobileNetV3-Large, Table 1 of the paper: kernel, expansion size, output channels, SE,
# nonlinearity (HS = hard-swish, RE = ReLU), stride.
MOBILENET_V3_LARGE: tuple[tuple[int, int, int, bool, str, int], ...] = (
    (3, 16, 16, False, "RE", 1),
    (3, 64, 24, False, "RE", 2),
    (3, 72, 24, False, "RE", 1),
    (5, 72, 40, True, "RE", 2),
    (5, 120, 40, True, "RE", 1),
    (5, 120, 40, True, "RE", 1),
    (3, 240, 80, False, "HS", 2),
    (3, 200, 80, False, "HS", 1),
    (3, 184, 80, False, "HS", 1),
    (3, 184, 80, False, "HS", 1),
    (3, 480, 112, True, "HS", 1),
    (3, 672, 112, True, "HS", 1),
    (5, 672, 160, True, "HS", 2),
    (5, 960, 160, True, "HS", 1),
    (5, 960, 160, True, "HS", 1),
)


class MobileNetV3(nn.Module):
    """MobileNetV3-Large classifier. `width` scales every channel count (1.0 is the paper's
    model); `last_channel` is the width of the penultimate fully connected layer."""

    def __init__(self, width: float = 1.0, num_classes: int = 1000, last_channel: int = 1280,
                 table: Sequence[tuple[int, int, int, bool, str, int]] = MOBILENET_V3_LARGE) -> None:
        super().__init__()
        acts: dict[str, type[nn.Module]] = {"RE": nn.ReLU, "HS": nn.Hardswish}
        cin = _divisible(16 * width)
        layers: list[nn.Module] = [ConvBNAct(3, cin, 3, 2, act=nn.Hardswish)]
        for k, exp, cout, se, nl, stride in table:
            exp_c, out_c = _divisible(exp * width), _divisible(cout * width)
            layers.append(InvertedResidual(cin, k, exp_c, out_c, se, acts[nl], stride))
            cin = out_c
        last_conv = _divisible(6 * cin)  # 960 at width 1.0
        layers.append(ConvBNAct(cin, last_conv, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(last_conv, last_channel), nn.Hardswish(),
                                        nn.Dropout(0.2), nn.Linear(last_channel, num_classes))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.features(pixel_values)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.classifier(x)


# ---------------------------------------------------------------- YOLO-style detector


class ConvBNSiLU(ConvBNAct):
    """The YOLO conv unit: Conv2d + BatchNorm + SiLU."""

    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1) -> None:
        super().__init__(cin, cout, k, stride, act=nn.SiLU)


class Bottleneck(nn.Module):
    """Two 3x3 Conv-BN-SiLU with an optional shortcut."""

    def __init__(self, c: int, shortcut: bool = True) -> None:
        super().__init__()
        self.cv1, self.cv2 = ConvBNSiLU(c, c, 3), ConvBNSiLU(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """Cross-stage partial block: split after a 1x1 conv, chain n bottlenecks on one half,
    concatenate every intermediate, fuse with a 1x1 conv."""

    def __init__(self, cin: int, cout: int, n: int = 1, shortcut: bool = False) -> None:
        super().__init__()
        self.c = cout // 2
        self.cv1 = ConvBNSiLU(cin, 2 * self.c, 1)
        self.cv2 = ConvBNSiLU((2 + n) * self.c, cout, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            ys.append(m(ys[-1]))
        return self.cv2(torch.cat(ys, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling (fast): three chained 5x5 max-pools, concatenated."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        hidden = cin // 2
        self.cv1, self.cv2 = ConvBNSiLU(cin, hidden, 1), ConvBNSiLU(hidden * 4, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = F.max_pool2d(x, 5, 1, 2)
        y2 = F.max_pool2d(y1, 5, 1, 2)
        y3 = F.max_pool2d(y2, 5, 1, 2)
        return self.cv2(torch.cat((x, y1, y2, y3), 1))


class Detect(nn.Module):
    """Anchor-free decoupled head: per level a box branch (4 x reg_max distribution bins) and
    a class branch; decodes boxes with distribution focal loss integration (softmax over
    bins, expectation) and anchor points, then returns [batch, 4 + classes, anchors]."""

    def __init__(self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int = 16) -> None:
        super().__init__()
        self.nc, self.reg_max, self.strides = num_classes, reg_max, tuple(strides)
        c2 = max(16, channels[0] // 4, 4 * reg_max)
        c3 = max(channels[0], min(num_classes, 100))
        self.box = nn.ModuleList(nn.Sequential(ConvBNSiLU(c, c2, 3), ConvBNSiLU(c2, c2, 3),
                                               nn.Conv2d(c2, 4 * reg_max, 1)) for c in channels)
        self.cls = nn.ModuleList(nn.Sequential(ConvBNSiLU(c, c3, 3), ConvBNSiLU(c3, c3, 3),
                                               nn.Conv2d(c3, num_classes, 1)) for c in channels)
        self.register_buffer("bins", torch.arange(reg_max, dtype=torch.float32), persistent=False)

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        b = feats[0].shape[0]
        outs, anchors, stride_t = [], [], []
        for i, f in enumerate(feats):
            outs.append(torch.cat((self.box[i](f), self.cls[i](f)), 1).view(b, 4 * self.reg_max + self.nc, -1))
            h, w = f.shape[2], f.shape[3]
            # Anchor points at cell centres; the image size is static, so these fold to constants.
            sy = torch.arange(h, dtype=f.dtype, device=f.device) + 0.5
            sx = torch.arange(w, dtype=f.dtype, device=f.device) + 0.5
            yy, xx = torch.meshgrid(sy, sx, indexing="ij")
            anchors.append(torch.stack((xx, yy), -1).view(-1, 2))
            stride_t.append(torch.full((h * w, 1), float(self.strides[i]), dtype=f.dtype, device=f.device))
        x = torch.cat(outs, 2)
        anchor = torch.cat(anchors).transpose(0, 1).unsqueeze(0)       # [1, 2, A]
        stride = torch.cat(stride_t).transpose(0, 1).unsqueeze(0)      # [1, 1, A]
        box, cls = x.split((4 * self.reg_max, self.nc), 1)
        a = box.shape[2]
        dist = box.view(b, 4, self.reg_max, a).softmax(2)
        dist = (dist * self.bins.to(dist.dtype).view(1, 1, -1, 1)).sum(2)  # [b, 4, A]
        lt, rb = dist.chunk(2, 1)
        x1y1, x2y2 = anchor - lt, anchor + rb
        xywh = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * stride
        return torch.cat((xywh, cls.sigmoid()), 1)


class YoloNet(nn.Module):
    """A YOLOv8-style detector: CSP backbone of Conv-BN-SiLU and C2f stages, SPPF, a
    top-down/bottom-up neck, and the Detect head on strides 8, 16, 32. `width` and `depth`
    scale channels and repeats (0.25/0.33 is the 'nano' size); `reg_max` is the number of
    distribution bins per box side."""

    def __init__(self, width: float = 0.25, depth: float = 0.33, num_classes: int = 80, max_channels: int = 1024,
                 reg_max: int = 16) -> None:
        super().__init__()

        def ch(c: int) -> int:
            return _divisible(min(c, max_channels) * width)

        def n(r: int) -> int:
            return max(round(r * depth), 1)

        c1, c2, c3, c4, c5 = ch(64), ch(128), ch(256), ch(512), ch(1024)
        self.stem = nn.Sequential(ConvBNSiLU(3, c1, 3, 2), ConvBNSiLU(c1, c2, 3, 2), C2f(c2, c2, n(3), True))
        self.p3 = nn.Sequential(ConvBNSiLU(c2, c3, 3, 2), C2f(c3, c3, n(6), True))
        self.p4 = nn.Sequential(ConvBNSiLU(c3, c4, 3, 2), C2f(c4, c4, n(6), True))
        self.p5 = nn.Sequential(ConvBNSiLU(c4, c5, 3, 2), C2f(c5, c5, n(3), True), SPPF(c5, c5))
        self.up4 = C2f(c5 + c4, c4, n(3))
        self.up3 = C2f(c4 + c3, c3, n(3))
        self.down4_conv, self.down4 = ConvBNSiLU(c3, c3, 3, 2), C2f(c3 + c4, c4, n(3))
        self.down5_conv, self.down5 = ConvBNSiLU(c4, c4, 3, 2), C2f(c4 + c5, c5, n(3))
        self.detect = Detect(num_classes, (c3, c4, c5), (8, 16, 32), reg_max)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x3 = self.p3(self.stem(pixel_values))
        x4 = self.p4(x3)
        x5 = self.p5(x4)
        t4 = self.up4(torch.cat((F.interpolate(x5, scale_factor=2.0, mode="nearest"), x4), 1))
        o3 = self.up3(torch.cat((F.interpolate(t4, scale_factor=2.0, mode="nearest"), x3), 1))
        o4 = self.down4(torch.cat((self.down4_conv(o3), t4), 1))
        o5 = self.down5(torch.cat((self.down5_conv(o4), x5), 1))
        return self.detect((o3, o4, o5))


def calibrate_batchnorm(model: nn.Module, example: torch.Tensor) -> None:
    """Set every BatchNorm's running statistics from one forward pass over `example`, then
    put the model in eval mode. Random conv weights shrink or grow activations layer by layer;
    with default statistics (mean 0, var 1) the BNs pass that on and deep outputs end near
    1e-8 (underflow in float16). Trained networks' BNs normalize each layer; so do these."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average: one pass sets the statistics exactly
    model.train()
    with torch.no_grad():
        model(example)
    model.eval()


def init_bias_prior(model: nn.Module, prior: float = 0.01) -> None:
    """Class-branch biases at a small prior probability, as detectors are initialised, so the
    sigmoid outputs are not saturated at 0.5 everywhere."""
    for m in model.modules():
        if isinstance(m, Detect):
            for seq in m.cls:
                last = seq[-1]
                assert isinstance(last, nn.Conv2d) and last.bias is not None
                nn.init.constant_(last.bias, -math.log((1 - prior) / prior))


class ResnetBlock(nn.Module):
    """A diffusion UNet's ResNet block: GroupNorm → SiLU → 3×3 conv, twice, plus the input
    (through a 1×1 conv when the width changes)."""

    def __init__(self, cin: int, cout: int, groups: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(groups, cin, eps=1e-6), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = nn.GroupNorm(groups, cout, eps=1e-6), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)))


class SpatialAttention(nn.Module):
    """Single-head self-attention over the H·W positions after a GroupNorm, with a residual."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.qkv, self.proj = nn.Conv2d(channels, 3 * channels, 1), nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        a = torch.softmax(q.transpose(1, 2) @ k / math.sqrt(c), dim=-1)  # [b, hw, hw]
        return x + self.proj((v @ a.transpose(1, 2)).reshape(b, c, h, w))


class UNetStage(nn.Module):
    """Stem conv, two ResNet blocks with self-attention after each, a strided downsample and a
    ResNet block at twice the width, then GroupNorm → SiLU → conv out (as a UNet's down path)."""

    def __init__(self, width: int = 320, groups: int = 32) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList([ResnetBlock(width, width, groups), SpatialAttention(width, groups),
                                     ResnetBlock(width, width, groups), SpatialAttention(width, groups)])
        self.down = nn.Conv2d(width, width, 3, stride=2, padding=1)
        self.wide = ResnetBlock(width, 2 * width, groups)
        self.norm_out, self.conv_out = nn.GroupNorm(groups, 2 * width, eps=1e-6), nn.Conv2d(2 * width, 4, 3, padding=1)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        h = self.stem(pixel_values)
        for block in self.blocks:
            h = block(h)
        h = self.wide(self.down(h))
        return self.conv_out(F.silu(self.norm_out(h)))
