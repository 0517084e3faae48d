#!/usr/bin/python3
"""Fixtures for Telar's ONNX tests, written with PyTorch's own exporter.

For each model (an MLP, a CNN, an MLP with a residual block, torchvision's
ResNet-18 at 3x32x32 and a small 2-D U-Net at 3x16x16, both with their
BatchNorms given random values) writes into OUT_DIR:
  <name>.onnx            torch.onnx.export, opset 13, dynamic batch; constant folding,
                         but for ResNet-18 and the U-Net: TrainingMode.PRESERVE without
                         constant folding, so each BatchNorm stays a node
  <name>_x.bin           input [N, ...] float32 (forward check)
  <name>_y.bin           PyTorch's output on it
  <name>_train_x.bin     STEPS * BATCH training samples, float32
  <name>_train_y.bin     their labels, int32
  <name>_trained_y.bin   PyTorch's output (eval mode) on <name>_x after STEPS SGD steps
                         (training mode: BatchNorm with batch statistics)
  <name>_lr.txt          the SGD learning rate (LR, or the model's own)
  <name>_sources.txt     per initializer: its name, the state_dict key it holds, 1 if transposed
  <name>_trained.bin     PyTorch's trained parameters and running statistics, float32
                         (float64 for the models in DOUBLE, trained in float64),
                         in initializer order
plus refusal fixtures: bad_op.onnx (Softplus), bad_opset.onnx (opset 99),
float64.onnx (a double model), identity.onnx (one Identity node: no layer),
logsoftmax_axis1.onnx (a LogSoftmax over axis 1 of a rank-3 output), and
hand-built one-node graphs each refused for one attribute or form
(asym_pads, same_odd, convtranspose1d, gemm_alpha, gemm_transa, mul_const, add_batch_const,
pool_dilations, pool_rect, pool1d, ceil_pad, resize_cubic, resize_frac,
resize_asym, concat_axis, where_mask, where_tensors, gather_data, gather_batch,
squeeze_wide, reshape_batch,
tied, dead), fold_batch.onnx (a Reshape
to [batch + 1, -1]: shape arithmetic that does not fold); graphs that import: the op_* models
(one per activation, pooling, softmax and upsampling operator, each a Conv,
the operator, Flatten, Linear: forward and training checked as the models
above), mobilenetv2 (torchvision's, width 0.5, in the zoo with ResNet-18), resnet50,
densenet121 and squeezenet (torchvision's, 3x32x32; ResNet-50 trained in float64),
encoder (an nn.TransformerEncoderLayer classifier), gpt (a GPT-style decoder with a
causal mask, its input token ids: TOKENS),
softmax_axis1.onnx (an inner Softmax over axis 1, with its _x.bin/_y.bin), sdpa_split.onnx
(PyTorch 2's q/k/v split and attention scale by hand, with its _x.bin/_y.bin), batch_unit.onnx
(a Gather's extent-1 axis moved beside the batch, with its _x.bin/_y.bin), branch.onnx (a tensor feeding two Linears, concatenated),
nested.onnx (a residual inside a residual branch), batchnorm.onnx (a
BatchNorm1d after a Linear), flatten_neg.onnx (Flatten with axis -3 on rank
4, with its _x.bin/_y.bin), dropout_active.onnx (a Dropout with
training_mode = true between two Gemms); and manifest.txt (N, BATCH, STEPS, LR).
Run: /usr/bin/python3 make_models.py OUT_DIR
With --fashion after OUT_DIR: only example 04's models, fashion_mlp.onnx and cnn.onnx
(--data synthetic; with cnn_x.npy and PyTorch's outputs cnn_y.npy for --predict).
"""
import math
import os
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import torch
from torch import nn

N, BATCH, STEPS, LR = 8, 8, 3, 0.1


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 12),
                         nn.GELU(), nn.Linear(12, 4))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 6, 3), nn.Tanh(), nn.AvgPool2d(2, stride=1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 8), nn.Sigmoid(),
                         nn.Linear(8, 3))


class Res(nn.Module):
    """x + body(x)."""

    def __init__(self, *body):
        super().__init__()
        self.body = nn.Sequential(*body)

    def forward(self, x):
        return x + self.body(x)


def resmlp():
    return nn.Sequential(nn.Linear(12, 8), nn.ReLU(), Res(nn.Linear(8, 8), nn.Tanh()),
                         nn.Linear(8, 4))


