"""ramtrain from Python: the C++ engine's commands, called in-process.

Every function takes the CLI command's options as keyword arguments, named as
the CLI names them with '_' for '-' (``lr=3e-4`` is ``--lr 3e-4``, ``micro_batch=2``
is ``--micro-batch 2``; ``True`` gives a flag, ``False`` or ``None`` leaves the
option out; a list gives several values), and runs the same command the
``ramtrain`` executable runs, with the same checks: a refused option or input
raises :class:`RamtrainError` with the CLI's message. The GIL is released
while the engine works; Ctrl-C (SIGINT) during train asks for a checkpoint at
the next step, as in the CLI, and then raises KeyboardInterrupt
(``resume="auto"`` continues). See docs/python.md.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import sysconfig
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import _ramtrain as _rt
from ._data import Streams

__version__ = "0.1.0"
__all__ = ["train", "plan", "tokenize", "evaluate", "sample", "Run", "RamtrainError", "cli"]

# Ranks that train --nproc-per-node starts run the installed executable (this process is Python).
_exe = os.path.join(sysconfig.get_path("scripts"), "ramtrain")
if os.path.isfile(_exe) and "RAMTRAIN_EXE" not in os.environ:
    os.environ["RAMTRAIN_EXE"] = _exe


class RamtrainError(ValueError):
    """A command refused its options or data: the message the CLI prints after 'error:'.

    ``option`` is the keyword argument the message names first (``"lr"`` for ``--lr``), or None;
    ``command`` is the command ("train", ...) and ``exit_code`` the CLI's exit code."""

    def __init__(self, command: str, message: str, exit_code: int = 1):
        super().__init__(message)
        self.command = command
        self.exit_code = exit_code
        m = re.search(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)", message)
        self.option = m.group(1).replace("-", "_") if m else None


@dataclass
class Run:
    """What ramtrain.train returns."""
    out: Optional[str]                       # the run's output directory (--out), None without one
    records: list = field(default_factory=list)  # every metrics record of this call, as metrics.jsonl has them
    final_metrics: dict = field(default_factory=dict)  # the last step's record, with the final evaluation's losses
    model: Optional[str] = None              # the exported model directory (OUT/final), when it was written
    exit_code: int = 0


def _value(v) -> str:
    if isinstance(v, float):
        return repr(v)
    return os.fspath(v) if isinstance(v, os.PathLike) else str(v)


def _argv(options: dict) -> list:
    """Keyword arguments as the CLI's options."""
    argv = []
    for k, v in options.items():
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        if v is True:
            argv.append(flag)
        elif isinstance(v, (list, tuple)):
            if v:
                argv.append(flag)
                argv.extend(_value(x) for x in v)
        else:
            argv += [flag, _value(v)]
    return argv


def _call(command: str, argv: list, on_record=None, capture=False, stop_on_signal=False):
    """Runs one command in this process; returns (exit code, captured stdout)."""
    main = threading.current_thread() is threading.main_thread()
    saved = {}
    if main:
        for s in (signal.SIGINT, signal.SIGTERM):
            saved[s] = signal.getsignal(s)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        code, out, kind, message = _rt.run(command, argv, on_record, capture, stop_on_signal and main)
    finally:
        if main:  # the engine's stop handler gives way to Python's again
            for s, h in saved.items():
                if h is not None:
                    signal.signal(s, h)
    if kind:
        if kind == "internal":
            raise RuntimeError(f"ramtrain {command}: internal error: {message}")
        raise RamtrainError(command, message, code)
    return code, out


def _interrupted(command: str, code: int, hint: str = ""):
    sig = code - 128
    name = "SIGINT" if sig == signal.SIGINT else "SIGTERM" if sig == signal.SIGTERM else f"signal {sig}"
    raise KeyboardInterrupt(f"ramtrain {command}: stopped by {name}{hint}")


