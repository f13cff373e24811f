#!/usr/bin/env python3
"""Regenerates tests/hf/fixtures/: tiny random Hugging Face checkpoints and what transformers computes
from them (the reference values of tests/hf). Nothing is downloaded: every model is built here from a
config, its weights drawn from a seeded generator.

    scripts/hf_venv.sh && .venv-hf/bin/python tests/hf/make_fixtures.py [NAME ...]

NAME: only these fixtures (default: all). qwen3, qwen3_yarn, qwen3_window, mistral_window, gemma, gemma2,
gemma3, gemma3_mm, phi3 and phi3_longrope need transformers 4.51 or later (the venv's 4.46.3 has no Qwen3 or Gemma 3, and its sliding-window masks
are older); they are made only when named, and were made with
transformers 5.24.0 and torch 2.15 (pip install transformers==5.24.0 into a
directory on PYTHONPATH, with a current torch), the others with the venv.

Each fixtures/<name>/ holds a save_pretrained() directory (config.json, generation_config.json,
model.safetensors or the sharded model-*.safetensors + model.safetensors.index.json) and expected.json:
  prompt          the prompt ids
  logits          transformers' f32 logits of the whole prompt, [len(prompt), vocab] row-major
  greedy          generate(do_sample=False, max_new_tokens) ids after the prompt (stopped at EOS if any)
  max_new_tokens  the generation length asked for
  batch           (some models) prompts of different lengths, left-padded for transformers, and the
                  greedy ids it generates for each, padding and anything after EOS removed
fixtures/samplers.json: transformers' logits processors (repetition penalty, temperature, top-k, top-p)
applied to one row of scores.
"""
import json
import os
import shutil
import sys

import torch
import transformers
import transformers.generation.utils as gu
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

gu.is_fsdp_managed_module = lambda m: False  # torch 1.13's FSDP module fails to import on Python 3.11

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
VOCAB = 96