def randomize_batch_norms(model, seed):
    """As after training: BatchNorm scales, shifts and running statistics all
    differ (PyTorch's exporter would otherwise share equal initial values)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                m.weight.copy_(1 + 0.2 * torch.randn(c, generator=g))
                m.bias.copy_(0.1 * torch.randn(c, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                m.running_var.copy_(0.5 + torch.rand(c, generator=g))
    return model


def resnet18():
    import torchvision  # only the zoo needs it
    return randomize_batch_norms(torchvision.models.resnet18(num_classes=10), 17)


def conv_bn_relu(i, o):
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())


class UNet(nn.Module):
    """A two-level 2-D U-Net: Conv-BN-ReLU, MaxPool down, ConvTranspose2d up,
    torch.cat skips; a 1x1 Conv head, flattened (each pixel and class a logit)."""

    def __init__(self):
        super().__init__()
        self.enc1, self.enc2, self.mid = conv_bn_relu(3, 8), conv_bn_relu(8, 16), conv_bn_relu(16, 32)
        self.pool = nn.MaxPool2d(2)
        self.up2, self.dec2 = nn.ConvTranspose2d(32, 16, 2, stride=2), conv_bn_relu(32, 16)
        self.up1, self.dec1 = nn.ConvTranspose2d(16, 8, 2, stride=2), conv_bn_relu(16, 8)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return torch.flatten(self.head(d1), 1)


def unet():
    return randomize_batch_norms(UNet(), 19)


def mobilenetv2():
    """torchvision's MobileNetV2 at width 0.5 (depthwise Convs, ReLU6 as Clip,
    inverted residuals); its Dropout at 0, so that training is deterministic."""
    import torchvision
    m = torchvision.models.mobilenet_v2(num_classes=10, width_mult=0.5)
    m.classifier[0].p = 0.0
    return randomize_batch_norms(m, 23)


def resnet50():
    import torchvision
    return randomize_batch_norms(torchvision.models.resnet50(num_classes=10), 31)


def densenet121():
    """torchvision's DenseNet-121 (dense blocks: Concat of every earlier map;
    transitions with AveragePool); at 3x32x32 its last block sees 1x1 maps."""
    import torchvision
    return randomize_batch_norms(torchvision.models.densenet121(num_classes=10), 37)


def squeezenet():
    """torchvision's SqueezeNet 1.0 (Fire modules: two Convs concatenated;
    MaxPool with ceil_mode); its Dropout at 0, so that training is deterministic."""
    import torchvision
    m = torchvision.models.squeezenet1_0(num_classes=10)
    m.classifier[0].p = 0.0
    g = torch.Generator().manual_seed(41)
    with torch.no_grad():  # as after training: its zero biases would be shared initializers
        for c in m.modules():
            if isinstance(c, nn.Conv2d):
                c.bias.copy_(0.05 * torch.randn(c.out_channels, generator=g))
    return m


class Encoder(nn.Module):
    """An nn.TransformerEncoderLayer classifier: Linear embedding of 8 tokens
    of 16 features to d_model 32, one encoder layer (4 heads, feed-forward
    64, ReLU, post-norm, batch_first), mean over the tokens, Linear to 4.
    Its LayerNorm and attention biases are random: at their initial ones and
    zeros PyTorch would share them through Identity nodes."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Linear(16, 32), nn.Linear(32, 4)
        self.enc = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        g = torch.Generator().manual_seed(43)
        with torch.no_grad():
            for name, p in self.enc.named_parameters():
                if p.dim() == 1:
                    p.copy_((1.0 if name.endswith("norm1.weight") or name.endswith("norm2.weight")
                             else 0.0) + 0.1 * torch.randn(p.shape, generator=g))

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))


