// HF weights into a HostState: names and shapes are checked before anything
// is allocated, and non-finite weights are refused by tensor name.
#include "io/state_tensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "testutil.h"

namespace {

using rt::test::tiny_spec;

// A model directory holding the weights of a random tiny_spec() state, with
// `poison` written into element `at` of tensor `name` (none when name is empty).
void write_model(const std::string& dir, const std::string& name, int64_t at, float poison) {
  rt::HostState st(tiny_spec(), false);
  st.init_random(3);
  std::vector<rt::TensorWrite> ts = rt::master_tensors(st, rt::DType::bf16);
  std::vector<std::vector<float>> copies;
  copies.reserve(ts.size());
  for (auto& t : ts) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    copies.emplace_back(t.data, t.data + n);
    if (t.name == name) copies.back()[static_cast<size_t>(at)] = poison;
    t.data = copies.back().data();
  }
  rt::safetensors_write_model(dir, ts);
}

TEST(StateTensors, NonFiniteWeightsAreRefusedByName) {
  rt::test::TempDir tmp;
  write_model(tmp.file("ok"), "", 0, 0);
  rt::HostState a(tiny_spec(), false);
  rt::load_state(a, rt::SafetensorsModel::open(tmp.file("ok")));
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    write_model(tmp.file("bad"), "model.layers.1.mlp.up_proj.weight", 7, bad);
    rt::HostState b(tiny_spec(), false);
    rt::test::expect_error([&] { rt::load_state(b, rt::SafetensorsModel::open(tmp.file("bad"))); },
                           {tmp.file("bad/model.safetensors"), "tensor 'model.layers.1.mlp.up_proj.weight' holds",
                            std::isnan(bad) ? "NaN" : "Inf", "(element 7 of", "download or export them again"});
  }
}

TEST(StateTensors, TheCheckRunsOnTheHeadersAlone) {
  rt::test::TempDir tmp;
  write_model(tmp.file("m"), "", 0, 0);
  const rt::SafetensorsModel m = rt::SafetensorsModel::open(tmp.file("m"));
  rt::load_state_check(tiny_spec(), m);  // matches
  rt::ModelSpec huge = tiny_spec();
  huge.n_layers = 1000000000;  // never allocated: told from the names
  rt::test::expect_error([&] { rt::load_state_check(huge, m); },
                         {"does not match config.json", "num_hidden_layers 1000000000, the weights hold"});
}

}  // namespace
