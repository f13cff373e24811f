#!/usr/bin/env python3
"""The PyTorch peer of examples/fashion_mnist_cnn: the same CNN, optimiser, schedule, batch size and data,
trained with the same number of threads; prints one JSON line per epoch (seconds, images/s, test accuracy).

  KILN_NUM_THREADS=2 /usr/bin/python3 bench/conv/cnn_epoch_torch.py [data_dir] [epochs] [max_steps]

max_steps > 0 stops each epoch after that many batches (a shorter timing run); bench/conv/run.sh runs
this beside `example_fashion_mnist_cnn` and reports the ratio of their epoch times.
"""
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def load_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def split(d, name):
    def find(stem):
        p = os.path.join(d, stem)
        return p if os.path.exists(p) else p + ".gz"
    x = load_idx(find(f"{name}-images-idx3-ubyte")).astype(np.float32) / 255.0
    y = load_idx(find(f"{name}-labels-idx1-ubyte")).astype(np.int64)
    x = (x - 0.2860) / 0.3530  # the training split's mean and std, as the kiln example
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


def model():
    # examples/fashion_mnist_cnn/fashion_mnist_cnn.cpp builds the same network with the same names
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10)))


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/datasets/fashion-mnist"
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    max_steps = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    threads = int(os.environ.get("KILN_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    xtr, ytr = split(d, "train")
    xte, yte = split(d, "t10k")
    net = model()
    batch, peak_lr, warmup = 128, 2e-3, 100
    steps_per_epoch = math.ceil(len(xtr) / batch) if max_steps <= 0 else max_steps
    total = epochs * steps_per_epoch
    opt = torch.optim.AdamW(net.parameters(), lr=peak_lr, weight_decay=1e-4)

    def lr_at(step):  # linear warm-up, then cosine to 5% (kiln's "cosine" schedule)
        if step < warmup:
            return peak_lr * (step + 1) / warmup
        t = (step - warmup) / max(1, total - warmup)
        return peak_lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))

    step = 0
    for epoch in range(epochs):
        net.train()
        perm = torch.randperm(len(xtr))
        t0 = time.perf_counter()
        seen = 0
        for b in range(steps_per_epoch):
            idx = perm[b * batch:(b + 1) * batch]
            x, y = xtr[idx], ytr[idx]
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            seen += len(idx)
        secs = time.perf_counter() - t0
        net.eval()
        correct = 0
        with torch.no_grad():
            for b in range(0, len(xte), 1000):
                correct += (net(xte[b:b + 1000]).argmax(1) == yte[b:b + 1000]).sum().item()
        print(json.dumps({"peer": "pytorch " + torch.__version__, "epoch": epoch + 1, "seconds": round(secs, 3),
                          "images_per_s": round(seen / secs, 1), "test_accuracy": correct / len(xte),
                          "threads": threads}), flush=True)


if __name__ == "__main__":
    main()
