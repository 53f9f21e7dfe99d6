#!/usr/bin/env python3
"""Goldens for ramtrain's chat loss masks (src/data/chat_example.cpp) and
token offsets (Tokenizer::encode_with_offsets).

For each fixture tokenizer in tests/fixtures/tokenizers (tokenizer.json only;
nothing is downloaded) and a chat template that marks each assistant turn with
{% generation %} (the turn's content and its end-of-turn token, as HF's
return_assistant_tokens_mask reads it), renders boundary-case conversations
with transformers' apply_chat_template(tokenize=True, return_dict=True,
return_assistant_tokens_mask=True) and writes
tests/fixtures/chat_masks/cases.json:
  {"versions", "templates": {name: text}, "cases": [
     {"name", "tokenizer" (fixture dir), "template", "kwargs" (bos_token,
      eos_token), "messages", "text" (the rendering), "ids", "assistant_masks",
      "offsets" ([begin, end) in BYTES of text, from return_offsets_mapping,
      whose character offsets are converted)}]}
The fixture tokenizers' ByteLevel post-processors have trim_offsets=false, so
HF's offsets are the untrimmed spans ramtrain reports.

Usage: /work/venv/bin/python3 tools/make_chat_mask_fixtures.py
"""
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOK_DIR = os.path.join(HERE, "..", "tests", "fixtures", "tokenizers")
OUT = os.path.join(HERE, "..", "tests", "fixtures", "chat_masks", "cases.json")

TEMPLATES = {
    # Qwen's ChatML with the assistant turn in a generation block (no default system prompt)
    "chatml": ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
               "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
               "{% endgeneration %}{{ '\\n' }}{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    # Llama-3's layout
    "llama3": ("{{ bos_token }}{% for message in messages %}"
               "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
               "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|eot_id|>' }}"
               "{% endgeneration %}{% else %}{{ message['content'] + '<|eot_id|>' }}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"),
}

# tokenizer fixture -> (template, a special token of that tokenizer for the special-token cases)
TOKENIZERS = {
    "qwen2": ("chatml", "<|endoftext|>"),           # byte-level, NFC normalizer
    "llama3": ("llama3", "<|end_of_text|>"),        # byte-level, add_prefix_space
    "llama2_json": ("chatml", "</s>"),              # Prepend + Replace normalizers, character BPE, byte fallback
    "llama2_metaspace": ("chatml", "</s>"),         # Metaspace pre-tokenizer (prepend_scheme first)
}


def conversations(special):
    return {
        "newline_reply": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\n\n\nYes"}],
        "space_reply": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello there"}],
        "spaces_reply": [{"role": "user", "content": "Hi "}, {"role": "assistant", "content": "   two  spaces "}],
        "special_reply": [{"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": special + "Sure" + special}],
        "special_user": [{"role": "user", "content": "Say " + special},
                         {"role": "assistant", "content": "ok"}],
        "empty_reply": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}],
        "multi_turn": [
            {"role": "system", "content": "Be terse.  "},
            {"role": "user", "content": "  Count:\n"},
            {"role": "assistant", "content": "1 2 3\n"},
            {"role": "user", "content": "Ça va? 🙂"},
            {"role": "assistant", "content": "\tTrès bien — merci! 🎉 "},
        ],
    }


def byte_offsets(text, offsets):
    pos = [0]
    for ch in text:
        pos.append(pos[-1] + len(ch.encode("utf-8")))
    return [[pos[b], pos[e]] for b, e in offsets]


def main():
    cases = []
    for tname, (tpl_name, special) in TOKENIZERS.items():
        d = os.path.join(TOK_DIR, tname)
        cfg = json.load(open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8"))
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"),
                                      bos_token=cfg.get("bos_token"), eos_token=cfg.get("eos_token"))
        kwargs = {"bos_token": cfg.get("bos_token"), "eos_token": cfg.get("eos_token")}
        for cname, messages in conversations(special).items():
            tpl = TEMPLATES[tpl_name]
            text = tok.apply_chat_template(messages, chat_template=tpl, tokenize=False)
            out = tok.apply_chat_template(messages, chat_template=tpl, tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            assert list(enc["input_ids"]) == list(out["input_ids"]), (tname, cname)
            cases.append({"name": f"{tname}/{cname}", "tokenizer": tname, "template": tpl_name, "kwargs": kwargs,
                          "messages": messages, "text": text, "ids": list(out["input_ids"]),
                          "assistant_masks": list(out["assistant_masks"]),
                          "offsets": byte_offsets(text, enc["offset_mapping"])})
    doc = {"versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
           "templates": TEMPLATES, "cases": cases}
    tmp = OUT + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, OUT)
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
