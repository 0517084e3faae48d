#!/usr/bin/python3
"""PyTorch peer of Telar's MLP benchmark.

The same model and step Telar benchmarks: MLP 784-2048-2048-10 with ReLU
between the layers, softmax cross-entropy loss, plain SGD (lr 0.01), fp32
(or, with --precision bf16, forward under torch.autocast('cpu',
dtype=torch.bfloat16): bf16 matmuls, fp32 weights and optimizer), batch 128
per rank, one thread per rank, synthetic random inputs. Times N
steps (zero_grad + forward + backward + optimizer step) after a warm-up and
prints the configuration, the median and mean step time, and one JSON line
per run (a line starting with '{"peer":"pytorch"').

    /usr/bin/python3 bench/peers/mlp_torch.py                  # 1 rank, no DDP
    /usr/bin/python3 bench/peers/mlp_torch.py --ddp --ranks 2  # DDP over gloo, 2 processes
    /usr/bin/python3 bench/peers/mlp_torch.py --sweep          # 1 rank, then DDP at 2: weak scaling
    /usr/bin/python3 bench/peers/mlp_torch.py --precision bf16 # autocast bf16, 1 rank

The JSON line's "gemm_kernels" lists the oneDNN implementations that ran
the matmuls of one extra step (ONEDNN_VERBOSE through
torch.backends.mkldnn.verbose), or "blas:<BLAS_INFO>" when none ran through
oneDNN (fp32 matmuls go to PyTorch's BLAS).

With --ddp the script starts its own ranks (torch.multiprocessing.spawn) and
joins them with torch.distributed's gloo backend over the loopback interface
only (MASTER_ADDR=127.0.0.1, a free port). Each rank keeps batch 128 (weak
scaling), so ideal scaling keeps the step time constant; the weak-scaling
efficiency is T(1 rank) / T(R ranks). A step's time at R ranks is the
slowest rank's time for that step.
"""

import argparse
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time

# One thread per rank, set before torch loads its thread pools.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

FEATURES, HIDDEN, CLASSES = 784, 2048, 10


def make_model(hidden):
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, CLASSES),
    )


