#!/usr/bin/env python3
"""pipetrain's training run in PyTorch: the peer of perf/train_vs_torch.sh (a benchmark, not a test).

The same model (784-1024-1024-1024-10, ReLU, pipetrain's initialisation: uniform, sqrt(6 / in) for the
ReLU layers, sqrt(6 / (in + out)) for the last, zero biases), the same data (Fashion-MNIST from Debian's
dataset-fashion-mnist, bytes x 1/255; 5,000 training rows held out, as pipetrain --val 5000, so an epoch is
the same 214 steps of 256 rows, the last partial batch dropped), the same loss (mean softmax
cross-entropy) and optimizer with pipetrain's defaults: AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, no
weight decay, gradients clipped to global norm 1, a linear warm-up of min(total / 20, 100) steps and a
cosine decay to 0 (mbp_optim_lr). Only the training loop is timed (gathering each batch included, as
pipetrain's samples/s includes it).

  /usr/bin/python3 perf/pipetrain_torch.py [--threads 2] [--epochs 1] [--batch 256] [--limit N]
                                           [--profile STEPS] [--data DIR]

--threads N sets torch.set_num_threads(N) and, before torch loads, OPENBLAS_NUM_THREADS=N (PyTorch's
set_num_threads does not reach OpenBLAS, which runs Debian's torch's float products). --profile STEPS
runs that many steps under torch.profiler after a warm-up and prints the time per operator per step.
Prints one grep-able line:
  pipetrain_torch: threads=N epochs=E steps=S samples_per_s=X test_acc=A train_s=T blas=... kernel=...
"""
import argparse
import ctypes
import ctypes.util
import gzip
import math
import os
import sys
import time

DATA = "/usr/share/datasets/fashion-mnist"


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--val", type=int, default=5000)
    p.add_argument("--limit", type=int, default=0, help="training rows (0: all)")
    p.add_argument("--layers", default="784,1024,1024,1024,10")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", type=int, default=0, metavar="STEPS")
    p.add_argument("--data", default=DATA)
    return p.parse_args()


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return shape, raw[4 + 4 * dims :]


def load(torch, data, part):
    shape, img = idx(os.path.join(data, f"{part}-images-idx3-ubyte.gz"))
    _, lab = idx(os.path.join(data, f"{part}-labels-idx1-ubyte.gz"))
    x = torch.frombuffer(bytearray(img), dtype=torch.uint8).reshape(shape[0], -1).float() / 255.0
    y = torch.frombuffer(bytearray(lab), dtype=torch.uint8).long()
    return x.contiguous(), y


def blas_kernel():
    """Which OpenBLAS the process loaded and its kernel (from the library itself)."""
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            lib.openblas_get_config.restype = ctypes.c_char_p
            return lib.openblas_get_config().decode(), lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return "unknown", "unknown"


def lr_factor(t, warmup, total):
    """mbp_optim_lr over the base rate, min_lr 0."""
    if t < warmup:
        return (t + 1) / warmup
    if total <= warmup:
        return 1.0
    if t >= total:
        return 0.0
    p = (t - warmup) / (total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * p))


def main():
    a = parse()
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch  # after the variables: OpenBLAS reads its thread count when it loads

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x, y = load(torch, a.data, "train")
    xt, yt = load(torch, a.data, "t10k")
    perm = torch.randperm(x.shape[0])
    tr = perm[a.val :]
    if a.limit:
        tr = tr[: a.limit]
    xtr, ytr = x[tr].contiguous(), y[tr].contiguous()
    widths = [int(w) for w in a.layers.split(",")]
    layers = []
    for i in range(len(widths) - 1):
        lin = torch.nn.Linear(widths[i], widths[i + 1])
        last = i + 2 == len(widths)
        s = math.sqrt(6.0 / (widths[i] + widths[i + 1])) if last else math.sqrt(6.0 / widths[i])
        with torch.no_grad():
            lin.weight.uniform_(-s, s)
            lin.bias.zero_()
        layers.append(lin)
        if not last:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    spe = xtr.shape[0] // a.batch
    total = spe * a.epochs
    warmup = min(total // 20, 100)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: lr_factor(t, warmup, total))
    lossf = torch.nn.CrossEntropyLoss()

    def step(xb, yb):
        opt.zero_grad(set_to_none=False)
        loss = lossf(model(xb), yb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        return loss

    config, core = blas_kernel()
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        order = torch.randperm(xtr.shape[0])
        for k in range(3):  # warm-up
            b = order[k * a.batch : (k + 1) * a.batch]
            step(xtr[b], ytr[b])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for k in range(a.profile):
                b = order[(3 + k) * a.batch : (4 + k) * a.batch]
                step(xtr[b], ytr[b])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
        # self time per step of each operator, in microseconds, one line each (grep-able)
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total):
            if e.self_cpu_time_total / a.profile >= 5:
                print(
                    f"pipetrain_torch_profile: op={e.key} calls_per_step={e.count / a.profile:g} "
                    f"self_us_per_step={e.self_cpu_time_total / a.profile:.1f}"
                )
        return 0

    seen = 0
    t0 = time.perf_counter()
    for ep in range(a.epochs):
        order = torch.randperm(xtr.shape[0])
        for k in range(spe):
            b = order[k * a.batch : (k + 1) * a.batch]
            loss = step(xtr[b], ytr[b])
            seen += a.batch
    train_s = time.perf_counter() - t0
    if not math.isfinite(loss.item()):
        print("pipetrain_torch: FAILED: the loss is not finite", file=sys.stderr)
        return 1
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    print(
        f"pipetrain_torch: threads={a.threads} epochs={a.epochs} steps={total} batch={a.batch} "
        f"samples_per_s={seen / train_s:.0f} test_acc={acc:.4f} train_s={train_s:.2f} "
        f"torch={torch.__version__} blas={config.replace(' ', '_')} kernel={core}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
