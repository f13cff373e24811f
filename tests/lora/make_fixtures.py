#!/usr/bin/env python3
"""Regenerates tests/lora/fixtures/: tiny random base models, PEFT LoRA adapters on them and what PEFT
computes when it trains them (the reference values of tests/lora). Nothing is downloaded.

    scripts/hf_venv.sh && .venv-hf/bin/python tests/lora/make_fixtures.py
    PYTHONPATH=<transformers 5.24.0, peft 0.21.2> python tests/lora/make_fixtures.py phi3_qkv_gate_up

The second form makes only the Phi-3 base and case (fused qkv_proj with GQA and partial RoPE, and
gate_up_proj: transformers 4.51+), leaving the others; they were made with transformers 5.24.0, PEFT 0.21.2.

fixtures/<base>/ is a save_pretrained() directory (llama: GQA 4 heads / 2 kv heads, untied; gpt2;
llama_tok: a smaller Llama with tests/text/fixtures/gpt2's tokenizer, for the command-line test).
fixtures/<case>/ for each case:
  adapter_init/   the adapter before training (PEFT save_pretrained; lora_A and lora_B random, B != 0)
  adapter_final/  the adapter after STEPS AdamW steps
  expected.json   base, ids [2, T], losses (one per step, the loss before the step's update),
                  logits_init (the logits of ids[0] with the initial adapter, [T, vocab] row-major),
                  logits_merged (the same after merge_and_unload)
"""
import json
import os
import shutil
import sys

import torch
import transformers.generation.utils as gu
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

gu.is_fsdp_managed_module = lambda m: False  # torch 1.13's FSDP module fails to import on Python 3.11

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
VOCAB, T, STEPS, LR, WD = 64, 12, 3, 1e-3, 0.01


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_((0.25 if p.dim() > 1 else 0.1) * torch.randn(p.shape, generator=g))


def make_base(name, cls, config, seed):
    torch.manual_seed(seed)
    model = cls(config).eval()
    randomize(model, seed)
    d = os.path.join(OUT, name)
    model.save_pretrained(d, safe_serialization=True)
    gen = os.path.join(d, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    return d


def save(peft, d):
    peft.save_pretrained(d)
    os.remove(os.path.join(d, "README.md"))  # PEFT's model card: not needed
    path = os.path.join(d, "adapter_config.json")
    with open(path) as f:
        config = json.load(f)
    config["base_model_name_or_path"] = os.path.basename(config["base_model_name_or_path"])  # not this machine's path
    if isinstance(config["target_modules"], list):
        config["target_modules"] = sorted(config["target_modules"])  # PEFT writes a set: in any order
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def model_class(base):
    if base == "phi3":
        from transformers import Phi3ForCausalLM
        return Phi3ForCausalLM
    return LlamaForCausalLM if "llama" in base else GPT2LMHeadModel


def run_case(case, base, lora, seed):
    torch.manual_seed(seed)
    model = model_class(base)
    model = model.from_pretrained(os.path.join(OUT, base))
    peft = get_peft_model(model, lora)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    d = os.path.join(OUT, case)
    save(peft, os.path.join(d, "adapter_init"))
    ids = torch.randint(0, VOCAB, (2, T), generator=g)
    peft.eval()
    with torch.no_grad():
        logits_init = peft(ids[:1]).logits[0]
    peft.train()
    opt = torch.optim.AdamW([p for p in peft.parameters() if p.requires_grad], lr=LR, weight_decay=WD)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = peft(ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    save(peft, os.path.join(d, "adapter_final"))
    # Merge of the initial adapter: the same logits as unmerged (the reference for kiln's merge_lora).
    fresh = model_class(base).from_pretrained(os.path.join(OUT, base))
    merged = PeftModel.from_pretrained(fresh, os.path.join(d, "adapter_init")).merge_and_unload().eval()
    with torch.no_grad():
        logits_merged = merged(ids[:1]).logits[0]
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"base": base, "ids": ids.tolist(), "lr": LR, "weight_decay": WD, "losses": losses,
                   "logits_init": logits_init.flatten().tolist(), "logits_merged": logits_merged.flatten().tolist()}, f)
        f.write("\n")


def phi3_case():
    from transformers import Phi3Config, Phi3ForCausalLM
    make_base("phi3", Phi3ForCausalLM,
              Phi3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}), 4)
    # Phi-3's fused qkv_proj (q, k, v of different sizes with GQA; q and k with RoPE rows, partial) and gate_up_proj.
    run_case("phi3_qkv_gate_up", "phi3", LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["qkv_proj", "gate_up_proj"],
                                                    task_type="CAUSAL_LM"), 50)


def main():
    if sys.argv[1:] == ["phi3_qkv_gate_up"]:
        phi3_case()
        return
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    make_base("llama", LlamaForCausalLM,
              LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False), 1)
    make_base("gpt2", GPT2LMHeadModel,
              GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0, embd_pdrop=0,
                         attn_pdrop=0), 2)
    # For `kiln train --init-from DIR` on a text file: a Llama with the byte-level BPE tokenizer of
    # tests/text/fixtures/gpt2 (800 tokens and 2 special ones), small enough to train a few steps in a test.
    d = make_base("llama_tok", LlamaForCausalLM,
                  LlamaConfig(vocab_size=802, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True), 3)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(HERE, "..", "text", "fixtures", "gpt2", f), d)
    run_case("llama_qv", "llama", LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"), 10)
    # PEFT's string form: a regex over the whole module path (kiln's glob "*.mlp.*_proj" matches the same; ".*\.mlp\..*"
    # would match act_fn too, which PEFT, like kiln, rejects).
    run_case("llama_mlp_regex", "llama", LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=r".*\.mlp\..*_proj",
                                                    task_type="CAUSAL_LM"), 20)
    # GPT-2's fused c_attn (PEFT's default target for GPT-2): one adapter, lora_B [3D, r]; kiln's q, k, v share it.
    run_case("gpt2_c_attn", "gpt2", LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn"],
                                               fan_in_fan_out=True, task_type="CAUSAL_LM"), 40)
    # GPT-2's Conv1D modules (fan_in_fan_out): attn.c_proj, mlp.c_fc, mlp.c_proj.
    run_case("gpt2_conv1d", "gpt2", LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["c_proj", "c_fc"],
                                               fan_in_fan_out=True, task_type="CAUSAL_LM"), 30)


if __name__ == "__main__":
    main()
