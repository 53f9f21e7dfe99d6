// BPE from HF tokenizer.json; see hf_bpe.h for what is supported.
// Encode pipeline, as HF runs it:
//   raw text -> split on added tokens (normalized=false) -> normalize the rest
//   -> split on added tokens (normalized=true) -> pre-tokenize (Split / Digits
//   steps, ByteLevel) -> BPE per pre-token -> template tokens.
// Byte-level layouts: the vocabulary is also keyed by raw bytes (each token's
// byte-level characters mapped back through GPT-2's byte<->unicode table), so
// BPE runs on the input bytes directly and never builds the mapped strings.
// Character-level layouts (no ByteLevel step, e.g. Llama-2's): BPE starts
// from the characters of the pre-token as the vocab spells them.
#include "tokenizer/hf_bpe.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/hf_bpe_internal.h"

namespace rt {
namespace hf_bpe_detail {

namespace {
std::atomic<uint64_t> g_next_instance{1};

// Per-thread BPE result cache: pre-token bytes -> ids, for one tokenizer at a
// time (owner), bounded; switching tokenizers or filling up clears it.
struct BpeCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> map;  // -> (offset, count) in pool
  std::vector<int32_t> pool;
  std::vector<PiecePos> pos_pool;  // parallel to pool
};
thread_local BpeCache tl_bpe_cache;
constexpr size_t kCacheMaxPieceBytes = 64, kCacheMaxEntries = 1 << 17;
}  // namespace

uint64_t next_instance() { return g_next_instance.fetch_add(1); }

std::optional<int32_t> HfBpeTokenizer::token_to_id(std::string_view name) const {
  const std::string key(name);
  if (const auto it = added_by_name_.find(key); it != added_by_name_.end()) return it->second;
  if (const auto it = vocab_.find(key); it != vocab_.end()) return it->second;
  return std::nullopt;
}

void HfBpeTokenizer::pre_tokenize(Piece s, bool at_text_start, std::deque<std::string>& storage,
                                  std::deque<std::vector<TokenSpan>>& align_storage, std::vector<Piece>& out) const {
  std::vector<Piece> cur{s}, next;
  std::vector<std::pair<size_t, size_t>> matches;
  const char* origin = at_text_start ? s.text.data() : nullptr;  // a piece starting here starts the text
  for (const auto& st : steps_) {
    next.clear();
    for (Piece piece : cur) {
      if (st.kind == PreTokenizeStep::Kind::metaspace) {
        std::string& t = storage.emplace_back();
        const TokenSpan* align = nullptr;
        if (piece.align) {
          std::vector<TokenSpan>& a = align_storage.emplace_back(piece.align, piece.align + piece.text.size());
          t = replace_all_aligned(piece.text, " ", nullptr, st.replacement, a);
          align = a.data();
        } else {
          t = replace_all(piece.text, " ", nullptr, st.replacement);
        }
        const bool starts = t.compare(0, st.replacement.size(), st.replacement) == 0;
        if (!starts && (st.prepend == PreTokenizeStep::Prepend::always ||
                        (st.prepend == PreTokenizeStep::Prepend::first && piece.text.data() == origin))) {
          t.insert(0, st.replacement);
          if (align) {  // the prepended character belongs to the one it precedes
            std::vector<TokenSpan>& a = align_storage.back();
            const TokenSpan first = a.empty() ? TokenSpan{} : a[0];
            a.insert(a.begin(), st.replacement.size(), first);
            align = a.data();
          }
        }
        const Piece v{t, align};
        if (!st.metaspace_split) {
          next.push_back(v);
          continue;
        }
        size_t b = 0;
        for (size_t p = v.text.find(st.replacement, 1); p != std::string_view::npos;
             p = v.text.find(st.replacement, p + 1)) {
          if (p > b) next.push_back(v.sub(b, p - b));
          b = p;
        }
        if (b < v.text.size()) next.push_back(v.sub(b, v.text.size() - b));
        continue;
      }
      if (st.kind == PreTokenizeStep::Kind::byte_level && st.add_prefix_space && piece.text[0] != ' ') {
        std::string& t = storage.emplace_back();
        t.reserve(piece.text.size() + 1);
        t += ' ';
        t += piece.text;
        const TokenSpan* align = nullptr;
        if (piece.align) {  // the space belongs to the character it precedes
          std::vector<TokenSpan>& a = align_storage.emplace_back();
          a.reserve(t.size());
          a.push_back(piece.align[0]);
          a.insert(a.end(), piece.align, piece.align + piece.text.size());
          align = a.data();
        }
        piece = {t, align};
      }
      if (!st.regex) {
        next.push_back(piece);
        continue;
      }
      matches.clear();
      st.regex->find_all(piece.text, matches);
      const bool keep_matches = !(st.remove_matches && !st.invert);
      const bool keep_gaps = !(st.remove_matches && st.invert);
      size_t prev = 0;
      for (const auto& [b, e] : matches) {
        if (b > prev && keep_gaps) next.push_back(piece.sub(prev, b - prev));
        if (keep_matches) next.push_back(piece.sub(b, e - b));
        prev = e;
      }
      if (prev < piece.text.size() && keep_gaps) next.push_back(piece.sub(prev, piece.text.size() - prev));
    }
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

// A byte whose byte-level character is not in the vocab: byte fallback
// (<0xXX> of that character's UTF-8 bytes, as HF does it), else unk, else dropped.
// at: the byte's offset in the piece (the first token covers it, the others nothing).
void HfBpeTokenizer::push_missing_byte(uint8_t b, uint32_t at, std::vector<int32_t>& out,
                                       std::vector<PiecePos>& pos) const {
  const std::string& ch = byte_level_table().byte_to_utf8[b];
  if (byte_fallback_) {
    std::vector<int32_t> ids;
    for (unsigned char c : ch) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", c);
      const auto it = vocab_.find(name);
      if (it == vocab_.end()) break;
      ids.push_back(it->second);
    }
    if (ids.size() == ch.size()) {
      for (size_t k = 0; k < ids.size(); ++k) {
        out.push_back(ids[k]);
        pos.emplace_back(k == 0 ? at : at + 1, at + 1);
      }
      return;
    }
  }
  if (unk_id_) {
    if (fuse_unk_ && !out.empty() && out.back() == *unk_id_) {
      pos.back().second = at + 1;
    } else {
      out.push_back(*unk_id_);
      pos.emplace_back(at, at + 1);
    }
  }
}

void HfBpeTokenizer::initial_symbols_bytes(std::string_view piece, std::vector<int32_t>& sym,
                                           std::vector<PiecePos>& pos) const {
  for (uint32_t i = 0; i < piece.size(); ++i) {
    const auto b = static_cast<uint8_t>(piece[i]);
    if (byte_id_[b] >= 0) {
      sym.push_back(byte_id_[b]);
      pos.emplace_back(i, i + 1);
    } else {
      push_missing_byte(b, i, sym, pos);
    }
  }
}

// HF BPE::merge_word on characters: a character missing from the vocab
// becomes its UTF-8 bytes as <0xXX> tokens (byte_fallback, when all exist),
// else unk: one per character, or one per run with fuse_unk. As in HF, a
// pending unk is emitted only when the next in-vocab character or the end
// comes, so byte-fallback tokens right after an unk precede it (and so do
// their positions).
void HfBpeTokenizer::initial_symbols_chars(std::string_view piece, std::vector<int32_t>& sym,
                                           std::vector<PiecePos>& pos) const {
  bool unk_pending = false;
  PiecePos unk_pos{0, 0};
  std::string ch;
  for (size_t i = 0; i < piece.size();) {
    const auto b = static_cast<uint32_t>(i);
    utf8_next(piece, i);
    const auto e = static_cast<uint32_t>(i);
    ch.assign(piece.substr(b, e - b));
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      if (unk_pending) {
        sym.push_back(*unk_id_);
        pos.push_back(unk_pos);
      }
      unk_pending = false;
      sym.push_back(it->second);
      pos.emplace_back(b, e);
      continue;
    }
    if (byte_fallback_) {
      const size_t before = sym.size();
      bool all = true;
      for (uint32_t k = 0; k < ch.size(); ++k) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned char>(ch[k]));
        const auto it = vocab_.find(name);
        if (it == vocab_.end()) {
          all = false;
          break;
        }
        sym.push_back(it->second);
        pos.emplace_back(b + k, b + k + 1);
      }
      if (all) continue;
      sym.resize(before);
      pos.resize(before);
    }
    if (unk_id_) {
      if (unk_pending && !fuse_unk_) {
        sym.push_back(*unk_id_);
        pos.push_back(unk_pos);
      }
      if (unk_pending && fuse_unk_)
        unk_pos.second = e;
      else
        unk_pos = {b, e};
      unk_pending = true;
    }
  }
  if (unk_pending) {
    sym.push_back(*unk_id_);
    pos.push_back(unk_pos);
  }
}