class CausalBlock(nn.Module):
    """A GPT block written out in PyTorch: pre-norm causal self-attention
    (separate q, k, v Linears, 4 heads, the mask a constant upper triangle
    given to masked_fill with -inf), then a GELU MLP, each with its residual."""

    def __init__(self, d=32, heads=4, seq=16):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.scale = heads, (d // heads) ** -0.5
        self.mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)  # a constant

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (f(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        s = (q @ k.transpose(-2, -1)) * self.scale
        y = (s.masked_fill(self.mask, float("-inf")).softmax(-1) @ v).transpose(1, 2)
        x = x + self.proj(y.reshape(b, t, d))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    """A GPT-style decoder: token embedding (vocab 64, d_model 32, a Gather
    of the integer input), learned positions (an Add of a [16, 32]
    parameter), two CausalBlocks, a final LayerNorm, the mean over the 16
    tokens and a Linear head to the 64 tokens (untied). LayerNorm parameters
    are random: at their initial ones and zeros PyTorch would share them
    through Identity nodes."""

    def __init__(self, vocab=64, d=32, seq=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.1 * torch.randn(seq, d))
        self.blocks = nn.Sequential(CausalBlock(d, 4, seq), CausalBlock(d, 4, seq))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
        g = torch.Generator().manual_seed(47)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.weight.copy_(1.0 + 0.1 * torch.randn(d, generator=g))
                    m.bias.copy_(0.1 * torch.randn(d, generator=g))

    def forward(self, ids):
        return self.head(self.ln(self.blocks(self.tok(ids) + self.pos)).mean(1))


def state_sources(model, path):
    """(state_dict key, transposed) of each initializer of the exported file, in
    file order: its own name, or, for the weights PyTorch's constant folding
    writes transposed as onnx::MatMul_<n>, the parameter whose transpose it equals."""
    state = model.state_dict()
    out = []
    for t in onnx.load(path).graph.initializer:
        if t.name in state:
            out.append((t.name, False))
            continue
        v = onnx.numpy_helper.to_array(t)
        match = [k for k, p in state.items() if p.dim() == 2 and tuple(p.shape[::-1]) == v.shape
                 and np.array_equal(p.numpy().T, v)]
        if len(match) != 1:
            raise SystemExit(f"{path}: initializer {t.name} matches {match}")
        out.append((match[0], True))
    return out


class SubDiv(nn.Module):
    """Sub and Div of two tensors (equal shapes, one value per channel on
    either side) and Add/Sub of trained constants: [4, 1, 1] (c - x), a row
    [6] and one value [1] (x - c). The divisors are sigmoids of 0.1 x (a
    Scale), near 0.5, and of a channel mean."""

    def __init__(self):
        super().__init__()
        self.b = nn.Conv2d(4, 4, 1)
        self.shift = nn.Parameter(0.1 * torch.randn(4, 1, 1))
        self.row = nn.Parameter(0.1 * torch.randn(6))
        self.off = nn.Parameter(torch.tensor([0.3]))

    def forward(self, x):
        b = self.b(x)
        g = torch.sigmoid(b.mean((2, 3), keepdim=True))  # [N, 4, 1, 1]
        s = torch.sigmoid(0.1 * x)
        e = (x - b) / s / g - g
        return (self.shift - (e - g / s)) + self.row - self.off


class MulDiv(nn.Module):
    """Mul and Div by trained constants broadcast over each sample (each a
    Multiplier): a gain per channel [4, 1, 1] on the left (g * x), a row [6]
    dividing (its divisor trained as a divisor) and a map [6, 6] multiplying.
    The divisors start near 2, away from zero."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(1 + 0.3 * torch.randn(4, 1, 1))
        self.std = nn.Parameter(2 + 0.3 * torch.randn(6))
        self.map = nn.Parameter(1 + 0.3 * torch.randn(6, 6))

    def forward(self, x):
        return self.gain * x / self.std * self.map


class Literals(nn.Module):
    """Constants written in the forward (Constant nodes: fixed, as PyTorch
    keeps them) beside one-value parameters (initializers: trained): x + 1.0
    and a literal table subtracted (fixed Bias), a literal table multiplying
    (fixed Multiplier), x * self.k and x / self.d (a trained Multiplier of one
    value each)."""

    def __init__(self):
        super().__init__()
        self.k = nn.Parameter(torch.tensor(1.5))
        self.d = nn.Parameter(torch.tensor([2.0]))

    def forward(self, x):
        y = x + 1.0 - torch.tensor([0.1, 0.2, 0.3, 0.4]).view(4, 1, 1)
        y = y * torch.tensor([2.0, 0.5, 1.0, 1.5]).view(4, 1, 1)
        return y * self.k / self.d


class AddBcast(nn.Module):
    """Add of two tensors broadcast per channel, the spread side on the right
    (x + g) and on the left (h + y): graph joins whose spread input's
    gradient sums over its positions."""

    def forward(self, x):
        y = x + torch.sigmoid(x.mean((2, 3), keepdim=True))
        return torch.tanh(y.mean((2, 3), keepdim=True)) + y


class MathSplit(nn.Module):
    """Split (uneven sizes), Exp, Sqrt, Erf, Pow by a constant, a Mul join,
    Concat, and a Where whose mask an Equal of two literals computes
    (exported without constant folding, so the Equal stays a node)."""

    def forward(self, x):
        a, b = torch.split(x, [1, 3], dim=1)
        a = torch.sqrt(torch.exp(a) + 0.5)
        b = torch.erf(b) * b.pow(2)
        band = torch.tensor([[float(abs(i - j) <= 1) for j in range(6)] for i in range(6)])
        return torch.cat([a, b], 1).masked_fill(band == 0, -1.0)


def op_net(body, shape, classes=3):
    """body (a Conv, then the operator under test), Flatten, Linear."""
    probe = nn.Sequential(*body, nn.Flatten())
    with torch.no_grad():
        k = probe(torch.zeros((1,) + shape)).shape[1]
    return lambda: nn.Sequential(*body, nn.Flatten(), nn.Linear(k, classes))


def ops():
    """One small network per operator that import_model maps onto a new layer."""
    torch.manual_seed(29)
    c2, c3 = (lambda: nn.Conv2d(2, 4, 3, padding=1)), (lambda: nn.Conv3d(2, 3, 3, padding=1))
    s2, s3 = (2, 6, 6), (2, 5, 5, 5)
    nets = {
        "op_relu6": ([c2(), nn.ReLU6()], s2),               # Clip(0, 6) -> ReLU6
        "op_clip": ([c2(), nn.Hardtanh(-0.5, 0.7)], s2),    # Clip -> Clip
        "op_leaky": ([c2(), nn.LeakyReLU(0.2)], s2),
        "op_elu": ([c2(), nn.ELU(0.7)], s2),
        "op_silu": ([c2(), nn.SiLU()], s2),                 # Sigmoid, Mul
        "op_hardswish": ([c2(), nn.Hardswish()], s2),       # opset 14: HardSwish
        "op_hardsigmoid": ([c2(), nn.Hardsigmoid()], s2),
        "op_softmax": ([c2(), nn.Softmax(dim=1)], s2),      # inner, over the channels
        "op_gmaxpool": ([c2(), nn.AdaptiveMaxPool2d(1)], s2),
        "op_pool_ceil": ([c2(), nn.MaxPool2d(2, ceil_mode=True)], (2, 7, 7)),
        "op_avgpool": ([c2(), nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True,
                                           count_include_pad=False)], s2),
        "op_pool3d": ([c3(), nn.MaxPool3d(2, ceil_mode=True), nn.AvgPool3d(2)], s3),
        "op_up_nearest": ([c2(), nn.Upsample(scale_factor=2, mode="nearest")], (2, 4, 4)),
        "op_up_linear": ([c2(), nn.Upsample(scale_factor=2, mode="bilinear")], (2, 4, 4)),
        "op_up_corners": ([c2(), nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)],
                          (2, 4, 4)),
        "op_subdiv": ([c2(), SubDiv()], s2),  # Sub, Div joins; Bias (Add/Sub of a constant)
        "op_muldiv": ([c2(), MulDiv()], s2),  # Multiplier (Mul/Div by a constant)
        "op_addbcast": ([c2(), AddBcast()], s2),  # Add joins broadcast per channel
        "op_literals": ([c2(), Literals()], s2),  # literals fixed, one-value parameters trained
        "op_mathsplit": ([c2(), MathSplit()], s2),
        # 1-D: a Conv2D over [C, 1, L] between two Rearranges
        "op_conv1d": ([nn.Conv1d(2, 4, 3, stride=2, padding=1), nn.ReLU(),
                       nn.Conv1d(4, 4, 3, padding=2, dilation=2, groups=2)], (2, 12)),
        # opset 17: LayerNormalization nodes, over the last two axes and the last one
        "op_layernorm17": ([c2(), nn.LayerNorm([6, 6]), nn.LayerNorm(6)], s2),
    }
    return {name: (op_net(body, shape), shape, 3) for name, (body, shape) in nets.items()}


MODELS = {"mlp": (mlp, (2, 6), 4), "cnn": (cnn, (1, 10, 10), 3), "resmlp": (resmlp, (12,), 4),
          "resnet18": (resnet18, (3, 32, 32), 10), "unet": (unet, (3, 16, 16), 2 * 16 * 16),
          "mobilenetv2": (mobilenetv2, (3, 32, 32), 10), "resnet50": (resnet50, (3, 32, 32), 10),
          "densenet121": (densenet121, (3, 32, 32), 10), "squeezenet": (squeezenet, (3, 32, 32), 10),
          "encoder": (Encoder, (8, 16), 4), "gpt": (Gpt, (16,), 64),
          **ops()}
# Exported with their BatchNormalization nodes (no Conv+BN folding): trainable.
ZOO = {"resnet18", "unet", "mobilenetv2", "resnet50", "densenet121", "squeezenet"}
# ResNet-18's three steps at LR on 8 samples are chaotic (float32 and float64
# PyTorch differ by 2e-2); at 1e-3 they agree to 1e-7. MobileNetV2's (its
# last BatchNorms normalise 1x1 maps over 8 samples) differ by 0.3 at 1e-3,
# 4e-3 at 1e-4 and 1e-5 at 1e-5.
# DenseNet-121's last BatchNorms normalise 1x1 maps too: 1.7e-5 at 1e-5.
# SqueezeNet's last ReLU outputs only zeros after three steps at 1e-2.
MODEL_LR = {"resnet18": 1e-3, "mobilenetv2": 1e-5, "resnet50": 1e-3, "densenet121": 1e-5,
            "squeezenet": 1e-3}
# ResNet-50's BatchNorms normalise 8 samples of 2x2 and 1x1 maps at 3x32x32:
# its float32 and float64 running variances differ by 0.13 after three steps
# at any LR (1e-1 to 1e-5). Trained in float64 (<name>_trained.bin float64; Telar
# trains it in double).
DOUBLE = {"resnet50"}
OPSET = {"op_hardswish": 14, "op_layernorm17": 17}
# Exported without constant folding (as ZOO): op_mathsplit's Equal stays a node.
NO_FOLDING = ZOO | {"op_mathsplit"}
# PyTorch 2's nn.MultiheadAttention calls scaled_dot_product_attention, which
# its TorchScript exporter writes from opset 14 only (1.13's writes the
# attention out at 13).
if int(torch.__version__.split(".")[0]) >= 2:
    OPSET["encoder"] = 14
# Models whose input is token ids below this vocabulary size (int64 for
# PyTorch; <name>_x.bin and <name>_train_x.bin hold them as float32, as Telar
# reads them).
TOKENS = {"gpt": 64}  # opset 13 writes nn.Hardswish as HardSigmoid and Mul


class Branch(nn.Module):
    """Not a chain: one activation feeds two layers whose outputs are concatenated."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], dim=1)


def export(model, shape, path, opset=13, keep_batch_norm=False, name="", fold=None):
    """torch.onnx.export in eval mode. keep_batch_norm: TrainingMode.PRESERVE
    and no constant folding, so that each BatchNorm stays a
    BatchNormalization node with its own initializers (the default,
    TrainingMode.EVAL, folds a BatchNorm into the Conv before it)."""
    model.eval()
    x = torch.zeros((2,) + tuple(shape), dtype=next(model.parameters()).dtype)
    if name in TOKENS:
        x = torch.zeros((2,) + tuple(shape), dtype=torch.long)
    extra = {"training": torch.onnx.TrainingMode.PRESERVE} if keep_batch_norm else {}
    fold = not keep_batch_norm if fold is None else fold
    torch.onnx.export(model, x, path, opset_version=opset, do_constant_folding=fold,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}, **extra)


def save(path, a):
    np.ascontiguousarray(a).tofile(path)


def make(out, name):
    factory, shape, classes = MODELS[name]
    torch.manual_seed({"mlp": 7, "cnn": 11}.get(name, 13))
    model = factory()
    path = os.path.join(out, name + ".onnx")
    export(model, shape, path, opset=OPSET.get(name, 13), keep_batch_norm=name in ZOO, name=name,
           fold=name not in NO_FOLDING)
    if name == "op_gmaxpool":  # PyTorch writes AdaptiveMaxPool2d(1) as a MaxPool
        m = onnx.load(path)
        for n in m.graph.node:
            if n.op_type == "MaxPool":
                n.op_type = "GlobalMaxPool"
                del n.attribute[:]
        onnx.save(m, path)
    sources = state_sources(model, path)
    with open(os.path.join(out, name + "_sources.txt"), "w") as f:  # for check_export.py
        f.writelines(f"{t.name} {k} {int(tr)}\n"
                     for t, (k, tr) in zip(onnx.load(path).graph.initializer, sources))
    g = torch.Generator().manual_seed(3)
    x = torch.randn((N,) + shape, generator=g)
    tx = torch.randn((STEPS * BATCH,) + shape, generator=g)
    if name in TOKENS:
        x = torch.randint(0, TOKENS[name], (N,) + shape, generator=g)
        tx = torch.randint(0, TOKENS[name], (STEPS * BATCH,) + shape, generator=g)
    ty = torch.randint(0, classes, (STEPS * BATCH,), generator=g)
    with torch.no_grad():
        save(os.path.join(out, name + "_x.bin"), x.float().numpy())
        save(os.path.join(out, name + "_y.bin"), model(x).numpy())
    save(os.path.join(out, name + "_train_x.bin"), tx.float().numpy())
    save(os.path.join(out, name + "_train_y.bin"), ty.numpy().astype(np.int32))
    if name in DOUBLE:  # PyTorch's own float32 and float64 steps differ: the float64 one
        model, tx, x = model.double(), tx.double(), x.double()
    model.train()
    lr = MODEL_LR.get(name, LR)
    with open(os.path.join(out, name + "_lr.txt"), "w") as f:
        f.write(f"{lr}\n")
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss = nn.CrossEntropyLoss()
    for s in range(STEPS):
        opt.zero_grad()
        loss(model(tx[s * BATCH:(s + 1) * BATCH]), ty[s * BATCH:(s + 1) * BATCH]).backward()
        opt.step()
    model.eval()  # BatchNorm: running statistics, left as trained
    state = model.state_dict()
    with torch.no_grad():
        save(os.path.join(out, name + "_trained_y.bin"), model(x).float().numpy())
    flat = [(state[k].numpy().T if tr else state[k].numpy()).ravel() for k, tr in sources]
    save(os.path.join(out, name + "_trained.bin"), np.concatenate(flat))


def make_refusals(out):
    torch.manual_seed(5)
    bad = nn.Sequential(nn.Linear(6, 4), nn.Softplus(), nn.Linear(4, 3))
    export(bad, (6,), os.path.join(out, "bad_op.onnx"))
    ok = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    export(ok, (6,), os.path.join(out, "bad_opset.onnx"))
    m = onnx.load(os.path.join(out, "bad_opset.onnx"))
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = 99
    onnx.save(m, os.path.join(out, "bad_opset.onnx"))
    export(nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).double(), (6,),
           os.path.join(out, "float64.onnx"))
    export(Branch(), (6,), os.path.join(out, "branch.onnx"))
    export(Res(nn.Linear(6, 6), Res(nn.Linear(6, 6))), (6,), os.path.join(out, "nested.onnx"))
    # Conv + BatchNorm2d is folded by the exporter (accepted); BatchNorm1d after a Linear is not.
    export(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(2 * 4 * 4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)),
           (1, 6, 6), os.path.join(out, "batchnorm.onnx"))


