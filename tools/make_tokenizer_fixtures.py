#!/usr/bin/env python3
"""Builds the tokenizer golden fixtures under tests/fixtures/tokenizers/.

Usage: python3 tools/make_tokenizer_fixtures.py /path/to/tinyshakespeare.txt [out_dir]

Trains small byte-level BPE tokenizers with HF `tokenizers`, each laid out
the way a real model's tokenizer.json is (GPT-2, Llama-3, Qwen2, and DeepSeek's
Split + Digits pre-tokenizer, with individual and grouped digits), and, when the
`sentencepiece` package is installed, a small Llama-2-style SentencePiece BPE
model, plus from it (with `transformers`):
  llama2_json:     the Llama-2-era tokenizer.json that transformers converts it to
                   (Prepend/Replace normalizers, character BPE with byte fallback,
                   Replace/ByteFallback/Fuse/Strip decoder), with added tokens;
  llama2_metaspace, metaspace_split: the same vocab behind a Metaspace
                   pre-tokenizer (transformers' legacy=False layout, and a
                   splitting one with the Metaspace decoder);
  sp_llama2_special: the tokenizer.model with tokenizer_config.json,
                   added_tokens.json and special_tokens_map.json: ids from the slow
                   LlamaTokenizer (added/special tokens in text map to their ids),
                   checked equal to the fast tokenizer's; decodes from the fast one. For every text of the test corpus (a stress text written below plus 50
lines of Shakespeare) it writes the reference ids and decodings to golden.jsonl:
  {"text", "ids" (add_special=True), "ids_no_special", "decoded" (decode of
   ids_no_special, skip_special=False), "decoded_skip" (decode of ids,
   skip_special=True), "prefix_ids", "decoded_prefix" (decode of the first half
   of ids_no_special: partial UTF-8 sequences come out as U+FFFD)}
and meta.json {"vocab_size", "bos_id", "eos_id"} as HF resolves them from
tokenizer_config.json. Shakespeare is read, never copied, except the 50 corpus
lines that go into golden.jsonl. Deterministic: reruns write identical files.
"""
import io
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

# The split regexes exactly as the real tokenizer.json files carry them.
GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
               r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

VOCAB_SIZE = 800

STRESS = [
    "",
    " ",
    "\n",
    "Hello world",
    " Hello world, with a leading space",
    "日本語のテキストと中文字符，还有한국어 문장도 있습니다。",
    "中文：我们今天去北京。東京タワーは高い！",
    "Family: 👨‍👩‍👧‍👦, couple 👩‍❤️‍👨, flags 🇯🇵🇺🇸, thumbs 👍🏽, fire heart ❤️‍🔥 done 🙂",
    # combining marks: decomposed (NFC changes them) then precomposed
    "e\u0301te\u0301 cafe\u0301 man\u0303ana A\u030angstro\u0308m",
    "été café mañana Ångström naïve Æsir",
    "Tiếng Việt có dấu: Người ta nói rằng",
    "Hangul jamo \u1100\u1161\u11a8 and syllable 각, ohm \u2126 angstrom \u212b",
    "dots a\u0323\u0307 vs a\u0307\u0323, qa \u0958, \u0915\u093c",
    "a    b\t\t\tc      \n\n\n   d",
    "   leading and trailing spaces   ",
    "tabs\tand\u00a0nbsp\u3000ideographic\u2028line sep\u0085nel\u000bvt\u000cff x \u0085y \u0085\u0085 z",
    "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
    "pi=3.14159, date 2024-06-01, cost $1,000,000.00, ²½٣Ⅻ",
    "def f(x):\n\tif x > 0:\n\t\treturn x ** 2  # square\n\treturn -x\n",
    "int main() {\r\n    printf(\"hi\\n\");\r\n    return 0;\r\n}\r\n",
    "line one\r\nline two\r\n\r\nline four\r",
    "a tokenizer is unreachable; tokenizers unreachable",
    "mongolian \u180evowel \u180e\u180e sep\u180e x",
    "I'm you're they've we'll he'd it's DON'T I'M SHE'S 'tis",
    "<|begin_of_text|>Hi there<|end_of_text|> and <|endoftext|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "x<|endoftext|><|endoftext|>y <|im_end|><|im_start|> z<|eot_id|>",
    "<|endoftext",
    "mask: <mask>, spaced   <mask>  end, ramtrain ramtrains xramtrain ramtrain's",
    "!!!??? ... ---- ==== ((())) [[]] {{}} <<>> @@ ## $$ %% ^^ && ** __",
    "Привет, мир! Γειά σου κόσμε! مرحبا بالعالم नमस्ते दुनिया สวัสดีชาวโลก",
    "a" * 300,
    " " * 200 + "x",
    "9" * 50,
    "\n\n\n\n",
    "word\n \n\t\nword",
]


