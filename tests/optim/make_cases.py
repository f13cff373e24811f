# Reference values for tests/optim from PyTorch 1.13 (Debian's python3-torch): the learning rates of
# torch.optim.lr_scheduler step for step, torch.optim.RMSprop/Adagrad trajectories (and Lion's
# reference formula), an EMA of weights (AveragedModel), clip_grad_value_, clip_grad_norm_ per group and
# nn.Embedding's padding_idx. Usage: make_cases.py out.json (fixed seeds; run by the tests).
import json
import math
import sys
import warnings

import torch
import torch.optim.lr_scheduler as S

STEPS = 300


def scheduler_cases():
    def opt():
        p, q = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
        return torch.optim.SGD([{"params": [p], "lr": 0.1}, {"params": [q], "lr": 0.02}], lr=0.1)

    plateau_metrics = [1.0 / (1 + 0.05 * min(t, 60)) + 0.01 * math.sin(t) for t in range(STEPS)]
    cases = {
        "StepLR": lambda o: S.StepLR(o, step_size=30, gamma=0.5),
        "MultiStepLR": lambda o: S.MultiStepLR(o, milestones=[200, 50, 120, 120], gamma=0.3),
        "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.98),
        "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=100, eta_min=0.001),
        "CosineAnnealingWarmRestarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=20, T_mult=2, eta_min=1e-4),
        "CosineAnnealingWarmRestarts_mult1": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=37),
        "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=[0.5, 0.1], total_steps=STEPS, cycle_momentum=False),
        "OneCycleLR_linear3": lambda o: S.OneCycleLR(o, max_lr=0.3, epochs=3, steps_per_epoch=100, pct_start=0.25,
                                                     anneal_strategy="linear", three_phase=True, div_factor=10.0,
                                                     final_div_factor=100.0, cycle_momentum=False),
        "LinearLR": lambda o: S.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=40),
        "LinearLR_down": lambda o: S.LinearLR(o, start_factor=1.0, end_factor=0.05, total_iters=STEPS),
        "LambdaLR": lambda o: S.LambdaLR(o, lambda e: 0.95 ** e),
        "LambdaLR_groups": lambda o: S.LambdaLR(o, [lambda e: 1.0 / (1 + e), lambda e: 0.97 ** e]),
        "SequentialLR": lambda o: S.SequentialLR(
            o, [S.LinearLR(o, start_factor=0.01, total_iters=50), S.CosineAnnealingLR(o, T_max=250, eta_min=1e-5)], milestones=[50]),
        "SequentialLR_three": lambda o: S.SequentialLR(
            o, [S.LinearLR(o, start_factor=0.2, total_iters=30), S.ExponentialLR(o, gamma=0.99), S.StepLR(o, step_size=40, gamma=0.5)],
            milestones=[30, 150]),
        "SequentialLR_restarts": lambda o: S.SequentialLR(
            o, [S.ExponentialLR(o, gamma=0.9), S.CosineAnnealingWarmRestarts(o, T_0=25, T_mult=2)], milestones=[10]),
        "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, patience=5, cooldown=3, factor=0.5, min_lr=[1e-3, 1e-4]),
        "ReduceLROnPlateau_max_abs": lambda o: S.ReduceLROnPlateau(o, mode="max", threshold_mode="abs", threshold=0.01,
                                                                   patience=2, factor=0.7),
    }
    out = {}
    for name, make in cases.items():
        o = opt()
        s = make(o)
        plateau = isinstance(s, S.ReduceLROnPlateau)
        metrics = [-m for m in plateau_metrics] if name.endswith("max_abs") else plateau_metrics
        lrs = [[g["lr"] for g in o.param_groups]]
        for t in range(STEPS):
            o.step()
            if plateau:
                s.step(metrics[t])
            else:
                s.step()
            lrs.append([g["lr"] for g in o.param_groups])
            if not plateau:
                assert lrs[-1] == s.get_last_lr()
        out[name] = {"lrs": lrs, "metrics": metrics if plateau else []}
    return out


def lion_step(params, states, lr, betas, wds):
    for p, wd in zip(params, wds):
        if p.grad is None:
            continue
        st = states.setdefault(id(p), torch.zeros_like(p))
        p.data.mul_(1 - lr * wd)
        update = st.clone().mul_(betas[0]).add(p.grad, alpha=1 - betas[0]).sign_()
        p.data.add_(update, alpha=-lr)
        st.mul_(betas[1]).add_(p.grad, alpha=1 - betas[1])