def graph(name, nodes, inputs, outputs, inits=(), opset=13):
    g = onnx.helper.make_graph(nodes, name, inputs, outputs, list(inits))
    return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)])


def value(name, shape):
    return onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)


def make_axes(out):
    """Hand-built graphs for axis attributes, one-node graphs and active dropout."""
    h, rng = onnx.helper, np.random.default_rng(3)
    onnx.save(graph("identity", [h.make_node("Identity", ["x"], ["y"])], [value("x", ["N", 6])],
                    [value("y", ["N", 6])]), os.path.join(out, "identity.onnx"))
    onnx.save(graph("softmax", [h.make_node("Relu", ["x"], ["r"]),
                                h.make_node("Softmax", ["r"], ["y"], axis=1)],
                    [value("x", ["N", 4, 5])], [value("y", ["N", 4, 5])]),
              os.path.join(out, "softmax_axis1.onnx"))
    x = rng.standard_normal((N, 4, 5)).astype(np.float32)
    e = np.exp(np.maximum(x, 0))
    save(os.path.join(out, "softmax_axis1_x.bin"), x)
    save(os.path.join(out, "softmax_axis1_y.bin"), e / e.sum(axis=1, keepdims=True))
    onnx.save(graph("logsoftmax", [h.make_node("Relu", ["x"], ["r"]),
                                   h.make_node("LogSoftmax", ["r"], ["y"], axis=1)],
                    [value("x", ["N", 4, 5])], [value("y", ["N", 4, 5])]),
              os.path.join(out, "logsoftmax_axis1.onnx"))
    w = rng.standard_normal((3, 18)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")]
    onnx.save(graph("flatten", [h.make_node("Flatten", ["x"], ["f"], axis=-3),
                                h.make_node("Gemm", ["f", "w", "b"], ["y"], transB=1)],
                    [value("x", ["N", 2, 3, 3])], [value("y", ["N", 3])], inits),
              os.path.join(out, "flatten_neg.onnx"))
    x = rng.standard_normal((N, 2, 3, 3)).astype(np.float32)
    save(os.path.join(out, "flatten_neg_x.bin"), x)
    save(os.path.join(out, "flatten_neg_y.bin"), x.reshape(N, 18) @ w.T + b)
    ints = [onnx.numpy_helper.from_array(np.array(v, np.int64), k)
            for k, v in (("starts", [1, -3]), ("ends", [3, 100]), ("axes", [1, -1]))]
    onnx.save(graph("slice2", [h.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])],
                    [value("x", ["N", 4, 5])], [value("y", ["N", 2, 3])], ints),
              os.path.join(out, "slice2.onnx"))  # two axes, one negative, an end clamped
    x = rng.standard_normal((N, 4, 5)).astype(np.float32)
    save(os.path.join(out, "slice2_x.bin"), x)
    save(os.path.join(out, "slice2_y.bin"), x[:, 1:3, 2:])
    w2 = rng.standard_normal((3, 6)).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((6, 6)).astype(np.float32), "w1"),
             onnx.numpy_helper.from_array(w2, "w2"),
             onnx.numpy_helper.from_array(np.array(0.25, np.float32), "ratio"),
             onnx.numpy_helper.from_array(np.array(True), "train")]
    onnx.save(graph("dropout", [h.make_node("Gemm", ["x", "w1"], ["a"], transB=1),
                                h.make_node("Dropout", ["a", "ratio", "train"], ["d"]),
                                h.make_node("Gemm", ["d", "w2"], ["y"], transB=1)],
                    [value("x", ["N", 6])], [value("y", ["N", 3])], inits),
              os.path.join(out, "dropout_active.onnx"))
    # Opset 7's Upsample (scales an attribute) and opset 20's Gelu node.
    onnx.save(graph("upsample7", [h.make_node("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 2.0],
                                              mode="nearest")],
                    [value("x", ["N", 2, 3, 3])], [value("y", ["N", 2, 6, 6])], opset=7),
              os.path.join(out, "upsample7.onnx"))
    x = rng.standard_normal((N, 2, 3, 3)).astype(np.float32)
    save(os.path.join(out, "upsample7_x.bin"), x)
    save(os.path.join(out, "upsample7_y.bin"), x.repeat(2, axis=2).repeat(2, axis=3))
    onnx.save(graph("gelu20", [h.make_node("Gelu", ["x"], ["y"])], [value("x", ["N", 6])],
                    [value("y", ["N", 6])], opset=20), os.path.join(out, "gelu20.onnx"))
    x = rng.standard_normal((N, 6))
    save(os.path.join(out, "gelu20_x.bin"), x.astype(np.float32))
    erf = np.vectorize(math.erf)
    save(os.path.join(out, "gelu20_y.bin"), (0.5 * x * (1 + erf(x / math.sqrt(2)))).astype(np.float32))
    # A Where whose mask an Equal of two literals computes (int64 band and 0).
    band = np.array([[int(abs(i - j) <= 1) for j in range(6)] for i in range(4)], np.int64)
    literal = [h.make_node("Constant", [], [k], value=onnx.numpy_helper.from_array(v, k))
               for k, v in (("band", band), ("zero", np.array(0, np.int64)),
                            ("fill", np.array(-2.0, np.float32)))]
    onnx.save(graph("equal_mask", literal + [h.make_node("Equal", ["band", "zero"], ["m"]),
                                             h.make_node("Relu", ["x"], ["r"]),
                                             h.make_node("Where", ["m", "fill", "r"], ["y"])],
                    [value("x", ["N", 4, 6])], [value("y", ["N", 4, 6])]),
              os.path.join(out, "equal_mask.onnx"))
    x = rng.standard_normal((N, 4, 6)).astype(np.float32)
    save(os.path.join(out, "equal_mask_x.bin"), x)
    save(os.path.join(out, "equal_mask_y.bin"), np.where(band == 0, -2.0, np.maximum(x, 0))
         .astype(np.float32))