# Texts with the special and added tokens of the SentencePiece-based fixtures.
SPECIAL_TEXTS = [
    "<s>Hello</s> world",
    "<s> spaced </s>  twice <unk>x",
    "a<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_end|><|im_end|> <|im_start|>",
    "ramtrain ramtrains xramtrain ramtrain's, ramtrain",
    "<s",
    "</s>",
    "x <pad> y",
    "digits 1234567 and ２３ and ٣٤",
]


def shakespeare_lines(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    return lines[100:150]


def training_corpus(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chunks = [text[i:i + 4096] for i in range(0, len(text), 4096)]
    # The stress text a few times, so merges of multi-byte characters exist,
    # and runs of " U+180E" so that merges span U+180E, which PCRE2's \s
    # matches and Oniguruma's (HF's engine) does not: ramtrain rewrites \s.
    return chunks + STRESS * 5 + [" \u180e" * 1000 + "x"] * 4


def train(pre_tokenizer, normalizer, corpus):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def build_gpt2(corpus):
    tok = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), None, corpus)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    # Beyond real GPT-2: RoBERTa's lstrip <mask> and a non-special single-word
    # added token, to cover the added-token flags.
    tok.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("ramtrain", single_word=True, normalized=True)])
    data = json.loads(tok.to_str())
    # Real GPT-2 files store merges as "a b" strings.
    data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    return data, config


def build_llama3(corpus):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok = train(pre, None, corpus)
    # Real Llama-3 vocabs hold tokens that BPE merges never reach; ignore_merges
    # emits such a pre-token whole. Two of them, so the flag is exercised.
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for word in ["\u0120tokenizer", "\u0120unreachable"]:
        assert word not in vocab
        vocab[word] = len(vocab)
    data["model"]["ignore_merges"] = True  # as Llama-3 ships it
    tok = Tokenizer.from_str(json.dumps(data))
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A:0 <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    data = json.loads(tok.to_str())
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    return data, config


def build_qwen2(corpus):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok = train(pre, normalizers.NFC(), corpus)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    data = json.loads(tok.to_str())
    config = {"bos_token": None, "eos_token": "<|im_end|>"}
    return data, config


def build_deepseek(corpus, individual_digits):
    # DeepSeek's layout: Split steps, then Digits, then ByteLevel without its regex.
    # The letter class is shortened from the real one (same kind of pattern).
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("[\r\n]"), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex("\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba]+"),
                             behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex("\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"),
                             behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex("\\s+$"), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex("[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"), behavior="isolated",
                             invert=False),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok = train(pre, None, corpus)
    specials = ["<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos = tok.token_to_id(specials[0])
    tok.post_processor = processors.TemplateProcessing(single=specials[0] + " $A", special_tokens=[(specials[0], bos)])
    data = json.loads(tok.to_str())
    # Trained with grouped digits, so the vocab has multi-digit tokens and the
    # two settings give different ids; then the setting under test.
    digits = [p for p in data["pre_tokenizer"]["pretokenizers"] if p["type"] == "Digits"]
    digits[0]["individual_digits"] = individual_digits
    config = {"bos_token": specials[0], "eos_token": specials[1]}
    return data, config


def write_json(path, obj, compact=False):
    with open(path, "w", encoding="utf-8") as f:
        if compact:
            json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        else:
            json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def write_golden(path, texts, encode, decode):
    with open(path, "w", encoding="utf-8") as f:
        for text in texts:
            ids = encode(text, True)
            ids_ns = encode(text, False)
            half = ids_ns[: len(ids_ns) // 2]
            rec = {"text": text, "ids": ids, "ids_no_special": ids_ns,
                   "decoded": decode(ids_ns, False), "decoded_skip": decode(ids, True),
                   "prefix_ids": half, "decoded_prefix": decode(half, False)}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def make_hf(name, builder, corpus, texts, out_dir):
    data, config = builder(corpus)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, "tokenizer.json"), data, compact=True)
    write_json(os.path.join(d, "tokenizer_config.json"), config)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))  # reload: test what is on disk
    write_golden(os.path.join(d, "golden.jsonl"), texts,
                 lambda t, s: tok.encode(t, add_special_tokens=s).ids,
                 lambda ids, s: tok.decode(ids, skip_special_tokens=s))
    meta = {"vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "bos_id": tok.token_to_id(config["bos_token"]) if config["bos_token"] else None,
            "eos_id": tok.token_to_id(config["eos_token"]) if config["eos_token"] else None}
    write_json(os.path.join(d, "meta.json"), meta)
    print(f"{name}: vocab {meta['vocab_size']}, {len(texts)} texts")