def randomize(model, seed, norm_center=1.0):
    """Weights large enough that the logits are far from uniform (greedy ids are then not decided by
    rounding): matrices N(0, 0.25^2), norm weights norm_center + N(0, 0.1^2) (Gemma's norms scale by
    1 + weight: center 0), biases N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or ".ln_" in name or name.endswith("ln_f.weight")) and name.endswith("weight"):
                p.copy_(norm_center + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=g))


def greedy(model, ids, n, **kw):
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, **kw)
    return out[0, len(ids):].tolist()


def make_fixture(name, cls, config, seed, dtype=torch.float32, shard=None, eos_at=None, batch=False, norm_center=1.0, eos_batch=None):
    torch.manual_seed(seed)
    model = cls(config).eval()
    randomize(model, seed, norm_center)
    prompt = [int(i) for i in torch.randint(3, VOCAB, (7,), generator=torch.Generator().manual_seed(seed + 1))]
    n = 12
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    # What is stored is what the reference computes from: round to the storage dtype first.
    # (the parameters only: model.to() would round RoPE's inv_freq buffer too, which a reload does not)
    if dtype != torch.float32:
        with torch.no_grad():
            for prm in model.parameters():
                prm.copy_(prm.to(dtype).to(torch.float32))
    model.generation_config.pad_token_id = 0
    if eos_at is not None:  # stop at a greedy token first generated at index eos_at or later
        plain = greedy(model, prompt, n)
        model.generation_config.eos_token_id = next(t for i, t in enumerate(plain) if i >= eos_at and t not in plain[:i])
    else:
        model.generation_config.eos_token_id = None
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0]
    exp = {"prompt": prompt, "logits": [float(x) for x in logits.flatten()], "vocab": VOCAB, "max_new_tokens": n,
           "greedy": greedy(model, prompt, n)}
    if batch:
        prompts = [prompt, prompt[2:5], prompt[1:] + [5, 9]]
        L = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n)[:, L:].tolist()
        eos = model.generation_config.eos_token_id
        for row in out:
            if eos is not None and eos in row:
                del row[row.index(eos) + 1:]
        exp["batch"] = {"prompts": prompts, "greedy": out}
    if eos_batch is not None:  # (eos id, prompts): a left-padded batch in which a row ends at EOS while the others go on
        eos, prompts = eos_batch
        L = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=0)[:, L:].tolist()
        for row in out:
            if eos in row:
                del row[row.index(eos) + 1:]
        exp["eos_batch"] = {"eos": eos, "prompts": prompts, "greedy": out}
    model = model.to(dtype)
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(d, safe_serialization=True, **kw)
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(exp, f)
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{name}: {size} bytes, greedy {exp['greedy']}")


def samplers():
    g = torch.Generator().manual_seed(7)
    scores = 3 * torch.randn((1, VOCAB), generator=g)
    history = torch.tensor([[3, 17, 17, 40, 5, 88]])
    cases = []
    for rp, t, k, p in [(1.3, 0.7, 10, 0.8), (1.0, 1.0, 0, 0.5), (0.8, 1.5, 5, 1.0), (1.1, 1.0, 0, 0.95)]:
        s = scores.clone()
        if rp != 1.0:
            s = RepetitionPenaltyLogitsProcessor(rp)(history, s)
        if t != 1.0:
            s = TemperatureLogitsWarper(t)(history, s)
        if k:
            s = TopKLogitsWarper(k)(history, s)
        if p < 1.0:
            s = TopPLogitsWarper(p)(history, s)
        cases.append({"repetition_penalty": rp, "temperature": t, "top_k": k, "top_p": p,
                      "out": [None if x == float("-inf") else float(x) for x in s[0]]})
    with open(os.path.join(OUT, "samplers.json"), "w") as f:
        json.dump({"history": history[0].tolist(), "scores": [float(x) for x in scores[0]], "cases": cases}, f)


def yarn_variants():
    """fixtures/yarn.json: transformers' YaRN frequencies and attention factor for rope_parameters where the
    correction range falls inside the head (so truncate matters), with beta_*, mscale and an explicit
    attention_factor, and the defaults of original_max_position_embeddings and factor: what kiln's
    rope_inv_freq must give (head_dim 16, theta 10000, max_position_embeddings 8192)."""
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cases = []
    for p in [{"factor": 4.0, "original_max_position_embeddings": 2048},
              {"factor": 4.0, "original_max_position_embeddings": 2048, "truncate": False},
              {"factor": 8.0, "original_max_position_embeddings": 512, "beta_fast": 16, "beta_slow": 2, "mscale": 1.0,
               "mscale_all_dim": 0.5},
              {"factor": 2.0, "original_max_position_embeddings": 1024, "attention_factor": 1.5},
              {"factor": 4.0},  # original_max_position_embeddings: max_position_embeddings
              {"factor": None, "original_max_position_embeddings": 2048}]:  # factor: 8192 / 2048, the first case's
        params = {"rope_type": "yarn", "rope_theta": 10000.0, **p}
        cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                          head_dim=16, max_position_embeddings=8192, rope_parameters=dict(params))
        inv, af = ROPE_INIT_FUNCTIONS["yarn"](cfg)
        cases.append({"rope_parameters": params, "inv_freq": [float(x) for x in inv], "attention_factor": float(af)})
    with open(os.path.join(OUT, "yarn.json"), "w") as f:
        json.dump(cases, f, indent=1)


def main():
    os.makedirs(OUT, exist_ok=True)
    only = set(sys.argv[1:])
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64)

    def make(name, *args, **kw):
        if not only or name in only:
            make_fixture(name, *args, **kw)

    make("gpt2", GPT2LMHeadModel,
         GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=64,
                    activation_function="gelu_new", bos_token_id=1, eos_token_id=2), seed=1, eos_at=6, batch=True)
    make("llama", LlamaForCausalLM,
         LlamaConfig(**small, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0), seed=2, batch=True)
    make("llama3_bf16", LlamaForCausalLM,
         LlamaConfig(**dict(small, num_attention_heads=2), num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500000.0,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 16}),
         seed=3, dtype=torch.bfloat16)
    make("qwen2", Qwen2ForCausalLM,
         Qwen2Config(**small, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0, use_sliding_window=False),
         seed=4, shard="20KB", eos_at=4, batch=True)
    make("mistral", MistralForCausalLM,
         MistralConfig(**small, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False, sliding_window=4096), seed=5)
    if "qwen3" in only:  # Qwen3 (transformers 4.51+): q_norm/k_norm on each head, head_dim != hidden/heads, o_proj bias too
        from transformers import Qwen3Config, Qwen3ForCausalLM
        make("qwen3", Qwen3ForCausalLM,
             Qwen3Config(**small, num_key_value_heads=2, head_dim=16, attention_bias=True, tie_word_embeddings=False,
                         rope_theta=1000000.0, bos_token_id=1, eos_token_id=2),
             seed=6, eos_at=5, batch=True)
    if "qwen3_yarn" in only:  # YaRN RoPE scaling (transformers 5's _compute_yarn_parameters), as Qwen's long-context advice
        from transformers import Qwen3Config, Qwen3ForCausalLM
        make("qwen3_yarn", Qwen3ForCausalLM,
             Qwen3Config(**small, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                          "original_max_position_embeddings": 16}),
             seed=7, batch=True)
        yarn_variants()
    if "qwen3_window" in only:  # sliding-window attention in layer 1 (max_window_layers 1), window 4: prompts of 7 and decoding reach past it
        from transformers import Qwen3Config, Qwen3ForCausalLM
        make("qwen3_window", Qwen3ForCausalLM,
             Qwen3Config(**small, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, use_sliding_window=True,
                         sliding_window=4, max_window_layers=1),
             seed=8, batch=True)
    if "mistral_window" in only:  # Mistral's window acts in every layer: 5 positions
        make("mistral_window", MistralForCausalLM,
             MistralConfig(**small, num_key_value_heads=2, tie_word_embeddings=False, sliding_window=5), seed=9, batch=True)
    if "gemma" in only:  # (1 + w) norms, √hidden embedding scale, tanh-GELU gated MLP, MQA, tied head
        from transformers import GemmaConfig, GemmaForCausalLM
        make("gemma", GemmaForCausalLM,
             GemmaConfig(**small, num_key_value_heads=1, head_dim=16, hidden_act="gelu", bos_token_id=1, eos_token_id=2),
             seed=10, batch=True, norm_center=0.0)
    if "gemma2" in only:  # post norms, query_pre_attn_scalar != head_dim, window 4 in layer 0, strong attention and final caps, untied
        from transformers import Gemma2Config, Gemma2ForCausalLM
        make("gemma2", Gemma2ForCausalLM,
             Gemma2Config(**small, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                          attn_logit_softcapping=2.0, final_logit_softcapping=5.0, tie_word_embeddings=False),
             seed=11, batch=True, norm_center=0.0)
    if "gemma3" in only:  # q/k norms, the sliding layers' own RoPE (10000) against linear-scaled 1e6 in the full one, window 4, untied
        from transformers import Gemma3TextConfig, Gemma3ForCausalLM
        make("gemma3", Gemma3ForCausalLM,
             Gemma3TextConfig(**dict(small, num_hidden_layers=3), num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                              sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                              tie_word_embeddings=False,
                              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
             seed=12, batch=True, norm_center=0.0)
    if "phi3" in only:  # fused qkv_proj with GQA (q, k, v of different sizes) and gate_up_proj, partial RoPE 0.5, window 5
        from transformers import Phi3Config, Phi3ForCausalLM
        make("phi3", Phi3ForCausalLM,
             Phi3Config(**small, num_key_value_heads=2, sliding_window=5,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                        bos_token_id=1, eos_token_id=2, pad_token_id=0),
             seed=13, batch=True)
    # longrope past original_max_position_embeddings 8: the prompt (7) takes the short factors, decoding the long; in
    # eos_batch the longest row ends at once and still decides the switch (transformers keeps it in the batch)
    if "phi3_longrope" in only:
        from transformers import Phi3Config, Phi3ForCausalLM
        make("phi3_longrope", Phi3ForCausalLM,
             Phi3Config(**small, original_max_position_embeddings=8,
                        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.3, 2.1, 3.7],
                                         "long_factor": [1.1, 2.9, 7.5, 16.0]},
                        bos_token_id=1, eos_token_id=2, pad_token_id=0),
             seed=14, batch=True, eos_batch=(85, [[10, 11, 12, 13, 14, 15, 16], [20, 21], [30, 31, 32]]))
    if "gemma3_mm" in only:  # Gemma3ForConditionalGeneration (4B-27B): kiln reads its text model; a tiny vision tower beside it, untied
        from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig
        text = Gemma3TextConfig(**dict(small, num_hidden_layers=3), num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                                sliding_window=4, sliding_window_pattern=3, tie_word_embeddings=False)
        vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                                    patch_size=14)
        make("gemma3_mm", Gemma3ForConditionalGeneration,
             Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, boi_token_index=93, eoi_token_index=94,
                          image_token_index=95, tie_word_embeddings=False),
             seed=15, batch=True, norm_center=0.0)
    if not only or "samplers" in only:
        samplers()
    print("transformers", transformers.__version__, "torch", torch.__version__)


if __name__ == "__main__":
    main()
