#include "io/checkpoint_unit.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/thread_pool.h"
#include "io/checkpoint_internal.h"
#include "io/safetensors.h"

namespace rt {

namespace {

using ordered_json = nlohmann::ordered_json;
using checkpoint_internal::kFormat;

size_t floats_of_bytes(int64_t b) { return static_cast<size_t>(b + 3) / 4; }

MomentStorage moments_parse(const std::string& s, const std::string& path) {
  if (s == "adamw") return MomentStorage::fp32;
  if (s == "adamw8bit") return MomentStorage::q8;
  if (s == "adamw4bit") return MomentStorage::q4;
  fail("[checkpoint] ", path, ": unknown optimizer '", s, "' in the metadata (a newer ramtrain's checkpoint?)");
}

}  // namespace

size_t unit_stage_floats(const StateUnit& u) {
  const int64_t n = u.numel, nv = u.v_len();
  size_t f = master_is_bf16(u.master_kind) ? floats_of_bytes(2 * n) : static_cast<size_t>(n);  // master
  f += u.quantized() ? floats_of_bytes(quant_code_bytes(u.moments, n)) + floats_of_bytes(quant_code_bytes(u.moments, nv)) +
                           static_cast<size_t>(quant_blocks(n) + quant_blocks(nv))
                     : static_cast<size_t>(n + nv);
  if (u.master_kind == MasterStorage::bf16_kahan) f += floats_of_bytes(2 * n);
  return f;
}

UnitSnap unit_snap_fp32(const StateUnit& layout, const float* master, const float* m, const float* v) {
  RT_CHECK(!layout.muon, "[checkpoint] internal: a gathered unit is AdamW's");
  UnitSnap s;
  s.name = layout.name;
  s.entries = layout.entries;
  s.offsets = layout.offsets;
  s.numel = layout.numel;
  s.master_kind = MasterStorage::fp32;
  s.moments = MomentStorage::fp32;
  s.master = master;
  s.m = m;
  s.v = v;
  s.v_off = layout.offsets;
  s.nv = layout.numel;
  return s;
}

UnitSnap unit_snap_live(const StateUnit& u) {
  UnitSnap s;
  s.name = u.name;
  s.entries = u.entries;
  s.offsets = u.offsets;
  s.numel = u.numel;
  s.master_kind = u.master_kind;
  s.moments = u.moments;
  s.muon = u.muon;
  for (size_t k = 0; k < u.entries.size(); ++k) s.v_off.push_back(u.v_at(k));
  s.nv = u.v_len();
  s.live = &u;
  if (!u.shadow_master()) s.master = u.master();
  if (master_is_bf16(u.master_kind)) s.master_bf16 = u.shadow(u.cur_shadow);
  if (u.quantized()) {
    s.qm = u.qm();
    s.qv = u.qv();
    s.scales = u.scale_m();
  } else {
    s.m = u.m();
    s.v = u.v();
  }
  if (u.master_kind == MasterStorage::bf16_kahan) s.comp = u.comp();
  return s;
}

UnitSnap unit_snap_stage(const StateUnit& u, float* dst) {
  const int64_t n = u.numel;
  UnitSnap s;
  s.name = u.name;
  s.entries = u.entries;
  s.offsets = u.offsets;
  s.numel = n;
  s.master_kind = u.master_kind;
  s.moments = u.moments;
  s.muon = u.muon;
  for (size_t k = 0; k < u.entries.size(); ++k) s.v_off.push_back(u.v_at(k));
  s.nv = u.v_len();
  const int64_t nv = s.nv;
  float* q = dst;
  if (master_is_bf16(u.master_kind)) {  // as held: the file stores it as bf16
    copy_parallel(q, u.shadow(u.cur_shadow), static_cast<size_t>(n) * 2);
    s.master_bf16 = reinterpret_cast<const uint16_t*>(q);
    q += floats_of_bytes(2 * n);
  } else {
    u.read_master(0, n, q);
    s.master = q;
    q += n;
  }
  if (u.quantized()) {
    const int64_t cb = quant_code_bytes(u.moments, n), cbv = quant_code_bytes(u.moments, nv),
                  nb = quant_blocks(n) + quant_blocks(nv);
    copy_parallel(q, u.qm(), static_cast<size_t>(cb));
    s.qm = reinterpret_cast<const uint8_t*>(q);
    q += floats_of_bytes(cb);
    copy_parallel(q, u.qv(), static_cast<size_t>(cbv));
    s.qv = reinterpret_cast<const uint8_t*>(q);
    q += floats_of_bytes(cbv);
    copy_parallel(q, u.scale_m(), static_cast<size_t>(nb) * 4);
    s.scales = q;
    q += nb;
  } else {
    copy_parallel(q, u.m(), static_cast<size_t>(n + nv) * 4);
    s.m = q;
    s.v = q + n;
    q += n + nv;
  }
  if (u.master_kind == MasterStorage::bf16_kahan) {
    copy_parallel(q, u.comp(), static_cast<size_t>(n) * 2);
    s.comp = reinterpret_cast<const uint16_t*>(q);
  }
  return s;
}

namespace {

// The header of u's file: the JSON text, padded to 8 bytes; *data_bytes: the bytes after it.
std::string unit_header(const UnitSnap& u, uint64_t* data_bytes) {
  const bool quant = u.moments != MomentStorage::fp32, bf16 = master_is_bf16(u.master_kind);
  const int64_t cb = quant ? quant_code_bytes(u.moments, u.numel) : 0, nb = quant_blocks(u.numel);
  const int64_t cbv = quant ? quant_code_bytes(u.moments, u.nv) : 0, nbv = quant_blocks(u.nv);
  ordered_json h = ordered_json::object();
  h["__metadata__"] = {{"format", kFormat},
                       {"unit", u.name},
                       {"optimizer", moment_storage_name(u.moments)},
                       {"master", master_storage_name(u.master_kind)},
                       {"update_rule", update_rule_name(u.muon ? UpdateRule::muon : UpdateRule::adamw)}};
  if (quant) h["__metadata__"]["moment_code"] = quant_code_id(u.moments, u.muon);
  uint64_t off = 0;
  auto add = [&](const std::string& name, const char* dtype, const std::vector<int64_t>& shape, uint64_t nb_) {
    h[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {off, off + nb_}}};
    off += nb_;
  };
  for (const char* prefix : {"master/", "adam_m/", "adam_v/"}) {
    const bool master = std::string(prefix) == "master/";
    if (quant && !master) continue;
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const WeightEntry& e = u.entries[k];
      if (std::string(prefix) == "adam_v/" && u.v_off[k] < 0) continue;  // a Muon matrix: no v
      if (master && bf16)
        add(prefix + e.name, "BF16", e.shape, static_cast<uint64_t>(e.numel()) * 2);
      else
        add(prefix + e.name, "F32", e.shape, static_cast<uint64_t>(e.numel()) * 4);
    }
  }
  if (quant) {
    add("adam_m_codes", "U8", {cb}, static_cast<uint64_t>(cb));
    add("adam_v_codes", "U8", {cbv}, static_cast<uint64_t>(cbv));
    add("adam_m_absmax", "F32", {nb}, static_cast<uint64_t>(nb) * 4);
    add("adam_v_absmax", "F32", {nbv}, static_cast<uint64_t>(nbv) * 4);
  }
  if (u.master_kind == MasterStorage::bf16_kahan)
    add("master_kahan_comp", "BF16", {u.numel}, static_cast<uint64_t>(u.numel) * 2);
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  *data_bytes = off;
  return text;
}

}  // namespace

