# Writes tests/optim/adam_torch.json: torch.optim.Adam and torch.optim.AdamW (PyTorch 1.13) over 5 steps
# in float64 with weight decay, as kiln's optim::Adam and optim::AdamW must follow them with their
# default options (test "optimizers: Adam is torch.optim.Adam and AdamW is torch.optim.AdamW by default").
# Parameters p [4, 3] (decayed: rank 2, optim::decay_groups) and q [5] (not decayed), one gradient
# sequence for every case. Usage: python make_adam_fixture.py [out.json] (fixed seed; committed output).
import json
import os
import sys

import torch

CASES = {
    # name: (torch class, kwargs; the weight decay goes to p's group only)
    "adam_wd": (torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1}),
    "adamw_wd": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    "adam_defaults": (torch.optim.Adam, {}),
    "adamw_defaults": (torch.optim.AdamW, {}),  # weight_decay 0.01
}
STEPS = 5


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adam_torch.json") if len(sys.argv) < 2 else sys.argv[1]
    torch.manual_seed(0)
    p0 = torch.randn(4, 3, dtype=torch.float64)
    q0 = torch.randn(5, dtype=torch.float64)
    grads = [(torch.randn(4, 3, dtype=torch.float64), torch.randn(5, dtype=torch.float64)) for _ in range(STEPS)]
    res = {"torch": torch.__version__, "steps": STEPS, "p0": p0.flatten().tolist(), "q0": q0.tolist(),
           "gp": [g[0].flatten().tolist() for g in grads], "gq": [g[1].tolist() for g in grads], "cases": {}}
    for name, (cls, kw) in CASES.items():
        p, q = p0.clone().requires_grad_(), q0.clone().requires_grad_()
        wd = kw.get("weight_decay", cls([torch.zeros(1, requires_grad=True)]).defaults["weight_decay"])
        kw = {k: v for k, v in kw.items() if k != "weight_decay"}
        opt = cls([{"params": [p], "weight_decay": wd}, {"params": [q], "weight_decay": 0.0}], **kw)
        traj = {"p": [], "q": []}
        for gp, gq in grads:
            p.grad, q.grad = gp.clone(), gq.clone()
            opt.step()
            traj["p"].append(p.detach().flatten().tolist())
            traj["q"].append(q.detach().tolist())
        res["cases"][name] = traj
    with open(out, "w") as f:
        json.dump(res, f, indent=None)
        f.write("\n")


if __name__ == "__main__":
    main()
