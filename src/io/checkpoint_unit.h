// One unit's checkpoint file, state-<unit>.safetensors (io/checkpoint.h):
//   "master/<hf name>"   F32 per tensor: the master as fp32 (a split master
//                        decoded); a bf16 master (bf16-sr, bf16-kahan): BF16
//                        per tensor, its values as held (files before the lean
//                        checkpoints hold them as F32; both load)
//   fp32 moments:        "adam_m/<hf name>", "adam_v/<hf name>" F32 per tensor
//   quantized moments:   "adam_m_codes", "adam_v_codes" U8 (the unit's code
//                        bytes, state/moment_quant.h), "adam_m_absmax",
//                        "adam_v_absmax" F32 (one per block): bit for bit
//   bf16-kahan master:   "master_kahan_comp" BF16 (numel, the compensation)
// with __metadata__ {format, unit, optimizer (adamw | adamw8bit | adamw4bit),
// master (fp32 | split | bf16-sr | bf16-kahan), update_rule (adamw | muon),
// moment_code (quantized moments: state/moment_quant.h quant_code_id)}.
// An 8-bit file without moment_code holds the dynamic tree codes of earlier
// ramtrains: loading decodes them and re-encodes into the current codes
// (nearest; within both codes' error, not bit for bit).
// Canonical weight-map order. Under update_rule muon (--optimizer muon |
// muon8bit | muon4bit) a Muon matrix's "adam_m" (or m codes) is its Muon momentum and it
// has no "adam_v"; quantized, "adam_v_codes"/"adam_v_absmax" cover the packed
// v (StateUnit::v_len elements, state/host_state.h). A file without "optimizer" (older
// checkpoints) holds fp32 moments; without "update_rule", AdamW's.
// Loading moments needs the unit's update rule to be the file's.
// Loading needs the unit's moment storage to be the file's (convert after:
// HostState::set_moment_storage); the master loads into any storage (a
// bf16 master of a bf16 file exactly).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "state/host_state.h"

namespace rt {

// What a unit file is written from: the live unit, or a staging copy of it.
struct UnitSnap {
  std::string name;
  std::vector<WeightEntry> entries;
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  MasterStorage master_kind = MasterStorage::fp32;
  MomentStorage moments = MomentStorage::fp32;
  const float* master = nullptr;    // fp32 master; nullptr: decoded from `live` as it is written
  const uint16_t* master_bf16 = nullptr;  // a bf16 master (bf16-sr, bf16-kahan): its values (unit layout)
  const StateUnit* live = nullptr;        // the unit (for decoding a split master)
  const float* m = nullptr;         // fp32 moments (numel each)
  const float* v = nullptr;
  const uint8_t* qm = nullptr;  // quantized: code bytes
  const uint8_t* qv = nullptr;
  const float* scales = nullptr;   // quantized: [m absmax | v absmax], one per block
  const uint16_t* comp = nullptr;  // bf16-kahan
  bool muon = false;               // StateUnit::muon: the update rule is Muon
  std::vector<int64_t> v_off;      // entry k's v in v (StateUnit::v_at: -1 none)
  int64_t nv = 0;                  // v's elements (StateUnit::v_len)
};

// Floats a staging copy of u takes (the master as the file holds it: fp32, or
// bf16 for a bf16 master; the moments and compensation as held).
size_t unit_stage_floats(const StateUnit& u);
// A snapshot reading the live unit (a synchronous save).
UnitSnap unit_snap_live(const StateUnit& u);
// A snapshot of fp32 master, m and v (numel each) laid out as `layout`
// (AdamW): a data-parallel rank's unit gathered from every rank's slices.
UnitSnap unit_snap_fp32(const StateUnit& layout, const float* master, const float* m, const float* v);
// Copies u into dst (unit_stage_floats floats, a split master decoded) and
// returns the snapshot of the copy. Runs on the global thread pool.
UnitSnap unit_snap_stage(const StateUnit& u, float* dst);
// The file's bytes, in order, through write (header first).
void unit_snap_write(const UnitSnap& u, const std::function<void(const void*, size_t)>& write);
// The bytes unit_snap_write writes for u, exactly (it reads only u's layout and storages).
uint64_t unit_file_bytes(const UnitSnap& u);
// Data-free snapshots of every unit of a HostState of spec in the given
// storages and rule (its unit layout: tensors padded to 16 floats, v packed
// under Muon): what unit_file_bytes needs to size a checkpoint before any
// state exists.
std::vector<UnitSnap> unit_snap_layouts(const ModelSpec& spec, MasterStorage master, MomentStorage moments,
                                        UpdateRule rule);

// The moment storage a unit file holds (its metadata).
MomentStorage unit_file_moments(const std::string& path);
// The update rule a unit file's moments belong to (its metadata).
UpdateRule unit_file_update_rule(const std::string& path);
// Loads the file into u (master; moments and compensation when with_moments);
// every missing, unexpected or misshapen tensor is refused by name.
void unit_file_load(const std::string& path, StateUnit& u, bool with_moments);

}  // namespace rt