// Standard BPE on one pre-token: repeatedly merge the adjacent pair with the
// lowest merge rank (leftmost first on ties), via a heap over a linked list.
// Symbols missing from the vocab are replaced first (initial_symbols_*), as
// HF builds its word before merging. pos gets each output token's bytes.
void HfBpeTokenizer::bpe_merge(std::string_view piece, std::vector<int32_t>& out, std::vector<PiecePos>& pos) const {
  std::vector<int32_t> sym;
  std::vector<PiecePos> sp;
  sym.reserve(piece.size());
  sp.reserve(piece.size());
  if (byte_level_)
    initial_symbols_bytes(piece, sym, sp);
  else
    initial_symbols_chars(piece, sym, sp);
  const int n = static_cast<int>(sym.size());
  if (n == 0) return;
  if (n == 1) {
    out.push_back(sym[0]);
    pos.push_back(sp[0]);
    return;
  }
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int pos;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  auto lookup = [&](int a, int b) -> const Merge* {
    const auto it = merges_.find((static_cast<uint64_t>(sym[a]) << 32) | static_cast<uint32_t>(sym[b]));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::vector<Cand> heap_store;
  heap_store.reserve(n);
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap(std::greater<Cand>(), std::move(heap_store));
  for (int i = 0; i + 1 < n; ++i)
    if (const Merge* m = lookup(i, i + 1)) heap.push({m->rank, i});
  std::vector<uint8_t> dead(n, 0);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (dead[c.pos] || next[c.pos] < 0) continue;
    const int r = next[c.pos];
    const Merge* m = lookup(c.pos, r);
    if (!m || m->rank != c.rank) continue;  // stale: a neighbour changed
    sym[c.pos] = m->new_id;
    sp[c.pos].second = sp[r].second;
    dead[r] = 1;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    if (prev[c.pos] >= 0)
      if (const Merge* pm = lookup(prev[c.pos], c.pos)) heap.push({pm->rank, prev[c.pos]});
    if (next[c.pos] >= 0)
      if (const Merge* nm = lookup(c.pos, next[c.pos])) heap.push({nm->rank, c.pos});
  }
  for (int i = 0; i >= 0; i = next[i]) {
    out.push_back(sym[i]);
    pos.push_back(sp[i]);
  }
}

