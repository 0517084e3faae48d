#!/usr/bin/python3
"""Loads Telar's exported ONNX files back into PyTorch and checks that they
reproduce Telar's outputs: for each model (ResNet-18 and the U-Net with their
BatchNorms' trained running statistics), the initializers of
<name>_telar.onnx go into the PyTorch module by name (torch.onnx.export named
them after the module's parameters), and the module's output on <name>_x.bin
must equal <name>_telar_y.bin (Telar's output after training).
Run: /usr/bin/python3 check_export.py FIXTURE_DIR"""
import os
import sys

import numpy as np
import onnx
import torch
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_models  # noqa: E402


def check(out, name):
    factory, shape, _ = make_models.MODELS[name]
    model = factory().eval()
    m = onnx.load(os.path.join(out, name + "_telar.onnx"))
    onnx.checker.check_model(m)
    state = model.state_dict()
    loaded = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in m.graph.initializer}
    with open(os.path.join(out, name + "_sources.txt")) as f:  # onnx::MatMul_<n>: a transpose
        for init, key, transposed in (line.split() for line in f):
            loaded[key] = loaded[init].T if transposed == "1" else loaded[init]
    # BatchNorm's num_batches_tracked is no initializer (only momentum=None reads it).
    wanted = [k for k in state if not k.endswith("num_batches_tracked")]
    missing = set(wanted) - set(loaded)
    if missing:
        raise SystemExit(f"{name}: parameters missing from the export: {sorted(missing)}")
    model.load_state_dict({k: loaded[k] for k in wanted}, strict=False)
    x = np.fromfile(os.path.join(out, name + "_x.bin"), dtype=np.float32)
    x = torch.from_numpy(x.reshape((-1,) + shape))
    if name in make_models.TOKENS:
        x = x.long()
    want = np.fromfile(os.path.join(out, name + "_telar_y.bin"), dtype=np.float32)
    with torch.no_grad():
        got = model(x).numpy().ravel()
    err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
    print(f"{name}: PyTorch on Telar's export vs Telar: relative error {err:.3g}")
    tol = 1e-4 if name in make_models.ZOO else 1e-5
    if not err <= tol:
        raise SystemExit(f"{name}: relative error {err} > {tol}")


def main():
    out = sys.argv[1]
    for name in make_models.MODELS:
        check(out, name)


if __name__ == "__main__":
    main()
