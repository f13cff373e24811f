#!/usr/bin/python3
"""How far bf16 training ends from f32 training, kiln against PyTorch on the same model and data.

For each seed, one set of initial weights (the reference's init_params) is trained four times for
--steps steps: `kiln train` with "precision" f32 and bf16, and the PyTorch reference
(tests/reference/kiln_ref.py's model, optimiser, schedule and batches) in f32 and under
torch.autocast("cpu", torch.bfloat16). Each run's final held-out loss is the mean cross-entropy over
the first eval_batches batches of the eval tokens (kiln train's evaluation; under the run's
precision). Prints a row per seed and the means, and the bf16 - f32 gap of each framework.

The question it answers: is kiln's bf16 gap on this model kiln's, or bf16's? At a few hundred
steps one seed is not a measurement (the final loss of a run moves by percents with the order of a
few additions); the peer's gap, from the same starting weights, is the yardstick.

  bench/amp/bf16_gap.py --kiln build/kiln --data out/char_gpt/train.safetensors \
      --eval-data out/char_gpt/eval.safetensors [--steps 300] [--seeds 0,1,2]

Defaults: examples/char_gpt's model.json and train.json (the main job's model), 2 threads each.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import kiln_ref  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def torch_run(model_json, tc, init, tokens, eval_tokens, bf16, threads):
    torch.set_num_threads(threads)
    args = argparse.Namespace(model=model_json, init_from=init, seed=0)
    _, model = kiln_ref.build(args, torch.float32)
    opt = kiln_ref.make_optimizer(model, tc)
    B, T = tc["batch_size"], tc["seq_len"]

    def loss_of(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))

    for step in range(tc["steps"]):
        for g in opt.param_groups:
            g["lr"] = kiln_ref.lr_at(step, tc)
        x, y = kiln_ref.batch(tokens, step, B, T)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        if tc.get("grad_clip", 0.0):
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
        opt.step()
    with torch.no_grad():
        losses = [loss_of(*kiln_ref.batch(eval_tokens, i, B, T)).item() for i in range(tc["eval_batches"])]
    return statistics.fmean(losses)


def kiln_run(kiln, model_json, tc, init, data, eval_data, prec, tmp, threads):
    t = dict(tc, precision=prec, eval_every=tc["steps"])
    tj, log = os.path.join(tmp, f"train_{prec}.json"), os.path.join(tmp, f"log_{prec}.jsonl")
    json.dump(t, open(tj, "w"))
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    subprocess.run([kiln, "train", "--model", model_json, "--train", tj, "--data", data, "--eval-data", eval_data,
                    "--init-from", init, "--log", log, "--quiet"], env=env, check=True)
    recs = [json.loads(line) for line in open(log) if line.strip()]
    return recs[-1]["eval_loss"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "char_gpt", "model.json"))
    ap.add_argument("--train", default=os.path.join(ROOT, "examples", "char_gpt", "train.json"))
    ap.add_argument("--data", required=True)
    ap.add_argument("--eval-data", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    tc = dict(kiln_ref.TRAIN_DEFAULTS, **json.load(open(a.train)))
    tc["steps"] = a.steps
    tc["shuffle"] = False  # the reference reads consecutive windows (kiln_ref.batch): the same batches for both
    tc.setdefault("eval_batches", 8)
    tokens = kiln_ref.load_safetensors(a.data)["tokens"]
    eval_tokens = kiln_ref.load_safetensors(a.eval_data)["tokens"]
    tmp = tempfile.mkdtemp(prefix="kiln-bf16-gap-")
    cols = ("kiln f32", "kiln bf16", "torch f32", "torch bf16")
    print(f"{a.steps} steps of {os.path.relpath(a.model)}, held-out loss after the last step ({a.threads} threads)")
    print(f"{'seed':>4} " + " ".join(f"{c:>10}" for c in cols) + f" {'kiln gap':>9} {'torch gap':>9}")
    rows = []
    for seed in (int(s) for s in a.seeds.split(",")):
        init = os.path.join(tmp, f"init{seed}.safetensors")
        _, m = kiln_ref.build(argparse.Namespace(model=a.model, init_from=None, seed=seed), torch.float32)
        kiln_ref.save_safetensors(init, {n: p.detach() for n, p in m.named_parameters()})
        r = [kiln_run(a.kiln, a.model, tc, init, a.data, a.eval_data, p, tmp, a.threads) for p in ("f32", "bf16")]
        r += [torch_run(a.model, tc, init, tokens, eval_tokens, bf16, a.threads) for bf16 in (False, True)]
        rows.append(r)
        print(f"{seed:>4} " + " ".join(f"{v:10.4f}" for v in r) + f" {100 * (r[1] / r[0] - 1):+8.2f}% {100 * (r[3] / r[2] - 1):+8.2f}%",
              flush=True)
    mean = [statistics.fmean(c) for c in zip(*rows)]
    print(f"{'mean':>4} " + " ".join(f"{v:10.4f}" for v in mean) +
          f" {100 * (mean[1] / mean[0] - 1):+8.2f}% {100 * (mean[3] / mean[2] - 1):+8.2f}%")


if __name__ == "__main__":
    main()