def adafactor_step(params, states, step, lr, wds, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0):
    # torch.optim.Adafactor's single-tensor path (PyTorch 2.5+), with torch 1.13's ops
    for param, wd in zip(params, wds):
        grad = param.grad
        st = states.setdefault(id(param), {})
        eps1 = eps[0] if eps[0] is not None else torch.finfo(param.dtype).eps
        one_minus_beta2_t = step ** beta2_decay
        rho_t = min(lr, 1 / (step ** 0.5))
        alpha = max(eps[1], param.norm(2).item() / (param.numel() ** 0.5)) * rho_t
        with torch.no_grad():
            if wd != 0:
                param.mul_(1 - lr * wd)
            if grad.dim() > 1:
                row_var = st.setdefault("row", torch.zeros(grad.shape[:-1] + (1,), dtype=grad.dtype))
                col_var = st.setdefault("col", torch.zeros(grad.shape[:-2] + (1, grad.shape[-1]), dtype=grad.dtype))
                row_mean = torch.linalg.vector_norm(grad, dim=-1, keepdim=True).square_().div_(grad.size(-1))
                row_var.lerp_(row_mean, one_minus_beta2_t)
                col_mean = torch.linalg.vector_norm(grad, dim=-2, keepdim=True).square_().div_(grad.size(-2))
                col_var.lerp_(col_mean, one_minus_beta2_t)
                var_estimate = row_var @ col_var
                var_estimate.div_(row_var.mean(dim=-2, keepdim=True).clamp_(min=eps1))
            else:
                variance = st.setdefault("var", torch.zeros_like(grad))
                variance.lerp_(grad * grad, one_minus_beta2_t)
                var_estimate = variance.clone()
            update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
            update.mul_(grad)
            denom = max(1.0, update.norm(2).item() / ((update.numel() ** 0.5) * d))
            param.add_(update, alpha=-alpha / denom)


def optimizer_cases():
    configs = {
        "rmsprop": ("RMSprop", {}),
        "rmsprop_centered_momentum": ("RMSprop", {"lr": 0.01, "alpha": 0.9, "eps": 1e-6, "momentum": 0.9, "centered": True}),
        "rmsprop_momentum": ("RMSprop", {"lr": 0.003, "momentum": 0.5}),
        "rmsprop_centered": ("RMSprop", {"lr": 0.002, "centered": True}),
        "adagrad": ("Adagrad", {}),
        "adagrad_decay": ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1, "eps": 1e-8}),
        "lion": ("Lion", {"lr": 1e-3, "betas": (0.9, 0.99)}),
        "lion_betas": ("Lion", {"lr": 3e-3, "betas": (0.95, 0.98)}),
        "adafactor": ("Adafactor", {"lr": 1e-2}),
        "adafactor_options": ("Adafactor", {"lr": 0.05, "beta2_decay": -0.5, "eps": (1e-12, 1e-2), "d": 1.5}),
    }
    out = {}
    for dtype, dname in [(torch.float64, "f64"), (torch.float32, "f32")]:
        for name, (kind, kw) in configs.items():
            g = torch.Generator().manual_seed(7)
            p = torch.randn(4, 3, dtype=dtype, generator=g).requires_grad_()
            q = torch.randn(5, dtype=dtype, generator=g).requires_grad_()
            case = {"p0": p.detach().flatten().tolist(), "q0": q.detach().tolist(), "gp": [], "gq": [], "p": [], "q": []}
            if kind == "Lion":
                states = {}
                step = lambda: lion_step([p, q], states, kw["lr"], kw["betas"], [0.1, 0.0])
            elif kind == "Adafactor":
                states, count = {}, [0]
                # where PyTorch has Adafactor (2.5+), its own run checks this reference on copies
                ref = None
                if hasattr(torch.optim, "Adafactor"):
                    rp, rq = p.detach().clone().requires_grad_(), q.detach().clone().requires_grad_()
                    ref = (rp, rq, torch.optim.Adafactor([{"params": [rp], "weight_decay": 0.1}, {"params": [rq], "weight_decay": 0.0}], **kw))

                def step(states=states, count=count, kw=kw, ref=ref):
                    count[0] += 1
                    adafactor_step([p, q], states, count[0], kw["lr"], [0.1, 0.0], **{k: v for k, v in kw.items() if k != "lr"})
                    if ref is not None:
                        ref[0].grad, ref[1].grad = p.grad.clone(), q.grad.clone()
                        ref[2].step()
                        tol = 1e-12 if p.dtype == torch.float64 else 1e-6
                        assert torch.allclose(ref[0], p, rtol=tol, atol=tol * 1e-2), (ref[0], p)
                        assert torch.allclose(ref[1], q, rtol=tol, atol=tol * 1e-2), (ref[1], q)
            else:
                o = getattr(torch.optim, kind)([{"params": [p], "weight_decay": 0.1}, {"params": [q], "weight_decay": 0.0}], **kw)
                step = o.step
            for s in range(20):
                gp, gq = torch.randn(4, 3, dtype=dtype, generator=g), torch.randn(5, dtype=dtype, generator=g)
                case["gp"].append(gp.flatten().tolist())
                case["gq"].append(gq.tolist())
                p.grad, q.grad = gp.clone(), gq.clone()
                step()
                case["p"].append(p.detach().flatten().tolist())
                case["q"].append(q.detach().tolist())
            out[f"{name}_{dname}"] = case
    return out