def train(*, data=None, eval_data=None, on_step: Optional[Callable[[dict], Any]] = None,
          on_eval: Optional[Callable[[dict], Any]] = None, **options) -> Run:
    """`ramtrain train` with the options as keyword arguments (see `ramtrain train --help`).

    data / eval_data: paths (text, .jsonl, .json, token files, directories; .parquet files are read as
    records), or records: a list of dicts, a pandas DataFrame, a pyarrow Table, a HF datasets.Dataset or
    IterableDataset, any iterable of dicts. on_step(record) gets each step's metrics record and
    on_eval(record) each evaluation's, as metrics.jsonl has them. An exception in a callback stops the run
    at the next step (a checkpoint is saved when there is an out directory) and is raised here."""
    records = []
    raised = []

    def sink(line: str):
        rec = json.loads(line)
        records.append(rec)
        f = on_eval if "val_loss" in rec else on_step
        if f is None or raised:
            return
        try:
            f(rec)
        except BaseException as e:  # noqa: B036 -- raised after the run has stopped at a step boundary
            raised.append(e)
            _rt.request_stop()

    with Streams() as streams:
        argv = []
        paths = streams.resolve(data)
        if paths:
            argv += ["--data", *paths]
        if eval_data is not None:
            ev = streams.resolve(eval_data)
            if len(ev) != 1:
                raise RamtrainError("train", "--eval-data takes one path or one set of records")
            argv += ["--eval-data", ev[0]]
        argv += _argv(options)
        try:
            code, _ = _call("train", argv, sink, stop_on_signal=True)
        except RamtrainError:
            if streams.error is not None:
                raise streams.error
            raise
    if raised:
        raise raised[0]
    out = options.get("out")
    out = os.fspath(out) if out is not None else None
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        _interrupted("train", code, f"; the checkpoint is in {out}: resume with ramtrain.train(resume='auto', "
                     f"out={out!r}, ...)" if out else "")
    if code != 0:
        raise RamtrainError("train", f"train exited with code {code}", code)
    final = {}
    for rec in records:
        if "loss" in rec:
            final = dict(rec)
    for rec in records:
        if rec.get("final"):
            final.update({k: v for k, v in rec.items() if k in ("val_loss", "eval_loss")})
    model = os.path.join(out, "final") if out and os.path.isfile(os.path.join(out, "final", "config.json")) else None
    return Run(out=out, records=records, final_metrics=final, model=model, exit_code=code)


def plan(**options) -> dict:
    """`ramtrain plan --json`: the plan as a dict (a run that would be refused is a plan too: see its fields)."""
    code, out = _call("plan", _argv(options) + ["--json"], capture=True)
    text = out.strip()
    if not text.startswith("{"):
        raise RamtrainError("plan", f"plan printed no JSON (exit code {code}): {text[:200]}", code)
    return json.loads(text)


def tokenize(data, *, tokenizer, out, **options) -> dict:
    """`ramtrain tokenize DATA --tokenizer DIR --out OUT`: returns {"out": token file, "mask": its loss-mask file
    or None}. data as train's."""
    with Streams() as streams:
        inputs = streams.resolve(data)
        try:
            _call("tokenize", inputs + _argv(dict(tokenizer=tokenizer, out=out, **options)))
        except RamtrainError:
            if streams.error is not None:
                raise streams.error
            raise
    out = os.fspath(out)
    mask = out + ".mask"
    return {"out": out, "mask": mask if os.path.isfile(mask) else None}


def evaluate(*, model, data, **options) -> dict:
    """`ramtrain eval --json`: {"loss", "perplexity", "tokens", ...} of a model over data (paths or records)."""
    with Streams() as streams:
        paths = streams.resolve(data)
        try:
            _, out = _call("eval", ["--model", os.fspath(model), "--data", *paths] + _argv(options) + ["--json"],
                           capture=True)
        except RamtrainError:
            if streams.error is not None:
                raise streams.error
            raise
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        raise RamtrainError("eval", f"eval printed no JSON: {out[:200]}")
    return json.loads(lines[-1])


def sample(*, model, prompt: str = "", **options) -> str:
    """`ramtrain sample`: the text it prints (the prompt and its continuation; with chat=True the reply).
    Ctrl-C stops generation at the next token and raises KeyboardInterrupt."""
    code, out = _call("sample", ["--model", os.fspath(model), "--prompt", prompt] + _argv(options),
                      capture=True, stop_on_signal=True)
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        _interrupted("sample", code)
    return out[:-1] if out.endswith("\n") else out


def cli(argv=None) -> int:
    """`ramtrain ARGV...` in this process; returns the exit code."""
    return _rt.cli(list(sys.argv[1:] if argv is None else argv))
