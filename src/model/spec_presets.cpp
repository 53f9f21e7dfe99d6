// The built-in model presets (ModelSpec shapes from the models' published
// config.json files): spec_preset, preset_names.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/spec.h"
#include "model/spec_gemma.h"

namespace rt {

// ---- presets -------------------------------------------------------------

namespace {

ModelSpec preset_make(Family fam, int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv,
                      int64_t head_dim, int64_t vocab, double theta, double eps, bool tied, int64_t max_pos,
                      int64_t bos, std::vector<int64_t> eos) {
  ModelSpec s;
  s.family = fam;
  s.architecture = family_architecture(fam);
  s.hidden = hidden;
  s.intermediate = inter;
  s.n_layers = layers;
  s.n_heads = heads;
  s.n_kv_heads = kv;
  s.head_dim = head_dim;
  s.vocab = vocab;
  s.rope.theta = theta;
  s.rms_eps = eps;
  s.tie_embeddings = tied;
  s.qkv_bias = fam == Family::qwen2;
  s.qk_norm = fam == Family::qwen3 || fam == Family::qwen3_moe || fam == Family::olmoe || fam == Family::olmo2;
  s.qk_norm_whole = fam == Family::olmoe || fam == Family::olmo2;
  s.post_norms = fam == Family::olmo2;
  if (fam == Family::smollm3)  // SmolLM3Config's default: no RoPE in every 4th layer
    for (int64_t i = 0; i < layers; ++i) s.rope_layers.push_back((i + 1) % 4 != 0 ? 1 : 0);
  s.max_positions = max_pos;
  s.bos_id = bos;
  s.eos_ids = std::move(eos);
  s.dtype = "bfloat16";
  return s;
}

// Shapes from the models' published config.json files. Totals from
// params_total(), which the tests pin to the published parameter counts.
const std::map<std::string, ModelSpec>& presets() {
  static const std::map<std::string, ModelSpec> table = [] {
    std::map<std::string, ModelSpec> m;
    // Our demo model: bytes 0..255, BOS 256, EOS 257; ids 258..263 pad the
    // vocab to 264 so every width is a multiple of 8 and head_dim is 64, as
    // the CUDA kernels need (the byte tokenizer never produces them and the
    // sampler masks them). 4,562,176 parameters: 6 layers x 737,792 +
    // 2 x 264 x 256 (untied embed + head) + 256.
    ModelSpec tiny = preset_make(Family::llama, 256, 704, 6, 4, 2, 64, 264, 10000.0, 1e-5, false, 1024, 256, {257});
    tiny.dtype = "float32";
    m["tiny-byte"] = tiny;
    // meta-llama/Llama-3.1-8B: 8,030,261,248 parameters.
    ModelSpec llama = preset_make(Family::llama, 4096, 14336, 32, 32, 8, 128, 128256, 500000.0, 1e-5, false, 131072,
                                  128000, {128001});
    llama.rope.scaling = RopeScaling::llama3;
    llama.rope.factor = 8.0;
    llama.rope.low_freq_factor = 1.0;
    llama.rope.high_freq_factor = 4.0;
    llama.rope.original_max_positions = 8192;
    m["llama-3.1-8b"] = llama;
    // meta-llama/Llama-3.1-70B: 70,553,706,496 parameters (the 8B's RoPE scaling and token ids).
    ModelSpec llama70 = llama;
    llama70.hidden = 8192;
    llama70.intermediate = 28672;
    llama70.n_layers = 80;
    llama70.n_heads = 64;
    m["llama-3.1-70b"] = llama70;
    // mistralai/Mistral-7B-v0.3 (sliding_window null): 7,248,023,552 parameters.
    m["mistral-7b"] = preset_make(Family::mistral, 4096, 14336, 32, 32, 8, 128, 32768, 1e6, 1e-5, false, 32768, 1, {2});
    // Qwen/Qwen2.5-*: bos = eos = <|endoftext|> 151643 in the base configs.
    m["qwen2.5-0.5b"] =  // 494,032,768
        preset_make(Family::qwen2, 896, 4864, 24, 14, 2, 64, 151936, 1e6, 1e-6, true, 32768, 151643, {151643});
    m["qwen2.5-7b"] =  // 7,615,616,512
        preset_make(Family::qwen2, 3584, 18944, 28, 28, 4, 128, 152064, 1e6, 1e-6, false, 131072, 151643, {151643});
    m["qwen2.5-14b"] =  // 14,770,033,664
        preset_make(Family::qwen2, 5120, 13824, 48, 40, 8, 128, 152064, 1e6, 1e-5, false, 131072, 151643, {151643});
    m["qwen2.5-32b"] =  // 32,763,876,352
        preset_make(Family::qwen2, 5120, 27648, 64, 40, 8, 128, 152064, 1e6, 1e-5, false, 131072, 151643, {151643});
    m["qwen2.5-72b"] =  // 72,706,203,648
        preset_make(Family::qwen2, 8192, 29568, 80, 64, 8, 128, 152064, 1e6, 1e-5, false, 131072, 151643, {151643});
    // Qwen/Qwen3-8B: eos <|im_end|> 151645; 8,190,735,360 parameters.
    m["qwen3-8b"] =
        preset_make(Family::qwen3, 4096, 12288, 36, 32, 8, 128, 151936, 1e6, 1e-6, false, 40960, 151643, {151645});
    // MoE: (experts, top-k, expert width, norm_topk_prob, router_aux_loss_coef) from the configs.
    auto moe = [](ModelSpec s, int64_t e, int64_t k, int64_t f, bool norm, double coef) {
      s.moe.n_experts = e;
      s.moe.top_k = k;
      s.moe.expert_intermediate = f;
      s.moe.norm_topk_prob = norm;
      s.moe.router_aux_loss_coef = coef;
      return s;
    };
    // Qwen/Qwen3-30B-A3B: 30,532,122,624 parameters (3,348,855,808 active).
    m["qwen3-30b-a3b"] = moe(
        preset_make(Family::qwen3_moe, 2048, 6144, 48, 32, 4, 128, 151936, 1e6, 1e-6, false, 40960, 151643, {151645}),
        128, 8, 768, true, 0.001);
    // mistralai/Mixtral-8x7B-v0.1: 46,702,792,704 parameters (12,879,921,152 active).
    m["mixtral-8x7b"] =
        moe(preset_make(Family::mixtral, 4096, 14336, 32, 32, 8, 128, 32000, 1e6, 1e-5, false, 32768, 1, {2}), 8, 2,
            14336, true, 0.02);
    // allenai/OLMoE-1B-7B-0924: 6,919,161,856 parameters (1,281,626,112 active).
    m["olmoe-1b-7b"] =
        moe(preset_make(Family::olmoe, 2048, 1024, 16, 16, 16, 128, 50304, 10000.0, 1e-5, false, 4096, -1, {50279}), 64,
            8, 1024, false, 0.01);
    // OLMo 2 (post-branch norms, q/k norms over the whole projection): eos
    // <|endoftext|> 100257, no bos. allenai/OLMo-2-0425-1B: 1,484,916,736
    // parameters; allenai/OLMo-2-1124-7B: 7,298,617,344.
    m["olmo-2-1b"] =
        preset_make(Family::olmo2, 2048, 8192, 16, 16, 16, 128, 100352, 500000.0, 1e-6, false, 4096, -1, {100257});
    m["olmo-2-7b"] =
        preset_make(Family::olmo2, 4096, 11008, 32, 32, 32, 128, 100352, 500000.0, 1e-6, false, 4096, -1, {100257});
    // Granite 3.3 (tied; vocab 49,159, which the CUDA LM head pads to 49,160):
    // bos = eos = <|end_of_text|> 0. (embedding, residual, logits, attention).
    auto granite = [](ModelSpec s, double logits, double attn) {
      s.embedding_multiplier = 12.0;
      s.residual_multiplier = 0.22;
      s.logits_scaling = logits;
      s.attention_scale = attn;
      return s;
    };
    // ibm-granite/granite-3.3-2b-instruct: 2,533,539,840 parameters (unverified
    // for 3.3: rope_theta and the vocabulary, taken from the 8B).
    m["granite-3.3-2b"] = granite(
        preset_make(Family::granite, 2048, 8192, 40, 32, 8, 64, 49159, 1e7, 1e-5, true, 131072, 0, {0}), 8.0, 0.015625);
    // ibm-granite/granite-3.3-8b-instruct: 8,170,864,640 parameters.
    m["granite-3.3-8b"] =
        granite(preset_make(Family::granite, 4096, 12800, 40, 32, 8, 128, 49159, 1e7, 1e-5, true, 131072, 0, {0}), 16.0,
                0.0078125);
    // HuggingFaceTB/SmolLM3-3B (tied; no RoPE in layers 4, 8, ..., 36): eos <|im_end|> 128012;
    // 3,075,098,624 parameters (unverified: rope_theta 5e6, 65,536 positions, the eos id).
    m["smollm3-3b"] =
        preset_make(Family::smollm3, 2048, 11008, 36, 16, 4, 128, 128256, 5e6, 1e-6, true, 65536, 128000, {128012});
    // Gemma 2 (tied, (1 + w) norms, sandwich norms, GeGLU, soft caps 50 and
    // 30, every other layer a 4096-token window; bos 2, eos 1; vocab 256,000).
    // google/gemma-2-2b: 2,614,341,888 parameters; google/gemma-2-9b: 9,241,705,984.
    m["gemma-2-2b"] = detail::gemma_preset(
        preset_make(Family::gemma2, 2304, 9216, 26, 8, 4, 256, 256000, 10000.0, 1e-6, true, 8192, 2, {1}), 256.0, 4096,
        2, 50.0, 30.0, 0.0, 1.0);
    m["gemma-2-9b"] = detail::gemma_preset(
        preset_make(Family::gemma2, 3584, 14336, 42, 16, 8, 256, 256000, 10000.0, 1e-6, true, 8192, 2, {1}), 256.0,
        4096, 2, 50.0, 30.0, 0.0, 1.0);
    // Gemma 3 text (q/k norms, 5 of 6 layers local with a 1e4 RoPE base, the
    // global ones 1e6; no soft caps; bos 2, eos 1 and <end_of_turn> 106).
    // google/gemma-3-1b-pt (Gemma3ForCausalLM): window 512, 32,768 positions,
    // vocab 262,144. The 4B and 12B checkpoints are
    // Gemma3ForConditionalGeneration (their language model trains, the vision
    // tower is carried: model/spec_multimodal.h); these presets are their
    // language models as Gemma3ForCausalLM: window 1024, linear RoPE scaling 8
    // on the global layers, 131,072 positions, vocab 262,208 (unverified: the
    // 4B/12B eos ids and max positions, from memory of the published text_config).
    m["gemma-3-1b"] = detail::gemma_preset(
        preset_make(Family::gemma3, 1152, 6912, 26, 4, 1, 256, 262144, 1e6, 1e-6, true, 32768, 2, {1, 106}), 256.0,
        512, 6, 0.0, 0.0, 10000.0, 1.0);
    m["gemma-3-4b"] = detail::gemma_preset(
        preset_make(Family::gemma3, 2560, 10240, 34, 8, 4, 256, 262208, 1e6, 1e-6, true, 131072, 2, {1, 106}), 256.0,
        1024, 6, 0.0, 0.0, 10000.0, 8.0);
    m["gemma-3-12b"] = detail::gemma_preset(
        preset_make(Family::gemma3, 3840, 15360, 48, 16, 8, 256, 262208, 1e6, 1e-6, true, 131072, 2, {1, 106}), 256.0,
        1024, 6, 0.0, 0.0, 10000.0, 8.0);
    // Phi3ForCausalLM (fused qkv_proj and gate_up_proj in the files). LongRoPE
    // presets: the factor lists here are all 1.0, NOT the published ones (48
    // numbers each, not reproduced): the shapes, context and attention factor
    // are the models'; start from the model's config.json for its RoPE.
    auto phi = [](ModelSpec s, int64_t window, int64_t original, int64_t pad) {
      s.sliding_window = window;  // 0: none (or one at least max_position_embeddings)
      s.rope.original_max_positions = original;
      s.pad_id = pad;
      return s;
    };
    auto longrope = [](ModelSpec s, double partial) {
      s.rope.partial_rotary_factor = partial;
      s.rope.scaling = RopeScaling::longrope;
      const size_t pairs = static_cast<size_t>(s.rotary_dim() / 2);
      s.rope.short_factor.assign(pairs, 1.0);
      s.rope.long_factor.assign(pairs, 1.0);
      const double factor = static_cast<double>(s.max_positions) / static_cast<double>(s.rope.original_max_positions);
      s.rope.attention_factor = std::sqrt(1.0 + std::log(factor) / std::log(double(s.rope.original_max_positions)));
      return s;
    };
    // microsoft/Phi-3-mini-4k-instruct (sliding_window 2047): 3,821,079,552 parameters.
    m["phi-3-mini"] = phi(
        preset_make(Family::phi3, 3072, 8192, 32, 32, 32, 96, 32064, 10000.0, 1e-5, false, 4096, 1, {32000}), 2047,
        4096, 32000);
    // microsoft/Phi-3.5-mini-instruct (LongRoPE, 131,072 positions; sliding_window 262144 is
    // no window): 3,821,079,552 parameters.
    m["phi-3.5-mini"] = longrope(
        phi(preset_make(Family::phi3, 3072, 8192, 32, 32, 32, 96, 32064, 10000.0, 1e-5, false, 131072, 1, {32000}),
            0, 4096, 32000),
        1.0);
    // microsoft/phi-4 (rope_theta 250000, 16,384 positions, no window): 14,659,507,200
    // parameters (unverified: the bos/eos/pad ids 100257/100265/100349).
    m["phi-4"] = phi(
        preset_make(Family::phi3, 5120, 17920, 40, 40, 10, 128, 100352, 250000.0, 1e-5, false, 16384, 100257, {100265}),
        0, 16384, 100349);
    // microsoft/Phi-4-mini-instruct (tied, partial_rotary_factor 0.75, LongRoPE, 131,072
    // positions): 3,836,021,760 parameters (unverified: the ids 199999/199999/199999).
    m["phi-4-mini"] = longrope(
        phi(preset_make(Family::phi3, 3072, 8192, 32, 24, 8, 128, 200064, 10000.0, 1e-5, true, 131072, 199999,
                        {199999}),
            0, 4096, 199999),
        0.75);
    // OpenAI gpt-oss (the hub's config.json of openai/gpt-oss-20b and
    // openai/gpt-oss-120b, transformers 4.55): hidden 2880, 64 query heads and
    // 8 KV heads of head_dim 64 with q/k/v/o biases and sinks, even layers
    // sliding (window 128), YaRN (theta 150000, factor 32 over 4096
    // positions, beta_fast 32, beta_slow 1, truncate false), experts of width
    // 2880 with biases, top 4 by softmax over the selected router logits,
    // SwiGLU clamped at 7 with alpha 1.702; vocab 201088, untied, eos
    // <|return|> 200002, pad <|endoftext|> 199999, no bos; rms_norm_eps 1e-5.
    // gpt-oss-20b: 24 layers, 32 experts: 20,914,757,184 parameters
    // (4,187,440,704 active, embedding and head included); gpt-oss-120b: 36
    // layers, 128 experts: 116,829,156,672 (5,711,982,912 active).
    auto gptoss = [](int64_t layers, int64_t experts) {
      ModelSpec s = preset_make(Family::gpt_oss, 2880, 2880, layers, 64, 8, 64, 201088, 150000.0, 1e-5, false, 131072,
                                -1, {200002});
      s.pad_id = 199999;
      s.qkv_bias = s.o_bias = s.attn_sinks = true;
      s.local_window = 128;
      for (int64_t i = 0; i < layers; ++i) s.local_layers.push_back(i % 2 == 0 ? 1 : 0);
      s.rope.scaling = RopeScaling::yarn;
      s.rope.factor = 32.0;
      s.rope.beta_fast = 32.0;
      s.rope.beta_slow = 1.0;
      s.rope.truncate = false;
      s.rope.original_max_positions = 4096;
      s.rope.attention_factor = 0.1 * std::log(32.0) + 1.0;
      s.moe.n_experts = experts;
      s.moe.top_k = 4;
      s.moe.expert_intermediate = 2880;
      s.moe.router_bias = s.moe.topk_softmax = s.moe.expert_bias = true;
      s.moe.glu_limit = 7.0;
      s.moe.glu_alpha = 1.702;
      s.moe.router_aux_loss_coef = 0.9;
      return s;
    };
    m["gpt-oss-20b"] = gptoss(24, 32);
    m["gpt-oss-120b"] = gptoss(36, 128);
    return m;
  }();
  return table;
}

}  // namespace

std::vector<std::string> preset_names() {
  // Documented order: the demo model first, then by family and size.
  return {"tiny-byte",    "llama-3.1-8b", "llama-3.1-70b", "mistral-7b",     "qwen2.5-0.5b",   "qwen2.5-7b",
          "qwen2.5-14b",  "qwen2.5-32b",  "qwen2.5-72b",   "qwen3-8b",       "qwen3-30b-a3b",  "mixtral-8x7b",
          "olmoe-1b-7b",  "olmo-2-1b",    "olmo-2-7b",     "granite-3.3-2b", "granite-3.3-8b", "smollm3-3b",
          "gemma-2-2b",   "gemma-2-9b",   "gemma-3-1b",    "gemma-3-4b",     "gemma-3-12b",    "phi-3-mini",
          "phi-3.5-mini", "phi-4",        "phi-4-mini",    "gpt-oss-20b",    "gpt-oss-120b"};
}

ModelSpec spec_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    fail("[preset] unknown preset \"", name, "\"; available: ", names);
  }
  return it->second;
}

}  // namespace rt
