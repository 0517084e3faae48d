# Reference values for tests/core/test_batch_norm.cpp, from PyTorch:
#   /usr/bin/python3 tests/core/batch_norm_reference.py
# x(i, f) = sin(0.7 (i * K + f) + 0.3 * step) * 2 + f % 3, for samples [C, L] = [2, 3],
# 4 samples; gamma = [1.5, -0.5], beta = [0.25, 1.0]; momentum 0.1, eps 1e-5.
import math
import torch

N, C, L = 4, 2, 3
K = C * L


def batch(step):
    v = [[math.sin(0.7 * (i * K + f) + 0.3 * step) * 2 + f % 3 for f in range(K)] for i in range(N)]
    return torch.tensor(v, dtype=torch.float64).reshape(N, C, L)


bn = torch.nn.BatchNorm1d(C, eps=1e-5, momentum=0.1).double()
with torch.no_grad():
    bn.weight.copy_(torch.tensor([1.5, -0.5]))
    bn.bias.copy_(torch.tensor([0.25, 1.0]))
bn.train()
y0 = bn(batch(0))
bn(batch(1))
bn.eval()
y2 = bn(batch(2))


def show(name, t):
    print(name, "= {" + ", ".join("%.15g" % v for v in t.reshape(-1).tolist()) + "};")


show("train_y0", y0.detach())
show("running_mean", bn.running_mean)
show("running_var", bn.running_var)
show("eval_y2", y2.detach())