def ema_cases():
    g = torch.Generator().manual_seed(3)
    model = torch.nn.Linear(3, 2).double()
    out = {}
    for name, decay, warmup in [("ema", 0.9, False), ("ema_warmup", 0.99, True)]:
        with torch.no_grad():
            for t in model.parameters():
                t.copy_(torch.randn(t.shape, dtype=torch.float64, generator=g))

        def avg(a, m, n, decay=decay, warmup=warmup):
            # n counts the copy AveragedModel makes first: kiln's EMA starts from that copy
            d = min(decay, (1.0 + (n - 1)) / (10.0 + (n - 1))) if warmup else decay
            return d * a + (1 - d) * m

        ema = torch.optim.swa_utils.AveragedModel(model, avg_fn=avg)
        ema.update_parameters(model)
        case = {"w0": model.weight.detach().flatten().tolist(), "b0": model.bias.detach().tolist(), "w": [], "b": [], "aw": [],
                "ab": []}
        for s in range(12):
            with torch.no_grad():
                for t in model.parameters():
                    t.add_(torch.randn(t.shape, dtype=torch.float64, generator=g))
            ema.update_parameters(model)
            case["w"].append(model.weight.detach().flatten().tolist())
            case["b"].append(model.bias.detach().tolist())
            case["aw"].append(ema.module.weight.detach().flatten().tolist())
            case["ab"].append(ema.module.bias.detach().tolist())
        out[name] = case
    out["ema_buffers"] = ema_buffer_case()
    return out


def ema_buffer_case():
    """AveragedModel(use_buffers=True): BatchNorm's floating buffers averaged like the weights. The
    model's whole state after each step (weights moved, running statistics moved by a training forward)
    and the averages of the floating entries (num_batches_tracked: AveragedModel truncates a float
    average into the integer; kiln keeps the model's count instead, so it is not compared)."""
    g = torch.Generator().manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).double()
    decay = 0.8
    ema = torch.optim.swa_utils.AveragedModel(model, avg_fn=lambda a, m, n: decay * a + (1 - decay) * m, use_buffers=True)
    ema.update_parameters(model)
    floating = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    case = {"decay": decay, "initial": {k: v.flatten().tolist() for k, v in model.state_dict().items()}, "states": [], "averages": []}
    for s in range(8):
        with torch.no_grad():
            for t in model.parameters():
                t.add_(torch.randn(t.shape, dtype=torch.float64, generator=g))
            model.train()
            model(torch.randn(5, 3, dtype=torch.float64, generator=g) * 3 + 1)
        ema.update_parameters(model)
        case["states"].append({k: v.flatten().tolist() for k, v in model.state_dict().items()})
        avg = ema.module.state_dict()
        case["averages"].append({k: avg[k].flatten().tolist() for k in floating})
    return case