def make_split(out):
    """PyTorch 2.6's packed q/k/v split and scaled_dot_product_attention scale,
    by hand (sdpa_split.onnx, with its _x.bin/_y.bin): x [N, 4, 6] times w
    [6, 12], a Reshape to [N, 4, 2, 6] whose shape is folded through Mod and
    Reshape of shape values, Unsqueeze, Transpose [3, 1, 2, 0, 4], Squeeze,
    Gather of index 1 along axis 0, times sqrt(1 / sqrt(Cast(Shape[-1])))."""
    h, rng = onnx.helper, np.random.default_rng(7)
    w = rng.standard_normal((6, 12)).astype(np.float32)

    def ints(name, v, scalar=False):
        return onnx.numpy_helper.from_array(np.array(v if scalar else list(v), np.int64), name)
    inits = [onnx.numpy_helper.from_array(w, "w"), ints("zero", [0]), ints("two", [2]),
             ints("three", [3]), ints("one", [1]), ints("tail", [2, 6]), ints("ax0", [0]),
             ints("ax3", [3]), ints("last", [-1]), ints("big", [2 ** 62]),
             ints("pick", 1, scalar=True)]
    unit = onnx.numpy_helper.from_array(np.array([1.0], np.float32), "unit")  # a literal
    nodes = [h.make_node("Constant", [], ["unit"], value=unit),
             h.make_node("MatMul", ["x", "w"], ["p"]),
             h.make_node("Shape", ["p"], ["s"]),
             h.make_node("Mod", ["two", "three"], ["m"]),
             h.make_node("Reshape", ["m", "one"], ["mr"]),
             h.make_node("Slice", ["s", "zero", "mr"], ["lead"]),
             h.make_node("Concat", ["lead", "tail"], ["shape"], axis=0),
             h.make_node("Reshape", ["p", "shape"], ["r"]),
             h.make_node("Unsqueeze", ["r", "ax0"], ["u"]),
             h.make_node("Transpose", ["u"], ["t"], perm=[3, 1, 2, 0, 4]),
             h.make_node("Squeeze", ["t", "ax3"], ["q"]),
             h.make_node("Gather", ["q", "pick"], ["g"], axis=0),
             h.make_node("Shape", ["g"], ["gs"]),
             h.make_node("Slice", ["gs", "last", "big"], ["d"]),
             h.make_node("Cast", ["d"], ["df"], to=onnx.TensorProto.FLOAT),
             h.make_node("Sqrt", ["df"], ["sd"]),
             h.make_node("Div", ["unit", "sd"], ["inv"]),
             h.make_node("Cast", ["inv"], ["invf"], to=onnx.TensorProto.FLOAT),
             h.make_node("Sqrt", ["invf"], ["scale"]),
             h.make_node("Mul", ["g", "scale"], ["y"])]
    onnx.save(graph("sdpa_split", nodes, [value("x", ["N", 4, 6])], [value("y", ["N", 4, 6])],
                    inits, opset=14), os.path.join(out, "sdpa_split.onnx"))
    x = rng.standard_normal((N, 4, 6)).astype(np.float32)
    save(os.path.join(out, "sdpa_split_x.bin"), x)
    y = (x @ w).reshape(N, 4, 2, 6)[:, :, 1, :] * np.sqrt(1 / np.sqrt(6.0))
    save(os.path.join(out, "sdpa_split_y.bin"), y.astype(np.float32))
    # batch_unit.onnx: the axis a Gather leaves (extent 1) ends up beside the
    # batch in one logical axis ([4, 2, N, 6] -> [4, N, 6] -> [4, N * 6] ->
    # [N * 6, 4] -> [N, 6, 4]); the output must still be stored [batch, 6, 4].
    nodes = [h.make_node("Transpose", ["x"], ["t"], perm=[1, 2, 0, 3]),
             h.make_node("Gather", ["t", "first"], ["g"], axis=1),
             h.make_node("Reshape", ["g", "rows"], ["r"]),
             h.make_node("Transpose", ["r"], ["rt"], perm=[1, 0]),
             h.make_node("Reshape", ["rt", "back"], ["y"])]
    inits = [ints("first", 0, scalar=True), ints("rows", [4, -1]), ints("back", [-1, 6, 4])]
    onnx.save(graph("batch_unit", nodes, [value("x", ["N", 4, 2, 6])], [value("y", ["N", 6, 4])],
                    inits), os.path.join(out, "batch_unit.onnx"))
    x = rng.standard_normal((N, 4, 2, 6)).astype(np.float32)
    save(os.path.join(out, "batch_unit_x.bin"), x)
    save(os.path.join(out, "batch_unit_y.bin"), np.ascontiguousarray(x[:, :, 0, :].transpose(0, 2, 1)))