def free_port():
    # Ask the OS for a free loopback port; tiny race until gloo binds it, acceptable here.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def onednn_kernels(step):
    """oneDNN matmul implementations that one more step runs (sorted, unique)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 1)  # oneDNN's verbose lines go to the C stdout
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                step()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        lines = f.read().decode(errors="replace").splitlines()
    found = set()
    for line in lines:
        parts = line.split(",")
        if len(parts) > 4 and parts[1] == "exec" and parts[3] in ("matmul", "inner_product"):
            found.add(parts[3] + ":" + parts[4])
    return sorted(found)


def blas_info():
    """The BLAS PyTorch was built with (BLAS_INFO of torch.__config__.show())."""
    for part in torch.__config__.show().replace("\n", ",").split(","):
        if "BLAS_INFO=" in part:
            return part.split("BLAS_INFO=", 1)[1].strip()
    return "unknown"


def run_rank(rank, world, args, ddp, port, results):
    """One rank: build the model, warm up, time args.steps steps."""
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already fixed in this process
    torch.manual_seed(args.seed)  # same initial weights on every rank, as DDP expects
    if ddp:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
        dist.init_process_group("gloo", rank=rank, world_size=world)

    model = make_model(args.hidden)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    gen = torch.Generator().manual_seed(args.seed + 1000 * (rank + 1))
    x = torch.randn(args.batch, FEATURES, generator=gen)
    y = torch.randint(0, CLASSES, (args.batch,), generator=gen)

    def forward_context():
        if args.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step():
        opt.zero_grad(set_to_none=True)
        with forward_context():
            loss = loss_fn(model(x), y)
        loss.backward()  # under DDP this includes the gradient allreduce
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    if ddp:
        dist.barrier()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1e3)

    if ddp:
        # Per step, the slowest rank sets the pace.
        mine = torch.tensor(times, dtype=torch.float64)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        times = torch.stack(everyone).max(dim=0).values.tolist()
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        result = {"times": times, "loss": float(loss),
                  "kernels": [] if ddp else onednn_kernels(step)}
        if results is not None:
            results.put(result)
        else:
            return result
    return None


def measure(ranks, ddp, args):
    """Runs one configuration and returns its summary dict."""
    if ddp:
        ctx = mp.get_context("spawn")
        results = ctx.SimpleQueue()
        mp.spawn(run_rank, args=(ranks, args, True, free_port(), results), nprocs=ranks, join=True)
        out = results.get()
    else:
        out = run_rank(0, 1, args, False, None, None)
    times = out["times"]
    median = statistics.median(times)
    return {
        "peer": "pytorch",
        "model": "mlp-%d-%d-%d-%d" % (FEATURES, args.hidden, args.hidden, CLASSES),
        "ranks": ranks,
        "ddp": ddp,
        "backend": "gloo" if ddp else "none",
        "batch_per_rank": args.batch,
        "global_batch": args.batch * ranks,
        "threads_per_rank": args.threads,
        "dtype": "float32",
        "precision": args.precision,
        "gemm_kernels": ",".join(out["kernels"]) or "blas:" + blas_info(),
        "optimizer": "sgd(lr=%g)" % args.lr,
        "warmup": args.warmup,
        "steps": args.steps,
        "step_ms_median": round(median, 3),
        "step_ms_mean": round(statistics.fmean(times), 3),
        "step_ms_min": round(min(times), 3),
        "step_ms_max": round(max(times), 3),
        "step_ms_stdev": round(statistics.stdev(times), 3) if len(times) > 1 else 0.0,
        "samples_per_s": round(args.batch * ranks / median * 1e3, 1),
        "final_loss": round(out["loss"], 5),
        "torch": torch.__version__,
    }


def report(r):
    print("  ranks %d (%s): step median %.2f ms, mean %.2f ms, min %.2f, max %.2f, stdev %.2f; "
          "%.0f samples/s" % (r["ranks"], "DDP/gloo" if r["ddp"] else "serial", r["step_ms_median"],
                              r["step_ms_mean"], r["step_ms_min"], r["step_ms_max"],
                              r["step_ms_stdev"], r["samples_per_s"]))
    print(json.dumps(r), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ddp", action="store_true", help="run under torch.distributed (gloo)")
    p.add_argument("--ranks", type=int, default=1, help="processes with --ddp (default 1)")
    p.add_argument("--sweep", action="store_true",
                   help="1 rank without DDP, then DDP at --sweep-ranks; prints weak-scaling efficiency")
    p.add_argument("--sweep-ranks", default="2", help="comma-separated rank counts for --sweep (default 2)")
    p.add_argument("--steps", type=int, default=50, help="timed steps (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--batch", type=int, default=128, help="batch per rank (default 128)")
    p.add_argument("--hidden", type=int, default=HIDDEN, help="hidden width (default 2048)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    args = p.parse_args()
    if args.ranks < 1 or args.steps < 1 or args.batch < 1:
        p.error("--ranks, --steps and --batch must be positive")
    if args.ranks > 1 and not args.ddp and not args.sweep:
        p.error("--ranks > 1 needs --ddp")

    print("PyTorch peer: MLP %d-%d-%d-%d, ReLU, softmax cross-entropy, SGD lr %g, %s, "
          "batch %d per rank, %d thread(s) per rank" %
          (FEATURES, args.hidden, args.hidden, CLASSES, args.lr,
           "fp32" if args.precision == "fp32" else "autocast bf16", args.batch, args.threads))
    print("  torch %s, %s, %d cores visible; %d warm-up + %d timed steps" %
          (torch.__version__, cpu_model(), os.cpu_count() or 0, args.warmup, args.steps))

    if not args.sweep:
        report(measure(args.ranks, args.ddp, args))
        return 0

    base = measure(1, False, args)
    report(base)
    for ranks in [int(r) for r in args.sweep_ranks.split(",") if r]:
        r = measure(ranks, True, args)
        r["weak_scaling_efficiency"] = round(base["step_ms_median"] / r["step_ms_median"], 3)
        report(r)
        print("  weak-scaling efficiency at %d ranks: %.1f%% (T1 %.2f ms / T%d %.2f ms)" %
              (ranks, 100 * r["weak_scaling_efficiency"], base["step_ms_median"], ranks,
               r["step_ms_median"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