void HfBpeTokenizer::bpe_piece(std::string_view piece, std::vector<int32_t>& out, std::vector<PiecePos>* pos) const {
  if (ignore_merges_) {
    const auto& v = byte_level_ ? raw_vocab_ : vocab_;
    if (const auto it = v.find(std::string(piece)); it != v.end()) {
      out.push_back(it->second);
      if (pos) pos->emplace_back(0, static_cast<uint32_t>(piece.size()));
      return;
    }
  }
  std::vector<PiecePos> local;
  std::vector<PiecePos>& p = pos ? *pos : local;
  if (piece.size() > kCacheMaxPieceBytes) {
    bpe_merge(piece, out, p);
    return;
  }
  BpeCache& cache = tl_bpe_cache;
  if (cache.owner != instance_ || cache.map.size() >= kCacheMaxEntries) {
    cache.map.clear();
    cache.pool.clear();
    cache.pos_pool.clear();
    cache.owner = instance_;
  }
  std::string key(piece);
  if (const auto it = cache.map.find(key); it != cache.map.end()) {
    const auto [off, cnt] = it->second;
    out.insert(out.end(), cache.pool.begin() + off, cache.pool.begin() + off + cnt);
    if (pos) pos->insert(pos->end(), cache.pos_pool.begin() + off, cache.pos_pool.begin() + off + cnt);
    return;
  }
  const size_t before = out.size(), pos_before = p.size();
  bpe_merge(piece, out, p);
  const auto off = static_cast<uint32_t>(cache.pool.size());
  cache.pool.insert(cache.pool.end(), out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
  cache.pos_pool.insert(cache.pos_pool.end(), p.begin() + static_cast<std::ptrdiff_t>(pos_before), p.end());
  cache.map.emplace(std::move(key), std::pair<uint32_t, uint32_t>{off, static_cast<uint32_t>(out.size() - before)});
}

void HfBpeTokenizer::encode_impl(std::string_view text, bool add_special, std::vector<int32_t>& out,
                                 std::vector<TokenSpan>* spans) const {
  if (const size_t bad = utf8_find_invalid(text); bad != std::string_view::npos)
    fail("[tokenizer] input text is not valid UTF-8: byte 0x", std::hex,
         static_cast<int>(static_cast<uint8_t>(text[bad])), std::dec, " at byte offset ", bad,
         " starts an invalid sequence; convert the data to UTF-8 first");
  out.reserve(text.size() / 3 + 8);
  // spans: template tokens are empty at the text's ends; an added token spans
  // its match (with the whitespace lstrip / rstrip took); BPE tokens map their
  // piece bytes through the piece's alignment.
  auto add_empty = [&](size_t n, size_t at) {
    if (spans) spans->insert(spans->end(), n, TokenSpan{at, at});
  };
  if (add_special) {
    out.insert(out.end(), prefix_.begin(), prefix_.end());
    add_empty(prefix_.size(), 0);
  }

  std::vector<Segment> raw_segs, segs;
  raw_matcher_.split(text, raw_segs);
  std::deque<std::string> storage;  // normalized text and prefixed pieces live here for this call
  std::deque<std::vector<TokenSpan>> align_storage;  // their alignments (spans only)
  std::vector<Piece> pieces;
  std::vector<PiecePos> pos;
  for (const Segment& rs : raw_segs) {
    const auto rs_begin = static_cast<size_t>(rs.text.data() - text.data());
    if (rs.added_id >= 0) {
      out.push_back(rs.added_id);
      if (spans) spans->push_back({rs_begin, rs_begin + rs.text.size()});
      continue;
    }
    std::string_view norm = rs.text;
    const TokenSpan* norm_align = nullptr;
    if (spans) {
      std::vector<TokenSpan>& a = align_storage.emplace_back();
      if (normalizer_.empty()) {
        align_identity(rs.text, rs_begin, a);
      } else {
        storage.push_back(normalizer_.apply_aligned(rs.text, rs_begin, a));
        norm = storage.back();
      }
      norm_align = a.data();
    } else if (!normalizer_.empty()) {
      storage.push_back(normalizer_.apply(rs.text));
      norm = storage.back();
    }
    segs.clear();
    normalized_matcher_.split(norm, segs);
    for (const Segment& s : segs) {
      const Piece seg{s.text, norm_align ? norm_align + (s.text.data() - norm.data()) : nullptr};
      if (s.added_id >= 0) {
        out.push_back(s.added_id);
        if (spans) spans->push_back({seg.align[0].begin, seg.align[s.text.size() - 1].end});
        continue;
      }
      pieces.clear();
      pre_tokenize(seg, rs.text.data() == text.data() && s.text.data() == norm.data(), storage, align_storage, pieces);
      for (const Piece& p : pieces) {
        if (!spans) {
          bpe_piece(p.text, out, nullptr);
          continue;
        }
        pos.clear();
        bpe_piece(p.text, out, &pos);
        for (const auto& [b, e] : pos) {
          if (b < e) {
            spans->push_back({p.align[b].begin, p.align[e - 1].end});
          } else {  // a byte-fallback token after the first of one byte: empty, where that byte ends
            const size_t at = p.align[b - 1].end;
            spans->push_back({at, at});
          }
        }
      }
    }
  }
  if (add_special) {
    out.insert(out.end(), suffix_.begin(), suffix_.end());
    add_empty(suffix_.size(), text.size());
  }
}

std::string HfBpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  auto kept = [&](int32_t id) {
    return id >= 0 && static_cast<size_t>(id) < decode_bytes_.size() && id_defined_[id] &&
           !(skip_special && id_special_[id]);
  };
  if (decoder_.only_byte_level()) {  // fast path: per-token bytes precomputed
    std::string bytes;
    for (const int32_t id : ids)
      if (kept(id)) bytes += decode_bytes_[id];
    return utf8_lossy(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids)
    if (kept(id)) tokens.push_back(id_token_[id]);
  return decoder_.apply(std::move(tokens));
}

}  // namespace hf_bpe_detail

std::unique_ptr<Tokenizer> hf_bpe_tokenizer_load(const std::string& json_path, const std::string& config_path) {
  return std::make_unique<hf_bpe_detail::HfBpeTokenizer>(json_path, config_path);
}

}  // namespace rt