def onecycle_momentum_cases():
    """OneCycleLR with cycle_momentum (torch's default): per step the lr and the groups' momentum (SGD,
    two groups, two phases, cos) or beta1 (AdamW, three phases, linear), and the AdamW weights after
    each step with fixed gradients, so the cycled beta1 (and its bias correction) is checked."""
    g = torch.Generator().manual_seed(6)
    out = {}
    for name in ["sgd", "adamw"]:
        p = torch.randn(4, dtype=torch.float64, generator=g).requires_grad_(True)
        q = torch.randn(3, dtype=torch.float64, generator=g).requires_grad_(True)
        case = {"p0": p.detach().tolist(), "q0": q.detach().tolist(), "lr": [], "momentum": [], "grads": [], "p": [], "q": []}
        if name == "sgd":
            o = torch.optim.SGD([{"params": [p]}, {"params": [q], "lr": 0.05}], lr=0.1, momentum=0.9)
            s = S.OneCycleLR(o, max_lr=[0.5, 0.2], total_steps=40, base_momentum=[0.8, 0.7], max_momentum=0.9)
        else:
            o = torch.optim.AdamW([{"params": [p]}, {"params": [q]}], lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
            s = S.OneCycleLR(o, max_lr=0.05, total_steps=40, pct_start=0.3, anneal_strategy="linear", three_phase=True)
        for t in range(40):
            case["lr"].append([gr["lr"] for gr in o.param_groups])
            case["momentum"].append([gr["momentum"] if name == "sgd" else gr["betas"][0] for gr in o.param_groups])
            gp, gq = torch.randn(4, dtype=torch.float64, generator=g), torch.randn(3, dtype=torch.float64, generator=g)
            p.grad, q.grad = gp.clone(), gq.clone()
            o.step()
            s.step() if t < 39 else None
            case["grads"].append([gp.tolist(), gq.tolist()])
            case["p"].append(p.detach().tolist())
            case["q"].append(q.detach().tolist())
        out[name] = case
    return out


def clip_cases():
    g = torch.Generator().manual_seed(5)
    ps = [torch.zeros(3, 4, dtype=torch.float64, requires_grad=True), torch.zeros(7, dtype=torch.float64, requires_grad=True),
          torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)]
    grads = [torch.randn(p.shape, dtype=torch.float64, generator=g) * 2 for p in ps]
    out = {"grads": [x.flatten().tolist() for x in grads]}
    for p, x in zip(ps, grads):
        p.grad = x.clone()
    torch.nn.utils.clip_grad_value_(ps, 0.7)
    out["value"] = [p.grad.flatten().tolist() for p in ps]
    # groups [ps[0], ps[1]] and [ps[2]], max norms 1.5 and 10 (the second is not clipped)
    for p, x in zip(ps, grads):
        p.grad = x.clone()
    n0 = torch.nn.utils.clip_grad_norm_(ps[:2], 1.5)
    n1 = torch.nn.utils.clip_grad_norm_(ps[2:], 10.0)
    out["group_norms"] = [n0.item(), n1.item()]
    out["per_group"] = [p.grad.flatten().tolist() for p in ps]
    return out


def embedding_cases():
    g = torch.Generator().manual_seed(9)
    emb = torch.nn.Embedding(10, 4, padding_idx=-3).double()
    assert emb.padding_idx == 7 and bool((emb.weight[7] == 0).all())
    with torch.no_grad():
        emb.weight.copy_(torch.randn(10, 4, dtype=torch.float64, generator=g))  # the padding row too: read as it is
    ids = torch.tensor([[1, 7, 3], [7, 7, 9]])
    y = emb(ids)
    dy = torch.randn(y.shape, dtype=torch.float64, generator=g)
    y.backward(dy)
    return {"weight": emb.weight.detach().flatten().tolist(), "ids": ids.flatten().tolist(), "y": y.detach().flatten().tolist(),
            "dy": dy.flatten().tolist(), "grad": emb.weight.grad.flatten().tolist()}


if __name__ == "__main__":
    warnings.filterwarnings("ignore")  # torch's deprecation notes for step(epoch), which SequentialLR calls itself
    torch.set_default_dtype(torch.float64)
    res = {"schedulers": scheduler_cases(), "optimizers": optimizer_cases(), "ema": ema_cases(), "onecycle_momentum": onecycle_momentum_cases(), "clip": clip_cases(),
           "embedding": embedding_cases()}
    with open(sys.argv[1], "w") as f:
        json.dump(res, f)
