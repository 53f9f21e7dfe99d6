// Packed fine-tuning rows with document masking, end to end on the CPU
// backend: FinetuneDataset packs examples (from a token file with loss
// masks) and hands Batch::doc_start to the model. Reference: the same
// examples unpacked, one per row (positions from 0, padding after), whose
// tokens attend only to their own example by causality. With masking every
// packed example sees exactly the keys and positions it sees alone, so its
// loss and the gradients must agree; with --pack-attention cross (no
// doc_start) an example packed after another attends to it, and both move.
//
// Tolerances: with masking the attention of a packed token runs over the
// same keys in the same order as unpacked (the CPU op starts its key loop at
// doc_start), and every other op works per token, so the only differences are
// summation orders: the GEMM may block rows differently, the loss sums tokens
// in another order, and dW = sum_n dy_n x_n^T adds the tokens of a row in
// another order. fp32 rounding of such sums is ~n * 6e-8 relative to the sum
// of magnitudes (n <= 100 tokens here): per-example loss within 1e-5
// relative, gradients within 1e-5 of the tensor's largest element (+ 1e-4
// relative). Cross attention moves the loss by ~1e-2 relative here (checked
// to exceed 1e-3, far above the tolerance), so the test fails without masking.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "data/finetune.h"
#include "data/loss_mask_file.h"
#include "engine/backend.h"
#include "io/token_file.h"
#include "state/host_state.h"
#include "testutil.h"

