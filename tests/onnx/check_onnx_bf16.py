"""check_onnx_bf16.py MPIEXEC ONNX_TRAIN SRC OUT

Example 04 under --precision bf16, as a user runs it, on models exported
from PyTorch (make_models.py --fashion, written to OUT):
- --predict: the CNN's outputs are PyTorch's within bf16's rounding, and
  further from them than the fp32 run's (bf16 ran);
- --data synthetic, dp 2, AdamW: the JSON says bf16 (precision, the bf16
  GEMM and convolution policies, oneDNN's bf16 kernels), the loss falls
  below chance and the test accuracy rises above it; the exported model
  passes onnx's checker, holds trained values, and --predict runs it;
- the MLP's Gemm, Relu, Gemm as a Megatron pair at tp 2 trains in bf16;
- with the instructions hidden (TELAR_TEST_HIDE_BF16=1) the run is refused
  before the import, and with TELAR_BF16_FALLBACK=fp32 it runs fp32 and its
  JSON says so.
Exits 77 (skipped) on a CPU without AVX512-BF16 or AMX.
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import numpy_helper

MPIEXEC, EXE, SRC, OUT = sys.argv[1:5]
HIDDEN = "--precision bf16: this CPU lacks the AVX512-BF16"


def run(ranks, *args, env=None, ok=True):
    cmd = [MPIEXEC, "-n", str(ranks), EXE, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    if ok and r.returncode != 0:
        if HIDDEN in r.stderr:
            print(f"no bf16 instructions: skipped\n{r.stderr}")
            sys.exit(77)
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def summary(r):
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])


def predict(precision):
    out = os.path.join(OUT, f"cnn_{precision}.npy")
    run(1, "--model", os.path.join(OUT, "cnn.onnx"), "--predict", os.path.join(OUT, "cnn_x.npy"),
        "--output", out, "--precision", precision)
    want = np.load(os.path.join(OUT, "cnn_y.npy"))
    return float(np.abs(np.load(out) - want).max() / np.abs(want).max())


os.makedirs(OUT, exist_ok=True)
subprocess.run([sys.executable, os.path.join(SRC, "make_models.py"), OUT, "--fashion"], check=True)

fp32, bf16 = predict("fp32"), predict("bf16")
print(f"--predict: relative difference from PyTorch fp32 {fp32:.2e}, bf16 {bf16:.2e}")
if not (fp32 <= 1e-5 and bf16 <= 3e-2 and bf16 > 10 * fp32):
    sys.exit("--predict --precision bf16 is not PyTorch's output within bf16's rounding")

exported = os.path.join(OUT, "cnn_bf16_trained.onnx")
r = run(2, "--model", os.path.join(OUT, "cnn.onnx"), "--data", "synthetic", "--dp", "2",
        "--batch", "16", "--epochs", "20", "--optimizer", "adamw", "--lr", "0.01",
        "--precision", "bf16", "--json", "--export", exported)
s = summary(r)
c = s["config"]
print("bf16 training:", {k: s[k] for k in ("final_loss", "test_accuracy", "steps")},
      {k: c[k] for k in ("precision", "gemm", "conv", "gemm_kernels")})
if c["precision"] != "bf16" or c["gemm"] != "onednn-bf16" or c["conv"] != "onednn-bf16" or \
        "matmul" not in c["gemm_kernels"] or "bf16" not in c["gemm_kernels"]:
    sys.exit(f"--precision bf16 did not run oneDNN's bf16 kernels: {c}")
if not (s["final_loss"] < 0.9 * math.log(3) and s["test_accuracy"] >= 0.6):  # chance: 1/3
    sys.exit(f"onnx_train --precision bf16 did not learn: {s}")

model = onnx.load(exported)
onnx.checker.check_model(model)
start = {t.name: numpy_helper.to_array(t) for t in onnx.load(os.path.join(OUT, "cnn.onnx")).graph.initializer}
moved = [t.name for t in model.graph.initializer
         if not np.array_equal(numpy_helper.to_array(t), start[t.name])]
if len(moved) != len(start):
    sys.exit(f"the exported model holds untrained values: only {moved} of {sorted(start)} moved")
run(1, "--model", exported, "--predict", os.path.join(OUT, "cnn_x.npy"),
    "--output", os.path.join(OUT, "cnn_bf16_trained.npy"))
if not np.isfinite(np.load(os.path.join(OUT, "cnn_bf16_trained.npy"))).all():
    sys.exit("the exported model's outputs are not finite")

r = run(2, "--model", os.path.join(OUT, "fashion_mlp.onnx"), "--data", "synthetic", "--tp", "2",
        "--batch", "16", "--limit-steps", "4", "--optimizer", "adamw", "--precision", "bf16",
        "--json")
s = summary(r)
if s["config"]["tp"] != 2 or "bf16" not in s["config"]["gemm_kernels"] or \
        not math.isfinite(s["final_loss"]):
    sys.exit(f"the Megatron pair did not train in bf16 at tp 2: {s}")

r = run(1, "--model", os.path.join(OUT, "cnn.onnx"), "--data", "synthetic", "--limit-steps", "1",
        "--optimizer", "adamw", "--precision", "bf16", ok=False,
        env=dict(os.environ, TELAR_TEST_HIDE_BF16="1"))
if r.returncode == 0 or HIDDEN not in r.stderr:
    sys.exit(f"a CPU without bf16 was not refused:\n{r.stderr}")
r = run(1, "--model", os.path.join(OUT, "cnn.onnx"), "--data", "synthetic", "--limit-steps", "1",
        "--optimizer", "adamw", "--precision", "bf16", "--json",
        env=dict(os.environ, TELAR_TEST_HIDE_BF16="1", TELAR_BF16_FALLBACK="fp32"))
c = summary(r)["config"]
if c["precision"] != "fp32 (TELAR_BF16_FALLBACK)" or "bf16" in c["gemm_kernels"]:
    sys.exit(f"the fp32 fallback's JSON does not say what ran: {c}")
print("exported model loads, trained; tp 2 trains; no bf16 instructions refused, "
      "or run fp32 when the fallback is asked for")
