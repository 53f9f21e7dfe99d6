"""The Python API against the CLI it mirrors (pytest; a CPU build is enough).

Run: pip install . (or a wheel), then pytest python/tests. scripts/test.sh does both."""
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

import ramtrain

ROOT = Path(__file__).resolve().parents[2]
QWEN2_TOKENIZER = ROOT / "tests" / "fixtures" / "tokenizers" / "qwen2"
TEXT = ROOT / "README.md"  # plain text for the byte-level preset, as the CLI's own examples use


def cli_command():
    """The `ramtrain` executable pip installed, else `python -m ramtrain`."""
    exe = os.path.join(sysconfig.get_path("scripts"), "ramtrain")
    if os.path.isfile(exe):
        return [exe]
    exe = shutil.which("ramtrain")
    return [exe] if exe else [sys.executable, "-m", "ramtrain"]


def tiny(out, **kw):
    """A few steps of the tiny-byte preset: small enough for a 2-core CI machine."""
    opts = dict(preset="tiny-byte", data=TEXT, seq_len=64, micro_batch=2, steps=4, eval_every=2,
                eval_batches=2, out=out, threads=2, device="cpu")
    opts.update(kw)
    return ramtrain.train(**opts)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_train_callbacks_get_the_metrics_records(tmp_path):
    steps, evals = [], []
    # a Python thread runs on while the engine works (the GIL is released): it counts between the steps
    ticks, ticks_at_step, done = [0], [], threading.Event()

    def ticker():
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.001)
    t = threading.Thread(target=ticker)
    t.start()
    try:
        run = tiny(tmp_path / "run", on_step=lambda r: (steps.append(r), ticks_at_step.append(ticks[0])),
                   on_eval=evals.append)
    finally:
        done.set()
        t.join()
    assert ticks_at_step[-1] > ticks_at_step[0]
    on_disk = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert evals and all("val_loss" in r for r in evals)
    # the same records, in the same order, as the metrics file (exact doubles both ways)
    assert run.records == on_disk
    assert sorted(steps + evals, key=on_disk.index) == on_disk
    assert run.out == str(tmp_path / "run")
    assert run.final_metrics["step"] == 4 and run.final_metrics["loss"] == steps[-1]["loss"]
    assert run.final_metrics["val_loss"] == [r for r in evals if r.get("final")][-1]["val_loss"]
    assert run.model == str(tmp_path / "run" / "final")
    assert (tmp_path / "run" / "final" / "config.json").is_file()

    # the exported model through sample and evaluate, the CLI's commands too
    text = ramtrain.sample(model=run.model, prompt="The ", max_tokens=8, seed=3, temperature=0)
    assert text.startswith("The ")
    cli_text = subprocess.run(cli_command() + ["sample", "--model", run.model, "--prompt", "The ", "--max-tokens", "8",
                                               "--seed", "3", "--temperature", "0"],
                              check=True, capture_output=True, text=True).stdout
    assert cli_text == text + "\n"
    ev = ramtrain.evaluate(model=run.model, data=TEXT, seq_len=64, device="cpu")
    cli_ev = subprocess.run(cli_command() + ["eval", "--model", run.model, "--data", str(TEXT), "--seq-len", "64",
                                             "--device", "cpu", "--json"],
                            check=True, capture_output=True, text=True).stdout
    assert ev == json.loads(cli_ev.strip().splitlines()[-1])


def test_plan_is_plan_json():
    opts = ["--preset", "qwen2.5-7b", "--gpu", "rtx3080", "--micro-batch", "2", "--grad-accum", "16"]
    got = ramtrain.plan(preset="qwen2.5-7b", gpu="rtx3080", micro_batch=2, grad_accum=16)
    cli = subprocess.run(cli_command() + ["plan", *opts, "--json"], capture_output=True, text=True)
    assert got == json.loads(cli.stdout)