namespace {

constexpr int64_t kVocab = 64, kT = 32;

rt::ModelSpec small_spec() {
  rt::ModelSpec s;
  s.hidden = 32;
  s.intermediate = 64;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  s.vocab = kVocab;
  s.max_positions = 64;
  return s;
}

// Documents of lengths 5..15 tokens with pseudo-random ids; every token after
// the first is a trained target.
std::vector<std::vector<int32_t>> make_docs() {
  std::vector<std::vector<int32_t>> docs;
  uint32_t x = 12345;
  for (int d = 0; d < 9; ++d) {
    std::vector<int32_t> doc(static_cast<size_t>(5 + (d * 7) % 11));
    for (auto& id : doc) {
      x = x * 1664525u + 1013904223u;
      id = static_cast<int32_t>((x >> 8) % kVocab);
    }
    docs.push_back(doc);
  }
  return docs;
}

struct Packed {
  std::unique_ptr<rt::FinetuneDataset> ds;
  std::vector<std::vector<uint64_t>> rows;  // example indices per row
  rt::Batch batch;                          // every row of epoch 0
};

Packed pack(const rt::test::TempDir& d, const std::vector<std::vector<int32_t>>& docs, rt::PackAttention att) {
  std::vector<int32_t> ids;
  rt::LossMaskWriter w(d.file("docs.bin.mask"));
  for (const auto& doc : docs) {
    ids.insert(ids.end(), doc.begin(), doc.end());
    w.append(std::vector<uint8_t>(doc.size(), rt::mask_trained));
  }
  w.commit();
  const rt::TokenStream tokens = rt::TokenStream::from_ids(ids, "docs", kVocab);
  const rt::LossMaskFile mask(d.file("docs.bin.mask"), ids.size());
  rt::FinetuneOptions o;
  o.seq_len = kT;
  o.val_fraction = 0;
  o.seed = 5;
  o.pack_attention = att;
  Packed p;
  p.ds = std::make_unique<rt::FinetuneDataset>(tokens, mask, o);
  p.rows = p.ds->epoch_rows(0);
  p.batch = p.ds->next_batch(static_cast<int64_t>(p.rows.size()));
  return p;
}

// Example doc alone in a row: what pack = no gives.
rt::Batch unpacked(const std::vector<int32_t>& doc) {
  rt::Batch b;
  b.B = 1;
  b.T = kT;
  for (int64_t t = 0; t < kT; ++t) {
    const bool in = t + 1 < static_cast<int64_t>(doc.size());
    b.inputs.push_back(in ? doc[t] : 0);
    b.targets.push_back(in ? doc[t + 1] : rt::ignore_target);
    b.positions.push_back(static_cast<int32_t>(t));
  }
  return b;
}

// Row r of b with targets kept only in [t0, t1).
rt::Batch row_slice(const rt::Batch& b, int64_t r, int64_t t0, int64_t t1) {
  rt::Batch o;
  o.B = 1;
  o.T = b.T;
  auto cut = [&](const std::vector<int32_t>& v) {
    return v.empty() ? v : std::vector<int32_t>(v.begin() + r * b.T, v.begin() + (r + 1) * b.T);
  };
  o.inputs = cut(b.inputs);
  o.targets = cut(b.targets);
  o.positions = cut(b.positions);
  o.doc_start = cut(b.doc_start);
  for (int64_t t = 0; t < b.T; ++t)
    if (t < t0 || t >= t1) o.targets[t] = rt::ignore_target;
  return o;
}

std::vector<float> grads_flat(rt::HostState& st) {
  std::vector<float> g;
  for (auto& u : st.units()) g.insert(g.end(), u.grad.p, u.grad.p + u.numel);
  return g;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

struct Model {
  rt::HostState st{small_spec(), true};
  Model() {
    st.init_random(11);
    // Sharpen attention (as in positions_test): at the init scale softmax is
    // near uniform, which hides what a token attends to.
    const rt::ModelSpec sp = st.spec();
    for (auto& l : st.weights().layers) {
      for (int64_t i = 0; i < sp.q_dim() * sp.hidden; ++i) const_cast<float*>(l.q_proj)[i] *= 4;
      for (int64_t i = 0; i < sp.kv_dim() * sp.hidden; ++i) const_cast<float*>(l.k_proj)[i] *= 4;
    }
  }
};

TEST(PackedAttention, DocStartFollowsThePackersExampleBoundaries) {
  rt::test::TempDir d;
  const auto docs = make_docs();
  Packed m = pack(d, docs, rt::PackAttention::masked);
  ASSERT_LT(m.rows.size(), docs.size()) << "the fixture must pack several examples per row";
  ASSERT_EQ(m.batch.doc_start.size(), m.batch.inputs.size());
  for (size_t r = 0; r < m.rows.size(); ++r) {
    int64_t t = 0;
    for (uint64_t e : m.rows[r]) {
      const int64_t t0 = t;
      for (size_t j = 0; j + 1 < docs[e].size(); ++j, ++t)
        EXPECT_EQ(m.batch.doc_start[r * kT + t], t0) << r << " " << t;
    }
    for (const int64_t p0 = t; t < kT; ++t) EXPECT_EQ(m.batch.doc_start[r * kT + t], p0) << "padding, row " << r;
  }
  // cross: no document starts (plain causal), everything else identical
  Packed c = pack(d, docs, rt::PackAttention::cross);
  EXPECT_TRUE(c.batch.doc_start.empty());
  EXPECT_EQ(c.batch.inputs, m.batch.inputs);
  EXPECT_EQ(c.batch.targets, m.batch.targets);
  EXPECT_EQ(c.batch.positions, m.batch.positions);
}

TEST(PackedAttention, MaskedLossPerExampleEqualsUnpacked) {
  rt::test::TempDir d;
  const auto docs = make_docs();
  Model model;
  auto be = rt::make_cpu_backend(model.st);
  for (auto att : {rt::PackAttention::masked, rt::PackAttention::cross}) {
    Packed p = pack(d, docs, att);
    int64_t n_later = 0;  // examples packed after another one in their row
    for (size_t r = 0; r < p.rows.size(); ++r) {
      int64_t t = 0;
      for (size_t k = 0; k < p.rows[r].size(); ++k) {
        const auto& doc = docs[p.rows[r][k]];
        const int64_t t0 = t, t1 = t + static_cast<int64_t>(doc.size()) - 1;
        t = t1;
        int64_t n_ref = 0, n_got = 0;
        const double ref = be->loss_sum(unpacked(doc), &n_ref);
        const double got = be->loss_sum(row_slice(p.batch, static_cast<int64_t>(r), t0, t1), &n_got);
        ASSERT_EQ(n_got, n_ref);
        if (att == rt::PackAttention::masked) {
          EXPECT_NEAR(got, ref, 1e-5 * std::abs(ref)) << "row " << r << " example " << k;
        } else if (k == 0) {  // the first example of a row sees no other
          EXPECT_NEAR(got, ref, 1e-5 * std::abs(ref)) << "row " << r;
        } else {
          EXPECT_GT(std::abs(got - ref), 1e-3 * std::abs(ref))
              << "cross attention left row " << r << " example " << k << " unchanged: " << got << " vs " << ref;
        }
        n_later += k > 0;
      }
    }
    EXPECT_GE(n_later, 3);
  }
}

TEST(PackedAttention, MaskedGradientsEqualTheSumOverUnpackedExamples) {
  rt::test::TempDir d;
  const auto docs = make_docs();
  Model model;
  auto be = rt::make_cpu_backend(model.st);
  Packed p = pack(d, docs, rt::PackAttention::masked);
  int64_t n_total = 0;
  for (const auto& doc : docs) n_total += static_cast<int64_t>(doc.size()) - 1;
  // reference: each example alone, gradients summed (each scaled by 1 / n_total)
  std::vector<float> ref;
  for (const auto& doc : docs) {
    be->compute_grads({unpacked(doc)}, n_total);
    std::vector<float> g = grads_flat(model.st);
    if (ref.empty()) ref.assign(g.size(), 0.0f);
    for (size_t i = 0; i < g.size(); ++i) ref[i] += g[i];
  }
  const double atol = 1e-5 * max_abs(ref);
  be->compute_grads({p.batch}, n_total);
  const std::vector<float> masked = grads_flat(model.st);
  EXPECT_TRUE(rt::test::expect_near("packed masked gradients", masked, ref, atol, 1e-4));
  Packed c = pack(d, docs, rt::PackAttention::cross);
  be->compute_grads({c.batch}, n_total);
  EXPECT_FALSE(rt::test::expect_near("packed cross gradients", grads_flat(model.st), ref, atol, 1e-4))
      << "without masking the gradients should differ";

  // layer-major over two micro-batches (the CUDA engine's order) gives the
  // micro-batch-major gradients bit for bit, document starts included
  ASSERT_GE(p.rows.size(), 2u);
  const int64_t half = static_cast<int64_t>(p.rows.size()) / 2;
  std::vector<rt::Batch> mbs;
  for (int64_t k = 0; k < 2; ++k) {
    rt::Batch b;
    b.B = half;
    b.T = kT;
    auto part = [&](const std::vector<int32_t>& v) {
      return std::vector<int32_t>(v.begin() + k * half * kT, v.begin() + (k + 1) * half * kT);
    };
    b.inputs = part(p.batch.inputs);
    b.targets = part(p.batch.targets);
    b.positions = part(p.batch.positions);
    b.doc_start = part(p.batch.doc_start);
    mbs.push_back(std::move(b));
  }
  be->compute_grads(mbs, n_total);
  const std::vector<float> mb_major = grads_flat(model.st);
  auto lm = rt::make_cpu_backend(model.st, false, -1, /*layer_major=*/true);
  lm->compute_grads(mbs, n_total);
  EXPECT_EQ(grads_flat(model.st), mb_major);
  std::vector<rt::Batch> no_doc = mbs;
  for (auto& b : no_doc) b.doc_start.clear();
  lm->compute_grads(no_doc, n_total);
  EXPECT_NE(grads_flat(model.st), mb_major);
}

}  // namespace