def make_graph_refusals(out):
    """Hand-built graphs, one refusal each (the attribute or form named)."""
    h, rng = onnx.helper, np.random.default_rng(5)

    def init(name, *shape):
        return onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    def conv_graph(name, attrs, w_shape=(2, 2, 3, 3), x_shape=("N", 2, 6, 6)):
        onnx.save(graph(name, [h.make_node("Conv", ["x", "w"], ["y"], **attrs)],
                        [value("x", list(x_shape))], [value("y", None)], [init("w", *w_shape)]),
                  os.path.join(out, name + ".onnx"))

    conv_graph("asym_pads", {"pads": [0, 0, 1, 1]})
    conv_graph("same_odd", {"auto_pad": "SAME_UPPER"}, (2, 2, 2, 2))
    onnx.save(graph("convtranspose1d", [h.make_node("ConvTranspose", ["x", "w"], ["y"])],
                    [value("x", ["N", 2, 6])], [value("y", None)], [init("w", 2, 2, 3)]),
              os.path.join(out, "convtranspose1d.onnx"))

    def one(name, op, inputs, inits, x_shape=("N", 2, 6, 6), **attrs):
        onnx.save(graph(name, [h.make_node(op, inputs, ["y"], **attrs)],
                        [value("x", list(x_shape))], [value("y", None)], inits),
                  os.path.join(out, name + ".onnx"))

    one("gemm_alpha", "Gemm", ["x", "w"], [init("w", 3, 6)], ("N", 6), alpha=2.0, transB=1)
    one("gemm_transa", "Gemm", ["x", "w"], [init("w", 3, 6)], ("N", 6), transA=1, transB=1)
    one("const_div", "Div", ["c", "x"], [init("c", 2, 1, 1)])  # a constant over a tensor
    one("mul_batch_const", "Mul", ["x", "c"], [init("c", 3, 2, 6, 6)])  # a constant over the batch
    one("div_zero", "Div", ["x", "c"],
        [onnx.numpy_helper.from_array(np.array([[[1]], [[0]]], np.float32), "c")])
    one("add_batch_const", "Add", ["x", "c"], [init("c", 3, 2, 6, 6)])  # a constant over the batch
    one("pool_dilations", "MaxPool", ["x"], [], kernel_shape=[2, 2], dilations=[2, 2])
    one("pool_rect", "AveragePool", ["x"], [], kernel_shape=[2, 3])
    one("pool1d", "MaxPool", ["x"], [], ("N", 2, 6), kernel_shape=[2])
    one("ceil_pad", "MaxPool", ["x"], [], ("N", 2, 5, 5), kernel_shape=[2, 2], strides=[2, 2],
        pads=[1, 1, 1, 1], ceil_mode=1)
    empty = onnx.numpy_helper.from_array(np.zeros(0, np.float32), "roi")

    def scales(*v):
        return onnx.numpy_helper.from_array(np.array(v, np.float32), "scales")

    one("resize_cubic", "Resize", ["x", "roi", "scales"], [empty, scales(1, 1, 2, 2)], mode="cubic")
    one("resize_frac", "Resize", ["x", "roi", "scales"], [empty, scales(1, 1, 1.5, 1.5)])
    one("resize_asym", "Resize", ["x", "roi", "scales"], [empty, scales(1, 1, 2, 2)],
        mode="linear", coordinate_transformation_mode="asymmetric")
    one("concat_axis", "Concat", ["x", "x"], [], axis=2)
    causal = onnx.numpy_helper.from_array(np.triu(np.ones((3, 3), bool), 1), "causal")
    fill = onnx.numpy_helper.from_array(np.array(-np.inf, np.float32), "fill")
    one("where_mask", "Where", ["causal", "fill", "x"], [causal, fill])  # [3, 3] vs [2, 6, 6]
    one("where_tensors", "Where", ["causal", "x", "x"], [causal], ("N", 3, 3))
    idx = onnx.numpy_helper.from_array(np.array([0, 2], np.int64), "idx")
    one("gather_data", "Gather", ["x", "idx"], [idx], ("N", 6), axis=1)  # not an embedding
    first = onnx.numpy_helper.from_array(np.array(0, np.int64), "first")
    one("gather_batch", "Gather", ["x", "first"], [first], ("N", 6), axis=0)  # a sample
    ax = onnx.numpy_helper.from_array(np.array([1], np.int64), "ax")
    one("squeeze_wide", "Squeeze", ["x", "ax"], [ax], ("N", 6))  # extent 6
    rows = onnx.numpy_helper.from_array(np.array([-1, 3], np.int64), "rows")
    one("reshape_batch", "Reshape", ["x", "rows"], [rows], ("N", 6))  # the batch into the rows
    ints = {k: onnx.numpy_helper.from_array(np.array(v, np.int64), k)
            for k, v in {"zero": 0, "one": 1, "axes": [0], "rest": [-1]}.items()}
    onnx.save(graph("fold_batch", [  # Reshape to [batch + 1, -1]: not a multiple of the batch
        h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "zero"], ["b"]),
        h.make_node("Add", ["b", "one"], ["b1"], name="b1"),
        h.make_node("Unsqueeze", ["b1", "axes"], ["u"]),
        h.make_node("Concat", ["u", "rest"], ["shape"], axis=0),
        h.make_node("Reshape", ["x", "shape"], ["y"])],
        [value("x", ["N", 6])], [value("y", None)], list(ints.values())),
        os.path.join(out, "fold_batch.onnx"))
    # Two Gemms reading one initializer (tied weights); a result that reaches nothing.
    onnx.save(graph("tied", [h.make_node("Gemm", ["x", "w"], ["a"], transB=1),
                             h.make_node("Gemm", ["a", "w"], ["y"], transB=1)],
                    [value("x", ["N", 4])], [value("y", ["N", 4])], [init("w", 4, 4)]),
              os.path.join(out, "tied.onnx"))
    onnx.save(graph("dead", [h.make_node("Relu", ["x"], ["y"]), h.make_node("Sigmoid", ["x"], ["z"]),
                             h.make_node("Tanh", ["z"], ["u"])],
                    [value("x", ["N", 4])], [value("y", ["N", 4])]),
              os.path.join(out, "dead.onnx"))
    one("pow_tensor", "Pow", ["x", "c"], [init("c", 2, 6, 6)])  # an exponent per position
    onnx.save(graph("avgpool_dilations", [h.make_node("AveragePool", ["x"], ["y"],
                                                      kernel_shape=[2, 2], dilations=[2, 2])],
                    [value("x", ["N", 2, 6, 6])], [value("y", None)], opset=19),
              os.path.join(out, "avgpool_dilations.onnx"))
    one("split_batch", "Split", ["x"], [], axis=0)
    one("equal_tensor", "Equal", ["x", "c"], [init("c", 1)])
    ln = [init("s", 6), init("b", 6)]
    onnx.save(graph("layernorm_batch", [h.make_node("LayerNormalization", ["x", "s", "b"], ["y"],
                                                    axis=0)],
                    [value("x", ["N", 6])], [value("y", None)], ln, opset=17),
              os.path.join(out, "layernorm_batch.onnx"))
    onnx.save(graph("layernorm_mean", [h.make_node("LayerNormalization", ["x", "s", "b"],
                                                   ["n", "mean"]),
                                       h.make_node("Add", ["n", "mean"], ["y"])],
                    [value("x", ["N", 6])], [value("y", None)], ln, opset=17),
              os.path.join(out, "layernorm_mean.onnx"))