uint64_t unit_file_bytes(const UnitSnap& u) {
  uint64_t data = 0;
  return 8 + unit_header(u, &data).size() + data;
}

std::vector<UnitSnap> unit_snap_layouts(const ModelSpec& spec, MasterStorage master, MomentStorage moments,
                                        UpdateRule rule) {
  const int64_t L = spec.n_layers;
  std::vector<UnitSnap> units(static_cast<size_t>(L + 2));
  units[0].name = "embed";
  for (int64_t i = 0; i < L; ++i) units[static_cast<size_t>(i + 1)].name = cat("layer.", i);
  units[static_cast<size_t>(L + 1)].name = "head";
  for (const WeightEntry& e : weight_map(spec)) {  // HostState's layout (state/host_state.cpp)
    UnitSnap& s = units[e.kind == WeightKind::embed ? 0
                        : e.layer >= 0              ? static_cast<size_t>(e.layer + 1)
                                                    : static_cast<size_t>(L + 1)];
    const int64_t padded = (e.numel() + 15) / 16 * 16;
    s.entries.push_back(e);
    s.offsets.push_back(s.numel);
    s.numel += padded;
    const bool has_v = rule == UpdateRule::adamw || !muon_matrix(e);
    s.v_off.push_back(has_v ? s.nv : -1);
    if (has_v) s.nv += padded;
  }
  for (UnitSnap& s : units) {
    s.master_kind = master;
    s.moments = moments;
    s.muon = rule == UpdateRule::muon;
  }
  return units;
}