def make_sentencepiece(corpus, texts, out_dir):
    try:
        import sentencepiece as spm
    except ImportError:
        print("sentencepiece not installed: skipping the SentencePiece fixtures")
        return False
    d = os.path.join(out_dir, "sp_llama2")
    os.makedirs(d, exist_ok=True)
    # Llama-2's settings: BPE, byte fallback, split digits, identity normalization.
    # Sentences come from an iterator and the model goes to memory, so no
    # temporary path ends up in the model's trainer_spec.
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([c.replace("\r", "") for c in corpus]), model_writer=buf, vocab_size=VOCAB_SIZE,
        model_type="bpe", byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        character_coverage=0.9995, num_threads=1, minloglevel=2, max_sentence_length=1 << 16,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    model = buf.getvalue()
    with open(os.path.join(d, "tokenizer.model"), "wb") as f:
        f.write(model)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
    write_golden(os.path.join(d, "golden.jsonl"), texts,
                 lambda t, s: ([sp.bos_id()] if s else []) + sp.encode(t),
                 lambda ids, s: sp.decode(ids))
    write_json(os.path.join(d, "meta.json"),
               {"vocab_size": sp.get_piece_size(), "bos_id": sp.bos_id(), "eos_id": sp.eos_id()})
    print(f"sp_llama2: vocab {sp.get_piece_size()}, {len(texts)} texts")
    return True