def fashion_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))


def conv_backward_check():
    """Debian 13's PyTorch 2.6 (oneDNN 3.7.2, on AVX-512 machines) computes a
    wrong float32 Conv2d input gradient when the output channels are not a
    multiple of 16 (relative error 0.9 against float64 for [8, 4, 5, 5] *
    [6, 4, 3, 3]; 16, 32, 64 are right): the CNN and U-Net would train wrongly. Without oneDNN the native
    kernels are right; 1.13's oneDNN is too (then nothing changes)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn((8, 4, 5, 5), generator=g), torch.randn((6, 4, 3, 3), generator=g)
    go = torch.randn((8, 6, 3, 3), generator=g)
    dx = [torch.nn.grad.conv2d_input(x.shape, w.to(t), go.to(t)).double()
          for t in (torch.float32, torch.float64)]
    if float((dx[0] - dx[1]).abs().max() / dx[1].abs().max()) > 1e-5:
        print(f"make_models.py: PyTorch {torch.__version__}'s float32 Conv2d input gradient is "
              "wrong with oneDNN here: training with torch.backends.mkldnn.enabled = False",
              file=sys.stderr)
        torch.backends.mkldnn.enabled = False


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    conv_backward_check()
    os.makedirs(out, exist_ok=True)
    if len(sys.argv) > 2 and sys.argv[2] == "--fashion":  # example 04's models only
        torch.manual_seed(1)
        export(fashion_mlp(), (1, 28, 28), os.path.join(out, "fashion_mlp.onnx"))
        model = cnn()  # for --data synthetic and --predict
        export(model, (1, 10, 10), os.path.join(out, "cnn.onnx"))
        x = torch.randn(5, 1, 10, 10)
        np.save(os.path.join(out, "cnn_x.npy"), x.numpy())
        with torch.no_grad():
            np.save(os.path.join(out, "cnn_y.npy"), model.eval()(x).numpy())
        return
    for name in MODELS:
        make(out, name)
    make_refusals(out)
    make_axes(out)
    make_split(out)
    make_graph_refusals(out)
    with open(os.path.join(out, "manifest.txt"), "w") as f:
        f.write(f"{N} {BATCH} {STEPS} {LR}\n")


if __name__ == "__main__":
    main()
