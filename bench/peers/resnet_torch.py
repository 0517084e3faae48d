#!/usr/bin/python3
"""PyTorch peer of Telar's example 06 (examples/06_resnet): the same ResNets,
timed per training step in training mode (BatchNorm batch statistics).

--model resnet20|resnet32|resnet56: CIFAR-style ResNet (He et al. 2016, 3
stages of 16/32/64 channels, 3x3 convolutions, BatchNorm, projection
shortcuts: 1x1 convolution + BatchNorm where the shape changes) on
[batch, 1, 28, 28] (the first convolution pads by 3: Fashion-MNIST padded to
32x32). --model resnet50: torchvision's ResNet-50 (bottleneck blocks; written out
here, layer for layer, so the script needs no torchvision) on
[batch, 3, R, R] with 10 classes. SGD with momentum 0.9, lr 0.1, fp32, NCHW,
one thread by default, synthetic inputs. Times N steps (zero_grad + forward
+ backward + optimizer step) after a warm-up; prints the median and mean
step time and one JSON line starting with '{"peer":"pytorch"'.

    OMP_NUM_THREADS=1 /usr/bin/python3 bench/peers/resnet_torch.py --model resnet50 --batch 16 --resolution 128
    ../shared/peers/torch26.sh python3 bench/peers/resnet_torch.py --model resnet50 --batch 16 --resolution 128
    ... --precision bf16 --optimizer adamw  # torch.autocast('cpu', dtype=torch.bfloat16), fp32 weights

--precision bf16 runs the forward under torch.autocast('cpu',
dtype=torch.bfloat16) (bf16 convolutions and Linear, fp32 weights and
optimizer; the loss in fp32), as cnn_torch.py and mlp_torch.py do. Telar's
`resnet --precision bf16` trains with AdamW: compare with --optimizer adamw.

--onnx FILE writes the network to FILE instead (torch.onnx.export, opset 13,
dynamic batch, BatchNorm kept as BatchNormalization nodes, as
tests/onnx/make_models.py exports its zoo): example 04 trains it with
`onnx_train --model FILE --data synthetic`, the imported twin of example 06's.
"""

import argparse
import contextlib
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402