void unit_snap_write(const UnitSnap& u, const std::function<void(const void*, size_t)>& write) {
  const bool quant = u.moments != MomentStorage::fp32;
  const int64_t cb = quant ? quant_code_bytes(u.moments, u.numel) : 0, nb = quant_blocks(u.numel);
  const int64_t cbv = quant ? quant_code_bytes(u.moments, u.nv) : 0, nbv = quant_blocks(u.nv);
  RT_CHECK(!master_is_bf16(u.master_kind) || u.master_bf16, "[checkpoint] internal: unit ", u.name,
           " holds a bf16 master but its snapshot has no bf16 values");
  RT_CHECK((u.master_kind == MasterStorage::bf16_kahan) == (u.comp != nullptr), "[checkpoint] internal: unit ", u.name,
           ": a Kahan compensation goes with a bf16-kahan master");
  uint64_t data = 0;
  const std::string text = unit_header(u, &data);
  const uint64_t n = text.size();
  write(&n, 8);
  write(text.data(), text.size());
  std::vector<float> buf;
  for (size_t k = 0; k < u.entries.size(); ++k) {
    const int64_t ne = u.entries[k].numel();
    if (u.master_bf16) {
      write(u.master_bf16 + u.offsets[k], static_cast<size_t>(ne) * 2);
      continue;
    }
    if (u.master) {
      write(u.master + u.offsets[k], static_cast<size_t>(ne) * 4);
      continue;
    }
    constexpr int64_t kChunk = int64_t(1) << 22;  // a shadow master, decoded 16 MiB at a time
    buf.resize(static_cast<size_t>(std::min(ne, kChunk)));
    for (int64_t b = 0; b < ne; b += kChunk) {
      const int64_t c = std::min(kChunk, ne - b);
      u.live->read_master(u.offsets[k] + b, c, buf.data());
      write(buf.data(), static_cast<size_t>(c) * 4);
    }
  }
  if (quant) {
    write(u.qm, static_cast<size_t>(cb));
    write(u.qv, static_cast<size_t>(cbv));
    write(u.scales, static_cast<size_t>(nb + nbv) * 4);
  } else {
    for (size_t k = 0; k < u.entries.size(); ++k)
      write(u.m + u.offsets[k], static_cast<size_t>(u.entries[k].numel()) * 4);
    for (size_t k = 0; k < u.entries.size(); ++k)
      if (u.v_off[k] >= 0) write(u.v + u.v_off[k], static_cast<size_t>(u.entries[k].numel()) * 4);
  }
  if (u.comp) write(u.comp, static_cast<size_t>(u.numel) * 2);
}

namespace {

MomentStorage file_moments(const SafetensorsFile& f, const std::string& path) {
  auto it = f.metadata().find("optimizer");
  return it == f.metadata().end() ? MomentStorage::fp32 : moments_parse(it->second, path);
}

// The file's code set of quantized moments (its moment_code): the current
// one, or (q8 files without it, written before the minifloat codes) the
// dynamic 8-bit codes; anything else is refused.
// muon: the file's update rule is Muon (its q4 m holds the m4n code).
bool file_codes_dynamic8(const SafetensorsFile& f, MomentStorage mo, bool muon, const std::string& path) {
  auto it = f.metadata().find("moment_code");
  if (it == f.metadata().end()) return mo == MomentStorage::q8;  // q4 codes never changed
  if (it->second == quant_code_id(mo, muon)) return false;
  if (mo == MomentStorage::q8 && it->second == kQuantCode8Dynamic) return true;
  fail("[checkpoint] ", path, ": unknown moment_code '", it->second, "' for ", moment_storage_name(mo),
       " moments (this ramtrain writes '", quant_code_id(mo, muon), "'; a newer ramtrain's checkpoint?)");
}

UpdateRule file_update_rule(const SafetensorsFile& f, const std::string& path) {
  auto it = f.metadata().find("update_rule");
  if (it == f.metadata().end() || it->second == "adamw") return UpdateRule::adamw;
  if (it->second == "muon") return UpdateRule::muon;
  fail("[checkpoint] ", path, ": unknown update_rule '", it->second, "' (adamw or muon; a newer ramtrain's file?)");
}

}  // namespace

UpdateRule unit_file_update_rule(const std::string& path) {
  if (!file_exists(path)) fail("[checkpoint] ", path, " is missing");
  return file_update_rule(*SafetensorsFile::open(path), path);
}

MomentStorage unit_file_moments(const std::string& path) {
  if (!file_exists(path)) fail("[checkpoint] ", path, " is missing");
  return file_moments(*SafetensorsFile::open(path), path);
}

