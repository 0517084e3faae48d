"""Example 05 (hpsearch) at 4 ranks, as a user runs it.

check_hpsearch.py deterministic|diverged MPIEXEC HPSEARCH

deterministic: 2 groups x dp 2 twice with one seed give the same leaderboard,
  bit for bit (times aside); 1 group of dp 4 gives the same order and values
  to rounding.
diverged: SGD at lr 1e6 is recorded as diverged and tp 3 (which does not fit
  a group of 2) as failed, with their reasons; the other configurations
  complete.
Exits 77 (skipped) without the data set.
"""
import json
import os
import subprocess
import sys
import tempfile

DATA = os.environ.get("TELAR_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def search(mpiexec, exe, *flags):
    """Runs the search at 4 ranks; returns its JSON leaderboard."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "search.json")
        cmd = [mpiexec, "-np", "4", exe, "--data", DATA, "--json", path, "--seed", "3",
               "--steps", "10", *flags]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
        print(run.stdout)
        with open(path) as f:
            return json.load(f)


def without_times(result):
    board = result["leaderboard"]
    for entry in board:
        entry.pop("seconds")
        entry.pop("group")  # which group trained it: the only thing the group count changes
    return board


def deterministic(mpiexec, exe):
    grid = ["--lr", "1e-3,1e-2", "--optimizer", "sgd,adamw"]
    a = without_times(search(mpiexec, exe, "--groups", "2", *grid))
    b = without_times(search(mpiexec, exe, "--groups", "2", *grid))
    if a != b:
        sys.exit(f"same seed, different leaderboards:\n{a}\n{b}")
    c = without_times(search(mpiexec, exe, "--groups", "1", *grid))
    if [e["id"] for e in a] != [e["id"] for e in c]:
        sys.exit(f"1 group and 2 groups rank differently:\n{a}\n{c}")
    for x, y in zip(a, c):
        if abs(x["val_loss"] - y["val_loss"]) > 1e-4 * abs(x["val_loss"]):
            sys.exit(f"1 group and 2 groups differ beyond rounding:\n{x}\n{y}")


def diverged(mpiexec, exe):
    board = search(mpiexec, exe, "--groups", "2", "--lr", "1e-2,1e6", "--optimizer", "sgd",
                   "--tp", "1,3", "--rounds", "2")["leaderboard"]
    by = {(e["config"]["lr"], e["config"]["tp"]): e for e in board}
    huge = by[("1e6", "1")]
    if huge["status"] != "diverged" or not huge["reason"].startswith("diverged"):
        sys.exit(f"lr 1e6 is not recorded as diverged: {huge}")
    for lr in ("1e-2", "1e6"):
        bad = by[(lr, "3")]
        if bad["status"] != "failed" or "tp=3" not in bad["reason"]:
            sys.exit(f"tp 3 in a group of 2 is not recorded as failed: {bad}")
    good = by[("1e-2", "1")]
    if good["status"] != "finished" or good["rank"] != 1 or good["steps"] != 20:
        sys.exit(f"the healthy configuration did not complete both rounds first: {good}")


if __name__ == "__main__":
    check, mpiexec, exe = sys.argv[1:4]
    if not os.path.isdir(DATA):
        print(f"Fashion-MNIST not installed in {DATA}: skipped")
        sys.exit(77)
    {"deterministic": deterministic, "diverged": diverged}[check](mpiexec, exe)
