"""PyTorch side of the mixed-precision tests (tests/amp): torch.autocast("cpu", bfloat16) on the
reference GPT (tests/reference/kiln_ref.py) and on single ops.

  amp_ref.py grads --model m.json --data tok.safetensors --init-from init.safetensors --batch B --seq-len T --out f [--prepare]
      one forward + loss + backward under autocast (prefix "amp.") and in float64 (prefix "f64."):
      loss, logits and the gradient of every parameter.
  amp_ref.py ops --seed S --out f
      inputs ("in.*") and torch's results ("out.*") of single ops under autocast.
  amp_ref.py conv --seed S --out f
      conv2d under torch.autocast("cpu", bfloat16), and conv_transpose2d as newer PyTorch's autocast
      runs it, by hand (bf16-rounded operands, float32 compute, bf16-rounded results; 1.13's CPU
      autocast keeps it in float32); conv2d by hand too where torch has no bf16 convolution (below
      AVX-512): inputs ("in.<op>.*"), outputs and gradients ("out.<op>.*"), "out.<op>.native" = 1
      where torch.autocast itself ran.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.environ.get("KILN_REFERENCE_DIR", os.path.join(os.path.dirname(__file__), "..", "reference")))
import kiln_ref  # noqa: E402


def run_model(args, dtype, autocast):
    _, model = kiln_ref.build(args, dtype)
    tokens = kiln_ref.load_safetensors(args.data)["tokens"]
    x, y = kiln_ref.batch(tokens, 0, args.batch, args.seq_len)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    out = {"loss": loss.detach().reshape(1), "logits": logits.detach()}
    out.update({"grad." + n: p.grad for n, p in model.named_parameters()})
    return out


def cmd_grads(args):
    torch.set_num_threads(2)
    if args.prepare:  # write the initial weights and the tokens first (kiln_ref.py init / tokens, one process)
        kiln_ref.cmd_init(argparse.Namespace(model=args.model, seed=3, out=args.init_from))
        V = kiln_ref.resolve_model(kiln_ref.load_config(args.model, kiln_ref.MODEL_DEFAULTS))["vocab_size"]
        kiln_ref.cmd_tokens(argparse.Namespace(vocab=V, n=3000, seed=1, out=args.data))
    amp = run_model(args, torch.float32, True)
    assert amp["logits"].dtype == torch.bfloat16 and amp["loss"].dtype == torch.float32
    ref = run_model(args, torch.float64, False)
    out = {"amp." + k: v.float() for k, v in amp.items()}
    out.update({"f64." + k: v for k, v in ref.items()})
    kiln_ref.save_safetensors(args.out, out)


def cmd_ops(args):
    g = torch.Generator().manual_seed(args.seed)
    M, K, N = 37, 300, 45
    a = torch.randn(M, K, generator=g)
    b = torch.randn(K, N, generator=g)
    w = torch.randn(N, K, generator=g) / K ** 0.5
    bias = torch.randn(N, generator=g)
    xb = (torch.randn(M, N, generator=g) * 3).bfloat16()  # a low-precision activation
    t = torch.randint(0, N, (M,), generator=g)
    out = {"in.a": a, "in.b": b, "in.w": w, "in.bias": bias, "in.xb": xb.float(), "in.t": t}
    gw = torch.linspace(-1, 1, N)
    out["in.gw"] = gw
    # Twice: as torch runs on this CPU, and with oneDNN off ("fallback"). Torch 1.13 takes oneDNN's bf16
    # GEMM (f32 accumulation) only where the CPU has AVX-512 BW/VL/DQ; elsewhere (AVX2-only CPUs) its own
    # bf16 GEMM, which accumulates in bf16. The fallback shows that path on every machine.
    for suffix, mkldnn in (("", True), (".fallback", False)):
        a.grad = b.grad = None
        a.requires_grad_(True)
        b.requires_grad_(True)
        with torch.backends.mkldnn.flags(enabled=mkldnn):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                mm = a @ b
                lin = F.linear(a, w, bias)
            assert mm.dtype == torch.bfloat16 and lin.dtype == torch.bfloat16
            (mm.float() * gw).sum().backward()  # a gradient through the casts
        out.update({"out.mm" + suffix: mm.detach().float(), "out.linear" + suffix: lin.detach().float(),
                    "out.mm.grad_a" + suffix: a.grad.clone(), "out.mm.grad_b" + suffix: b.grad.clone()})
    # The f32 list: what torch.autocast("cuda") runs in float32 (the CPU autocast of 1.13 keeps these in
    # bfloat16; kiln follows the CUDA lists on every device), i.e. the op on the input cast up.
    xf = xb.float()
    out.update({"out.softmax": F.softmax(xf, -1), "out.log_softmax": F.log_softmax(xf, -1),
                "out.cross_entropy": F.cross_entropy(xf, t).reshape(1), "out.sum": xf.sum(-1), "out.mean": xf.mean(0),
                "out.exp": (xf / 4).exp(), "out.layer_norm": F.layer_norm(xf, (N,))})
    kiln_ref.save_safetensors(args.out, out)


CONV_ARGS = {"conv2d": dict(stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2),
             "conv_transpose2d": dict(stride=2, padding=1, output_padding=1, groups=2)}


def conv_emulated(op, x, w, b, gy):
    """What autocast runs, by hand: operands rounded to bf16, f32 compute, output and gradients rounded to bf16."""
    leaves = [t.bfloat16().float().requires_grad_(True) for t in (x, w, b)]
    y = getattr(F, op)(*leaves, **CONV_ARGS[op])
    y.backward(gy.bfloat16().float())  # autocast's cast backward rounds the incoming gradient
    return y.detach().bfloat16().float(), [t.grad.bfloat16().float() for t in leaves]


def cmd_conv(args):
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(args.seed)
    out = {}
    for op, xs, ws, bs in (("conv2d", (2, 6, 9, 8), (4, 3, 3, 3), 4), ("conv_transpose2d", (2, 4, 5, 6), (4, 3, 3, 3), 6)):
        x, w, b = torch.randn(*xs, generator=g), torch.randn(*ws, generator=g), torch.randn(bs, generator=g)
        with torch.no_grad():
            shape = getattr(F, op)(x, w, b, **CONV_ARGS[op]).shape
        gy = torch.randn(*shape, generator=g)
        out.update({f"in.{op}.x": x, f"in.{op}.w": w, f"in.{op}.b": b, f"in.{op}.gy": gy})
        native = op == "conv2d"  # 1.13's CPU autocast lists conv2d low, conv_transpose2d not
        if native:
            try:
                leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    y = F.conv2d(*leaves, **CONV_ARGS[op])
                assert y.dtype == torch.bfloat16
                (y.float() * gy).sum().backward()
                y, grads = y.detach().float(), [t.grad for t in leaves]
            except RuntimeError:  # no bf16 convolution in torch's oneDNN below AVX-512 (e.g. an AVX2-only CPU)
                native = False
        if not native:
            y, grads = conv_emulated(op, x, w, b, gy)
        out.update({f"out.{op}.y": y, f"out.{op}.grad_x": grads[0], f"out.{op}.grad_w": grads[1], f"out.{op}.grad_b": grads[2],
                    f"out.{op}.native": torch.tensor([1.0 if native else 0.0])})
    kiln_ref.save_safetensors(args.out, out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("grads")
    for k in ("model", "data", "init_from", "out"):
        p.add_argument("--" + k.replace("_", "-"), required=True)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--prepare", action="store_true", help="first write --init-from (seed 3) and --data (3000 tokens, seed 1)")
    p.set_defaults(fn=cmd_grads)
    p = sub.add_parser("ops")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_ops)
    p = sub.add_parser("conv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_conv)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