def test_errors_name_the_option(tmp_path):
    with pytest.raises(ramtrain.RamtrainError) as e:
        tiny(tmp_path / "bad", lr=-1.0)
    assert "--lr" in str(e.value) and e.value.option == "lr" and e.value.command == "train"
    # the CLI refuses it with the same message
    cli = subprocess.run(cli_command() + ["train", "--preset", "tiny-byte", "--data", str(TEXT), "--lr", "-1.0",
                                          "--steps", "4", "--out", str(tmp_path / "bad2")],
                         capture_output=True, text=True)
    assert cli.returncode == 1 and str(e.value) in cli.stderr
    with pytest.raises(ramtrain.RamtrainError) as e:
        ramtrain.plan(preset="tiny-byte", micro_batchez=2)
    assert "--micro-batchez" in str(e.value) and e.value.option == "micro_batchez"
    assert not (tmp_path / "bad").exists()


RECORDS = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there, Zürich?"},
                  {"role": "assistant", "content": "Hello! 你好"}]},
    {"instruction": "Say hi.", "output": "Hi!"},
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                  {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}]},
    {"prompt": "The capital of France is", "completion": " Paris."},
    {"text": "A plain document,\nevery token trained."},
]


def tokenized(data, out):
    r = ramtrain.tokenize(data, tokenizer=QWEN2_TOKENIZER, out=out, chat_format="chatml", threads=2)
    assert r["mask"] is not None  # chat records have untrained tokens
    return Path(r["out"]).read_bytes(), Path(r["mask"]).read_bytes()


def test_python_records_encode_as_jsonl(tmp_path):
    jsonl = tmp_path / "records.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS))
    want = tokenized(jsonl, tmp_path / "jsonl.tok")
    # the CLI's own tokenize of the file: the reference is the executable's output
    subprocess.run(cli_command() + ["tokenize", str(jsonl), "--tokenizer", str(QWEN2_TOKENIZER), "--out",
                                    str(tmp_path / "cli.tok"), "--chat-format", "chatml"], check=True,
                   capture_output=True)
    assert want == ((tmp_path / "cli.tok").read_bytes(), (tmp_path / "cli.tok.mask").read_bytes())
    assert tokenized(RECORDS, tmp_path / "list.tok") == want
    assert tokenized(iter(RECORDS), tmp_path / "gen.tok") == want

    pd = pytest.importorskip("pandas")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    frame = pd.DataFrame(RECORDS)  # columns the records lack are NaN: dropped, as absent fields
    assert tokenized(frame, tmp_path / "frame.tok") == want
    keys = list(dict.fromkeys(k for r in RECORDS for k in r))  # (from_pylist would take the first record's keys)
    table = pa.Table.from_pydict({k: [r.get(k) for r in RECORDS] for k in keys})  # missing fields are nulls: dropped
    assert tokenized(table, tmp_path / "table.tok") == want
    pq.write_table(table, tmp_path / "records.parquet")
    assert tokenized(tmp_path / "records.parquet", tmp_path / "parquet.tok") == want
    assert tokenized(pd.read_parquet(tmp_path / "records.parquet"), tmp_path / "frame_pq.tok") == want

    try:
        import datasets
    except ImportError:
        return
    ds = datasets.Dataset.from_dict({k: [r.get(k) for r in RECORDS] for k in keys})
    assert tokenized(ds, tmp_path / "ds.tok") == want
    assert tokenized(ds.to_iterable_dataset(), tmp_path / "ids.tok") == want


def test_training_on_records_is_training_on_the_jsonl(tmp_path):
    # a small Qwen2-shaped model with random weights and the fixture's tokenizer (803 ids): the records are packed
    # into sequences with their loss masks, and a step's loss depends on every id and mask of its batch
    model = tmp_path / "model"
    model.mkdir()
    config = json.loads((ROOT / "tests" / "fixtures" / "hf" / "qwen2_bias_tied" / "config.json").read_text())
    config["vocab_size"] = 1024
    (model / "config.json").write_text(json.dumps(config))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(QWEN2_TOKENIZER / f, model / f)
    jsonl = tmp_path / "records.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS * 8))

    def losses(data, out):
        run = ramtrain.train(model=model, init="random", data=data, chat_format="chatml", seq_len=32, micro_batch=2,
                             steps=3, eval_every=3, val_fraction=0.2, out=tmp_path / out, threads=2, device="cpu",
                             export_dtype="none")
        return [{k: v for k, v in r.items() if k not in ("time", "elapsed")} for r in run.records]

    want = losses(jsonl, "from_jsonl")
    assert len(want) >= 4 and all(r.get("loss", 1) > 0 for r in want)
    assert losses(RECORDS * 8, "from_list") == want


