#pragma once
// kiln, all of it: #include <kiln/kiln.hpp>. (Or include only the parts you use, e.g.
// <kiln/nn/linear.hpp>: each public header compiles on its own.)
#include "kiln/version.hpp"

#include "kiln/backends/dispatch.hpp"  // Cpu, Reference (, Cuda), kiln::dispatch
#include "kiln/core/tensor.hpp"

#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/gradcheck.hpp"
#include "kiln/autograd/var.hpp"

#include "kiln/nn/attention.hpp"
#include "kiln/nn/attnres.hpp"
#include "kiln/nn/batch_norm.hpp"
#include "kiln/nn/container.hpp"
#include "kiln/nn/diff2_attention.hpp"
#include "kiln/nn/diff_attention.hpp"
#include "kiln/nn/embedding.hpp"
#include "kiln/nn/generate.hpp"  // nn::generate: greedy, sampling, KV cache (GPT and Hugging Face models)
#include "kiln/nn/gpt.hpp"
#include "kiln/nn/group_norm.hpp"
#include "kiln/nn/hf/causal_lm.hpp"  // hf::load_causal_lm: GPT-2, Llama, Mistral, Qwen2 directories
#include "kiln/nn/hf/export.hpp"     // hf::save_pretrained: back to a Hugging Face directory
#include "kiln/nn/init.hpp"
#include "kiln/nn/layers.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/lora.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/norm.hpp"
#include "kiln/nn/transformer.hpp"

#include "kiln/optim/adafactor.hpp"
#include "kiln/optim/ema.hpp"
#include "kiln/optim/lion.hpp"
#include "kiln/optim/optimizer.hpp"
#include "kiln/optim/rmsprop.hpp"
#include "kiln/optim/schedule.hpp"
#include "kiln/optim/scheduler.hpp"

#include "kiln/dist/ddp.hpp"
#include "kiln/dist/process_group.hpp"
#include "kiln/dist/zero.hpp"
#include "kiln/train/dist_fit.hpp"

#include "kiln/formats/hf_dir.hpp"
#include "kiln/formats/idx.hpp"
#include "kiln/formats/safetensors.hpp"

#include "kiln/text/bpe_trainer.hpp"
#include "kiln/text/tokenizer.hpp"

#include "kiln/train/config.hpp"
#include "kiln/train/data.hpp"
#include "kiln/train/dataloader.hpp"
#include "kiln/train/loop.hpp"
#include "kiln/train/plot.hpp"
#include "kiln/train/progress.hpp"
#include "kiln/train/text.hpp"
#include "kiln/train/trainer.hpp"

#include "kiln/nn/conv.hpp"
#include "kiln/nn/einsum.hpp"
#include "kiln/nn/pool.hpp"
#include "kiln/nn/upsample.hpp"