void unit_file_load(const std::string& p, StateUnit& u, bool with_moments) {
  if (!file_exists(p))
    fail("[checkpoint] ", p, " is missing: the checkpoint does not hold unit '", u.name,
         "' of this model (another model shape?)");
  std::unique_ptr<SafetensorsFile> f = SafetensorsFile::open(p);
  const MomentStorage mo = file_moments(*f, p);
  const bool quant = mo != MomentStorage::fp32, has_comp = f->find("master_kahan_comp") != nullptr;
  const UpdateRule rule = file_update_rule(*f, p);
  size_t with_v = 0;  // entries with a v in the file (Muon matrices have none)
  for (const WeightEntry& e : u.entries) with_v += rule == UpdateRule::adamw || !muon_matrix(e);
  const size_t want = u.entries.size() * (quant ? 1 : 2) + (quant ? 4 : with_v) + (has_comp ? 1 : 0);
  if (f->tensors().size() != want)
    fail("[checkpoint] ", p, " holds ", f->tensors().size(), " tensors; unit '", u.name, "' of this model with ",
         moment_storage_name(mo), " moments needs ", want, ": another model shape");
  if (with_moments && mo != u.moments)
    fail("[checkpoint] ", p, " holds ", moment_storage_name(mo), " moments but the state holds ",
         moment_storage_name(u.moments), " ones (convert the state first: HostState::set_moment_storage)");
  if (with_moments && (rule == UpdateRule::muon) != u.muon)
    fail("[checkpoint] ", p, " holds the optimizer state of ", update_rule_name(rule),
         " but the state is set up for ", u.muon ? "muon" : "adamw",
         " (Muon momentum and Adam moments do not convert: resume with the checkpoint's --optimizer)");
  auto get = [&](const std::string& name, DType dt, const std::vector<int64_t>& shape) -> const TensorInfo& {
    const TensorInfo* t = f->find(name);
    if (!t) fail("[checkpoint] ", p, ": tensor '", name, "' is missing (another model shape?)");
    if (t->dtype != dt || t->shape != shape)
      fail("[checkpoint] ", p, ": tensor '", name, "' is ", dtype_name(t->dtype), " of another shape than the ",
           "model's (another model shape?)");
    return *t;
  };
  std::vector<float> buf;
  for (size_t k = 0; k < u.entries.size(); ++k) {  // the master: encoded into any storage
    const WeightEntry& e = u.entries[k];
    const std::string name = "master/" + e.name;
    const TensorInfo* bt = f->find(name);  // a bf16 master's file holds BF16 (exact in any storage), others F32
    const TensorInfo& t = get(name, bt && bt->dtype == DType::bf16 ? DType::bf16 : DType::f32, e.shape);
    if (!u.shadow_master()) {
      tensor_to_f32(t, u.master() + u.offsets[k]);
      continue;
    }
    buf.resize(static_cast<size_t>(e.numel()));
    tensor_to_f32(t, buf.data());
    u.write_master(u.offsets[k], e.numel(), buf.data());
  }
  if (!with_moments) return;
  if (!quant) {
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const WeightEntry& e = u.entries[k];
      tensor_to_f32(get("adam_m/" + e.name, DType::f32, e.shape), u.m() + u.offsets[k]);
      if (u.v_at(k) >= 0) tensor_to_f32(get("adam_v/" + e.name, DType::f32, e.shape), u.v() + u.v_at(k));
    }
  } else {
    const int64_t cb = quant_code_bytes(mo, u.numel), nb = quant_blocks(u.numel);
    const int64_t cbv = quant_code_bytes(mo, u.v_len()), nbv = quant_blocks(u.v_len());
    std::memcpy(u.qm(), get("adam_m_codes", DType::u8, {cb}).data, static_cast<size_t>(cb));
    std::memcpy(u.qv(), get("adam_v_codes", DType::u8, {cbv}).data, static_cast<size_t>(cbv));
    std::memcpy(u.scale_m(), get("adam_m_absmax", DType::f32, {nb}).data, static_cast<size_t>(nb) * 4);
    std::memcpy(u.scale_v(), get("adam_v_absmax", DType::f32, {nbv}).data, static_cast<size_t>(nbv) * 4);
    if (file_codes_dynamic8(*f, mo, rule == UpdateRule::muon, p)) {  // an older checkpoint: into the current codes (nearest)
      quant_recode_dynamic8(true, u.qm(), u.scale_m(), u.numel);
      quant_recode_dynamic8(false, u.qv(), u.scale_v(), u.v_len());
    }
  }
  if (has_comp && u.master_kind == MasterStorage::bf16_kahan)
    std::memcpy(u.comp(), get("master_kahan_comp", DType::bf16, {u.numel}).data, static_cast<size_t>(u.numel) * 2);
}

}  // namespace rt
