#!/usr/bin/env bash
# Issue 33: a 32,002-token vocabulary (a 32,000 vocabulary plus two added tokens, as several Mistral chat
# fine-tunes ship) trains on CUDA and exports a model transformers loads with the same function.
#   tests/gpu/vocab32002.sh BIN_DIR WORK_DIR        (DEVICE=cpu runs the same on the CPU backend)
# A small Mistral shape (2 layers, hidden 256, untied head) with vocab_size 32002 is trained 3 steps from random
# init on ids that include the two added ones (32000, 32001, every 50th token) so their rows get gradients; the
# fp32 export must hold embed_tokens and lm_head as [32002, 256] (the device's padding rows invisible), and
# transformers' loss on 3 rows of 48 ids (the added ones among them) must equal ours (`ramtrain loss`, the CPU
# reference on the exported weights) within 1e-5 relative: the loss is a softmax over all 32,002 logits at
# every position, so a stray or missing row would move it. Prints VOCAB32002-EXPORT-OK.
set -euo pipefail
bin=$1 d=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$d"; mkdir -p "$d/cfg"
cat > "$d/cfg/config.json" <<'JSON'
{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 256, "intermediate_size": 512,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32002,
 "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "sliding_window": null, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
JSON
python3 - "$d" <<'PY'
import array, random, sys
d = sys.argv[1]
random.seed(0)
ids = [random.randrange(32002) for _ in range(20000)]
for i in range(0, len(ids), 50):
    ids[i] = 32000 + (i // 50) % 2
array.array('H', ids).tofile(open(f'{d}/train.bin', 'wb'))
with open(f'{d}/tokens.txt', 'w') as f:
    for _ in range(3):
        f.write(' '.join(str(32000 + j % 2) if j % 7 == 0 else str(random.randrange(32002)) for j in range(48)) + '\n')
PY
"$bin/ramtrain" train --model "$d/cfg" --init random --data "$d/train.bin" --seq-len 64 --micro-batch 2 --steps 3 \
  --eval-every 0 --device "${DEVICE:-cuda}" --export-dtype fp32 --out "$d/run" | grep -E "backend|vocab|step +3|saved"
python3 - "$d/run/final" <<'PY'
import json, struct, sys
path = sys.argv[1] + '/model.safetensors'
with open(path, 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    head = json.loads(f.read(n))
for name in ('model.embed_tokens.weight', 'lm_head.weight'):
    shape = head[name]['shape']
    print(name, shape)
    if shape != [32002, 256]:
        sys.exit(f'{path}: {name} is {shape}, expected [32002, 256]')
PY
"$bin/ramtrain" loss --model "$d/run/final" --tokens "$d/tokens.txt" --json | tee "$d/ours.json"
ours=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['loss'])" "$d/ours.json")
python3 "$here/tools/check_hf_export.py" "$d/run/final" --tokens "$d/tokens.txt" --expect-loss "$ours" --rtol 1e-5
echo VOCAB32002-EXPORT-OK
