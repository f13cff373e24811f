#!/usr/bin/env python3
"""The peer of example_char_lstm's training step in PyTorch, for timing only (random ids, same shapes):
Embedding(97, 64) -> LSTM(64, 256, 2 layers, batch_first, dropout 0.1) -> Linear(256, 97), batch 32 x 64,
cross-entropy, AdamW. Prints ms per step and tokens/s over 10 steps after 3 warm-up steps.

    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /usr/bin/python3 examples/char_lstm/torch_peer.py [hidden]

Compare with the tok/s that `example_char_lstm "" 12` prints, interleaved (kiln, torch, torch, kiln).
"""
import sys
import time

import torch

torch.set_num_threads(2)
torch.manual_seed(0)
V, E, H, N, T = 97, 64, int(sys.argv[1]) if len(sys.argv) > 1 else 256, 32, 64
emb, head = torch.nn.Embedding(V, E), torch.nn.Linear(H, V)
lstm = torch.nn.LSTM(E, H, 2, batch_first=True, dropout=0.1)
params = list(emb.parameters()) + list(lstm.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01)
x, y = torch.randint(0, V, (N, T)), torch.randint(0, V, (N, T))
for i in range(13):
    if i == 3:
        t0 = time.time()
    out, _ = lstm(emb(x))
    loss = torch.nn.functional.cross_entropy(head(out).reshape(-1, V), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
dt = (time.time() - t0) / 10
print(f"torch {torch.__version__} hidden {H}: {dt * 1000:.1f} ms/step, {N * T / dt / 1000:.1f}k tok/s")
