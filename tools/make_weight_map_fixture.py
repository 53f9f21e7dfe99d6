#!/usr/bin/env python3
"""Writes tests/fixtures/model/hf_weight_maps.json: for a small config of each
supported family, the config.json transformers itself writes (5.x dialect) and
the parameter names and shapes of the model transformers builds from it.
tests/model/weight_map_test.cpp checks ramtrain's weight table against it.

Run from the repository root: python3 tools/make_weight_map_fixture.py
"""
import json
import os

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

# Small shapes that still exercise every feature: GQA, head_dim != hidden/heads
# (qwen3), tied embeddings (qwen2), llama3 RoPE scaling (llama).
CASES = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=120,
                  max_position_embeddings=16384, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  rope_theta=500000.0, bos_token_id=100, eos_token_id=[101, 102],
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=8192)),
    "mistral": dict(model_type="mistral", architectures=["MistralForCausalLM"], hidden_size=64, intermediate_size=160,
                    num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, vocab_size=90,
                    max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=56, intermediate_size=80,
                  num_hidden_layers=2, num_attention_heads=7, num_key_value_heads=1, vocab_size=100,
                  max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1e6,
                  use_sliding_window=False, bos_token_id=98, eos_token_id=99),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=110,
                  max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=1e6,
                  use_sliding_window=False, bos_token_id=100, eos_token_id=101),
}


def main():
    out = {"transformers_version": transformers.__version__, "cases": []}
    for name, kw in CASES.items():
        kw = dict(kw)
        model_type = kw.pop("model_type")
        cfg = AutoConfig.for_model(model_type, **kw)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        # named_parameters drops the tied lm_head (it is the embedding).
        tensors = [[n, list(p.shape)] for n, p in model.named_parameters()]
        out["cases"].append({
            "name": name,
            "config": json.loads(cfg.to_json_string()),
            "tensors": tensors,
            "num_params": sum(p.numel() for p in model.parameters()),
        })
    path = os.path.join("tests", "fixtures", "model", "hf_weight_maps.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
