#!/usr/bin/python3
"""kiln train vs PyTorch 1.13 (Debian), PyTorch 2 eager and PyTorch 2 torch.compile, interleaved.

The same model, init, tokens and AdamW (tests/reference/kiln_ref.py, docs/specs.md §5) in every
framework; per variant the runs go in the order
  torch1.13, torch2-eager, torch2-compile, kiln, kiln, torch2-compile, torch2-eager, torch1.13
so each framework sees the machine's drift from both sides. Reported per framework: the fastest step
("ms" of its JSONL log) over steps 3.. of its two runs, and kiln's speed-up over each.
PyTorch 2 comes from bench/.venv-torch2 (bench/torch2/setup.sh); without it those columns are skipped.

  bench/train_vs_torch2.py [--kiln build/kiln] [--steps 12] [--isa native|avx2]
                           [--variants mha,diff,mha+attnres_block,d512:mha,gqa:mha]

A variant is [d512:|gqa:]attention[+residual]: d_model 256, 4 layers, 4 heads (diff: 2), T 128, B 8,
vocab 256 (bench/train_vs_ref.py's model); d512: d_model 512, 8 heads (diff: 4); gqa: n_kv_heads =
n_heads / 2. Threads: KILN_NUM_THREADS=2 for kiln, --threads 2 with OMP_WAIT_POLICY=PASSIVE for PyTorch.

--isa avx2 runs every framework as on an AVX2-only CPU (Zen 3) on a machine that has AVX-512, by
pinning each library that picks its kernels at run time, in every process:
  kiln's own loops        KILN_CPU_ISA=avx2
  oneDNN (kiln, torch)    ONEDNN_MAX_CPU_ISA=AVX2 (and DNNL_MAX_CPU_ISA, its older name)
  OpenBLAS (kiln's attention tiles, Debian's torch 1.13 GEMMs)  OPENBLAS_CORETYPE=Haswell (Zen's kernels)
  ATen's vectorised kernels (torch 2)  ATEN_CPU_CAPABILITY=avx2
  MKL (torch 2's f32 GEMMs)  MKL_ENABLE_INSTRUCTIONS=AVX2
  torch.compile's generated C++  ATEN_CPU_CAPABILITY, which Inductor's ISA choice follows, and
                          bench/torch2/ref_compile.py also sets cpp.simdlen = 256 under KILN_BENCH_SIMDLEN
Before the table the script prints what each library reports it uses (torch's CPU capability,
Inductor's vector ISA, MKL's and OpenBLAS's cores) and stops if a pin did not take.
"""
import argparse, json, os, re, shutil, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "tests", "reference", "kiln_ref.py")
COMPILE = os.path.join(HERE, "torch2", "ref_compile.py")
TORCH2 = os.path.join(HERE, ".venv-torch2", "bin", "python")
AVX2_ENV = {"KILN_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
            "OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "KILN_BENCH_SIMDLEN": "256"}
PROBE = os.path.join(HERE, "torch2", "probe_isa.py")
ORDER = ["torch1.13", "torch2-eager", "torch2-compile", "kiln", "kiln", "torch2-compile", "torch2-eager", "torch1.13"]


def model_config(variant, T):
    size, _, rest = variant.rpartition(":")
    att, _, res = rest.partition("+")
    D, heads = (512, 8) if size == "d512" else (256, 4)
    h = heads // 2 if att == "diff" else heads
    m = {"vocab_size": 256, "d_model": D, "n_layers": 4, "n_heads": h, "max_seq_len": T, "attention": att,
         "residual": res or "standard", "attnres_block_size": 4}
    if size == "gqa":
        m["n_kv_heads"] = h // 2
    return m


def fastest_ms(log):
    rows = [json.loads(l) for l in open(log) if l.strip()]
    return min(r["ms"] for r in rows[3:])


def check_avx2_pins(env, pythons):
    """Runs each interpreter's probe under the pins (MKL_VERBOSE and OPENBLAS_VERBOSE name the kernels)
    and stops unless every library reports AVX2-level code."""
    bad = []
    for py in pythons:
        out = subprocess.run([py, PROBE], env=dict(env, MKL_VERBOSE="1", OPENBLAS_VERBOSE="2"),
                             capture_output=True, text=True, check=True)
        text = out.stdout + out.stderr
        lines = [l for l in text.splitlines() if l.startswith(("torch", "inductor", "Core:"))
                 or re.match(r"MKL_VERBOSE (oneMKL|Intel)", l)]
        print(f"[{py}]", *lines, sep="\n  ", file=sys.stderr)
        if "cpu capability: AVX2" not in text:
            bad.append(f"{py}: ATen's capability is not AVX2")
        if "inductor vec isa:" in text and "inductor vec isa: VecAVX2" not in text:
            bad.append(f"{py}: Inductor's vector ISA is not AVX2")
        # MKL names its code path on Intel CPUs only ("... (Intel(R) AVX2) enabled processors"); on AMD it
        # prints "Intel(R) Architecture processors" and MKL_ENABLE_INSTRUCTIONS is its only pin.
        mkl = [l for l in lines if "enabled processors" in l]
        if mkl and not all("AVX2) enabled processors" in l for l in mkl):
            bad.append(f"{py}: MKL does not run its AVX2 code")
        core = re.findall(r"^Core: (\w+)", text, re.M)
        if core and core[0] not in ("Haswell", "Zen"):
            bad.append(f"{py}: OpenBLAS runs its {core[0]} kernels")
    if bad:
        sys.exit("--isa avx2: a pin did not take: " + "; ".join(bad))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "build", "kiln"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--variants", default="mha,diff,mha+attnres_block,d512:mha,gqa:mha")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native")
    a = ap.parse_args()
    base = dict(os.environ)
    if a.isa == "avx2":
        base.update(AVX2_ENV)
        check_avx2_pins(base, [p for p in ["/usr/bin/python3", TORCH2] if os.path.exists(p)])
    have2 = os.path.exists(TORCH2)
    if not have2:
        print(f"(no {TORCH2}: run bench/torch2/setup.sh for the PyTorch 2 columns)", file=sys.stderr)
    tmp = tempfile.mkdtemp(prefix="kiln-torch2-")
    try:
        B, T = 8, 128
        json.dump({"batch_size": B, "seq_len": T, "steps": a.steps}, open(os.path.join(tmp, "train.json"), "w"))
        tok = os.path.join(tmp, "tokens.safetensors")
        subprocess.check_call(["/usr/bin/python3", REF, "tokens", "--vocab", "256", "--n", "200000", "--out", tok])
        ver2 = subprocess.check_output([TORCH2, "-c", "import torch; print(torch.__version__)"], text=True).strip() if have2 else "-"
        print(f"PyTorch 2: {ver2}; fastest step of steps 3.. over two runs each, ms (kiln's speed-up)")
        print(f"| variant | PyTorch 1.13 | PyTorch {ver2} eager | PyTorch {ver2} compile | kiln |")
        print("|---|---|---|---|---|", flush=True)
        kenv = dict(base, KILN_NUM_THREADS="2")
        renv = dict(base, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="2")
        results = []
        for v in a.variants.split(","):
            m = os.path.join(tmp, f"{v.replace(':', '_')}.json")
            json.dump(model_config(v, T), open(m, "w"))
            init = m + ".init.safetensors"
            subprocess.check_call(["/usr/bin/python3", REF, "init", "--model", m, "--out", init])
            common = ["--model", m, "--train", os.path.join(tmp, "train.json"), "--data", tok, "--init-from", init]
            cmds = {"torch1.13": (["/usr/bin/python3", REF, "train", *common, "--threads", "2"], renv),
                    "torch2-eager": ([TORCH2, REF, "train", *common, "--threads", "2"], renv),
                    "torch2-compile": ([TORCH2, COMPILE, "train", *common, "--threads", "2"], renv),
                    "kiln": ([a.kiln, "train", *common, "--quiet"], kenv)}
            best = {}
            for i, who in enumerate(ORDER):
                if who.startswith("torch2") and not have2:
                    continue
                log = os.path.join(tmp, f"{v}.{i}.{who}.jsonl")
                cmd, env = cmds[who]
                subprocess.check_call([*cmd, "--log", log], env=env, stdout=subprocess.DEVNULL)
                best[who] = min(best.get(who, float("inf")), fastest_ms(log))
            k = best["kiln"]
            cell = lambda w: f"{best[w]:.1f} ms ({best[w] / k:.2f}x)" if w in best else "-"
            print(f"| {v} | {cell('torch1.13')} | {cell('torch2-eager')} | {cell('torch2-compile')} | **{k:.1f} ms** |", flush=True)
            results.append({"variant": v, **best})
        print(json.dumps(results))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