def test_the_byte_model_trains_on_text_records(tmp_path):
    # tiny-byte (no tokenizer files) from {"text": ...} records: a .jsonl file, a list, a parquet file and a
    # datasets.Dataset give the same batches, so the same losses; chat records are refused with the reason
    texts = [p for p in TEXT.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    records = [{"text": t} for t in texts]
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")

    def losses(data, out):
        run = tiny(tmp_path / out, data=data, steps=3, eval_every=3, export_dtype="none")
        return [{k: v for k, v in r.items() if k not in ("time", "elapsed")} for r in run.records]

    want = losses(jsonl, "from_jsonl")
    assert len(want) >= 4 and all(r.get("loss", 1) > 0 for r in want)
    assert losses(records, "from_list") == want
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "texts.parquet")
    assert losses(tmp_path / "texts.parquet", "from_parquet") == want
    try:
        import datasets
        assert losses(datasets.Dataset.from_list(records), "from_dataset") == want
    except ImportError:
        pass
    with pytest.raises(ramtrain.RamtrainError) as e:
        tiny(tmp_path / "chat", data=RECORDS[:1], steps=1)
    assert "a byte-level model has no chat format" in str(e.value) and "<python:list>:1" in str(e.value)


def test_record_errors_name_the_record(tmp_path):
    bad = RECORDS[:2] + [{"messages": [{"role": "wizard", "content": "?"}]}]
    with pytest.raises(ramtrain.RamtrainError) as e:
        ramtrain.tokenize(bad, tokenizer=QWEN2_TOKENIZER, out=tmp_path / "bad.tok", chat_format="chatml")
    assert "<python:list>:3" in str(e.value) and "--bad-lines skip" in str(e.value)

    def broken():
        yield RECORDS[0]
        raise OSError("the source went away")
    with pytest.raises(OSError, match="the source went away"):
        ramtrain.tokenize(broken(), tokenizer=QWEN2_TOKENIZER, out=tmp_path / "broken.tok", chat_format="chatml")


def test_keyboard_interrupt_leaves_a_resumable_checkpoint(tmp_path):
    out = tmp_path / "run"
    seen = []

    def interrupt(rec):
        seen.append(rec["step"])
        if rec["step"] == 2:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as the terminal sends it

    with pytest.raises(KeyboardInterrupt, match="resume"):
        tiny(out, steps=6, on_step=interrupt)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's handler is back
    assert seen[-1] <= 3  # stopped at the next step boundary
    ckpts = sorted(p.name for p in out.iterdir() if p.name.startswith("ckpt-"))
    assert ckpts, "no checkpoint written on SIGINT"
    resumed = tiny(out, steps=6, resume="auto")
    steps = [r["step"] for r in resumed.records if "loss" in r]
    assert steps[0] == seen[-1] + 1 and steps[-1] == 6
    # the metrics file has every step once: the interrupted run's and the resumed run's
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r] == [1, 2, 3, 4, 5, 6][:seen[-1]] + steps


def test_a_callback_error_stops_the_run_and_is_raised(tmp_path):
    def boom(rec):
        if rec["step"] == 1:
            raise ValueError("callback failed")
    with pytest.raises(ValueError, match="callback failed"):
        tiny(tmp_path / "run", steps=5, on_step=boom)
    # stopped at the step boundary with a checkpoint, not run to the end
    assert any(p.name.startswith("ckpt-") for p in (tmp_path / "run").iterdir())
    assert not (tmp_path / "run" / "final").exists()


def test_python_m_ramtrain_is_the_cli():
    r = subprocess.run([sys.executable, "-m", "ramtrain", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ramtrain 0.1.0"
    r = subprocess.run([sys.executable, "-m", "ramtrain", "plan", "--preset", "tiny-byte", "--seq-len", "64", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout) == ramtrain.plan(preset="tiny-byte", seq_len=64)