def make_sp_derived(out_dir, texts):
    """llama2_json and sp_llama2_special, from sp_llama2/tokenizer.model."""
    import shutil
    import tempfile
    from transformers import AddedToken as TfAddedToken
    from transformers import LlamaTokenizer, LlamaTokenizerFast
    model = os.path.join(out_dir, "sp_llama2", "tokenizer.model")
    added = [TfAddedToken("<|im_start|>", special=True, normalized=False),
             TfAddedToken("<|im_end|>", special=True, normalized=False)]

    # llama2_json: the legacy tokenizer.json transformers writes for a Llama
    # tokenizer.model, with two special tokens and a normalized (so spelled
    # "\u2581ramtrain" in the normalized text) non-special one.
    fast = LlamaTokenizerFast(vocab_file=model, legacy=True, from_slow=True, add_prefix_space=True)
    fast.add_special_tokens({"additional_special_tokens": added})
    fast.add_tokens([TfAddedToken("ramtrain", special=False, normalized=True)])
    d = os.path.join(out_dir, "llama2_json")
    os.makedirs(d, exist_ok=True)
    data = json.loads(fast.backend_tokenizer.to_str())
    write_json(os.path.join(d, "tokenizer.json"), data, compact=True)
    config = {"bos_token": "<s>", "eos_token": "</s>"}
    write_json(os.path.join(d, "tokenizer_config.json"), config)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    write_golden(os.path.join(d, "golden.jsonl"), texts,
                 lambda t, s: tok.encode(t, add_special_tokens=s).ids,
                 lambda ids, s: tok.decode(ids, skip_special_tokens=s))
    write_json(os.path.join(d, "meta.json"), {"vocab_size": tok.get_vocab_size(with_added_tokens=True),
                                              "bos_id": tok.token_to_id("<s>"), "eos_id": tok.token_to_id("</s>")})
    print(f"llama2_json: vocab {tok.get_vocab_size(with_added_tokens=True)}, {len(texts)} texts")

    # llama2_metaspace: what transformers writes with legacy=False (Metaspace
    # pre-tokenizer, prepend_scheme "first", no normalizer); metaspace_split:
    # the same vocab with the Metaspace pre-tokenizer splitting and prepending
    # always, and the Metaspace decoder (the layout of SentencePiece models
    # converted by transformers' generic SpmConverter).
    fast = LlamaTokenizerFast(vocab_file=model, legacy=False, from_slow=True, add_prefix_space=True)
    fast.add_special_tokens({"additional_special_tokens": added})
    data = json.loads(fast.backend_tokenizer.to_str())
    assert data["pre_tokenizer"]["type"] == "Metaspace" and data["pre_tokenizer"]["prepend_scheme"] == "first"
    split = json.loads(json.dumps(data))
    split["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    split["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    for name, d_json in [("llama2_metaspace", data), ("metaspace_split", split)]:
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        write_json(os.path.join(d, "tokenizer.json"), d_json, compact=True)
        write_json(os.path.join(d, "tokenizer_config.json"), config)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        write_golden(os.path.join(d, "golden.jsonl"), texts,
                     lambda t, s: tok.encode(t, add_special_tokens=s).ids,
                     lambda ids, s: tok.decode(ids, skip_special_tokens=s))
        write_json(os.path.join(d, "meta.json"), {"vocab_size": tok.get_vocab_size(with_added_tokens=True),
                                                  "bos_id": tok.token_to_id("<s>"), "eos_id": tok.token_to_id("</s>")})
        print(f"{name}: vocab {tok.get_vocab_size(with_added_tokens=True)}, {len(texts)} texts")

    # sp_llama2_special: the model plus the three JSON files transformers writes.
    d = os.path.join(out_dir, "sp_llama2_special")
    os.makedirs(d, exist_ok=True)
    slow = LlamaTokenizer(vocab_file=model, legacy=True)
    slow.add_special_tokens({"additional_special_tokens": added, "pad_token": "<pad>"})
    with tempfile.TemporaryDirectory() as tmp:
        slow.save_pretrained(tmp)
        shutil.copy(model, os.path.join(d, "tokenizer.model"))
        for name in ["tokenizer_config.json", "added_tokens.json", "special_tokens_map.json"]:
            with open(os.path.join(tmp, name), encoding="utf-8") as f:
                obj = json.load(f)
            if name == "tokenizer_config.json":
                obj.pop("name_or_path", None)  # a temporary path
            write_json(os.path.join(d, name), obj)
    slow = LlamaTokenizer.from_pretrained(d, legacy=True)
    fast = LlamaTokenizerFast.from_pretrained(d, legacy=True, from_slow=True)

    def encode(t, s):
        ids = slow.encode(t, add_special_tokens=s)
        assert ids == fast.encode(t, add_special_tokens=s), ("slow and fast differ", t)
        return ids
    write_golden(os.path.join(d, "golden.jsonl"), texts, encode,
                 lambda ids, s: fast.backend_tokenizer.decode(ids, skip_special_tokens=s))
    write_json(os.path.join(d, "meta.json"), {"vocab_size": len(slow), "bos_id": slow.bos_token_id,
                                              "eos_id": slow.eos_token_id})
    print(f"sp_llama2_special: vocab {len(slow)}, {len(texts)} texts")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: make_tokenizer_fixtures.py TINYSHAKESPEARE.txt [OUT_DIR]")
    src = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "tests", "fixtures", "tokenizers")
    corpus = training_corpus(src)
    lines = shakespeare_lines(src)
    texts = STRESS + lines + ["\n".join(lines[:20])]
    texts.append("\n".join(STRESS) + "\n" + "\n".join(lines))  # one long text
    make_hf("gpt2", build_gpt2, corpus, texts, out_dir)
    make_hf("llama3", build_llama3, corpus, texts, out_dir)
    make_hf("qwen2", build_qwen2, corpus, texts, out_dir)
    make_hf("deepseek", lambda c: build_deepseek(c, True), corpus, texts, out_dir)
    small = STRESS + SPECIAL_TEXTS + lines[:10]
    make_hf("deepseek_grouped_digits", lambda c: build_deepseek(c, False), corpus, small, out_dir)
    if make_sentencepiece(corpus, texts, out_dir):
        make_sp_derived(out_dir, small)


if __name__ == "__main__":
    main()