class Basic(nn.Module):
    """conv-BN-ReLU-conv-BN plus the shortcut, then ReLU."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """torchvision's ResNet-50 block (v1.5: the stride in the 3x3 convolution)."""

    def __init__(self, cin, mid, stride):
        super().__init__()
        out = 4 * mid
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut = nn.Identity() if stride == 1 and cin == out else nn.Sequential(
            nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class _BackwardOutsideOneDNN(torch.autograd.Function):
    """A 1x1 stride-2 convolution (no bias): forward as nn.Conv2d (oneDNN),
    backward through aten's convolution_backward with oneDNN off."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return nn.functional.conv2d(x, w, stride=2)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        with torch.backends.mkldnn.flags(enabled=False):
            gx, gw, _ = torch.ops.aten.convolution_backward(
                gy, x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False])
        return gx, gw


class StridedProjection(nn.Module):
    """nn.Conv2d(cin, cout, 1, 2, bias=False) whose backward avoids oneDNN."""

    def __init__(self, conv):
        super().__init__()
        self.weight = conv.weight

    def forward(self, x):
        if torch.is_autocast_cpu_enabled():  # --precision bf16: the conv's operands in bf16
            dt = torch.get_autocast_cpu_dtype()
            with torch.autocast("cpu", enabled=False):
                return _BackwardOutsideOneDNN.apply(x.to(dt), self.weight.to(dt))
        return _BackwardOutsideOneDNN.apply(x, self.weight)


def projections_outside_onednn(model):
    """PyTorch 2.6's oneDNN (Debian 13: 3.6) dies of SIGFPE (integer divide by
    zero in dnnl_convolution_backward_data_primitive_desc_create) in the
    backward of 1x1 stride-2 convolutions from 512 channels on this VM, at any
    ISA from AVX2 (AVX and SSE4.1 pass): the three strided projections of
    ResNet-50 compute their backward without oneDNN, every other
    convolution as usual."""
    n = 0
    for m in model.modules():
        if isinstance(m, Bottleneck) and isinstance(m.shortcut, nn.Sequential):
            c = m.shortcut[0]
            if c.kernel_size == (1, 1) and c.stride == (2, 2):
                m.shortcut[0] = StridedProjection(c)
                n += 1
    return n


def resnet50(classes=10):
    """torchvision.models.resnet50(num_classes=classes), layer for layer."""
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for stage, blocks in enumerate((3, 4, 6, 3)):
        mid = 64 << stage
        for b in range(blocks):
            layers.append(Bottleneck(cin, mid, 2 if stage > 0 and b == 0 else 1))
            cin = 4 * mid
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def cifar_resnet(depth, width=16):
    n = (depth - 2) // 6
    layers = [nn.Conv2d(1, width, 3, 1, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for stage in range(3):
        cout = width << stage
        for b in range(n):
            layers.append(Basic(cin, cout, 2 if stage > 0 and b == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
    return nn.Sequential(*layers)


def export(model, x, path):
    """Eval mode, no constant folding and TrainingMode.PRESERVE, so that each
    BatchNorm stays a node with its own statistics (the default folds it into
    the convolution before it)."""
    model.eval()
    torch.onnx.export(model, x, path, opset_version=13, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.PRESERVE, input_names=["input"],
                      output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    print(f"wrote {path}: input {list(x.shape[1:])}")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet20")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--resolution", type=int, default=128)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    p.add_argument("--optimizer", choices=["momentum", "adamw"], default="momentum",
                   help="SGD momentum 0.9 lr 0.1 (default), or AdamW (Telar's bf16 optimizer)")
    p.add_argument("--onnx", metavar="FILE", help="write the network as ONNX and exit")
    p.add_argument("--no-mkldnn", action="store_true",
                   help="convolutions without oneDNN (torch.backends.mkldnn.enabled = False)")
    p.add_argument("--projections-outside-onednn", action="store_true",
                   help="the backward of ResNet-50's 1x1 stride-2 projections without oneDNN "
                        "(PyTorch 2.6's oneDNN 3.6 crashes there on this machine)")
    a = p.parse_args()
    if a.no_mkldnn:
        torch.backends.mkldnn.enabled = False
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if a.model == "resnet50":
        model = resnet50()
        x = torch.rand(a.batch, 3, a.resolution, a.resolution)
    else:
        model = cifar_resnet(int(a.model[len("resnet"):]), a.width)
        x = torch.rand(a.batch, 1, 28, 28)
    if a.onnx:
        export(model, x[:2], a.onnx)
        return
    if a.projections_outside_onednn:
        print(f"{projections_outside_onednn(model)} strided projections: backward without oneDNN")
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if a.optimizer == "momentum" \
        else torch.optim.AdamW(model.parameters(), lr=1e-3)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" \
        else contextlib.nullcontext
    loss_fn = nn.CrossEntropyLoss()
    y = torch.randint(0, 10, (a.batch,))
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            out = model(x)
        loss = loss_fn(out.float(), y)
        loss.backward()
        opt.step()
        t = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(t * 1e3)
    med, mean = statistics.median(times), statistics.mean(times)
    print(f"pytorch {torch.__version__}: {a.model} batch {a.batch}, {a.precision}, {a.optimizer}, "
          f"{a.threads} thread(s), "
          f"median step {med:.1f} ms, mean {mean:.1f} ms, mkldnn "
          f"{torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled}")
    print(json.dumps({"peer": "pytorch", "version": torch.__version__, "model": a.model,
                      "batch": a.batch, "resolution": a.resolution, "precision": a.precision,
                      "optimizer": a.optimizer, "threads": a.threads,
                      "steps": a.steps, "step_ms_median": med, "step_ms_mean": mean}))


if __name__ == "__main__":
    main()
