"""data= from Python: paths pass through; records (lists of dicts, pandas
DataFrames, pyarrow Tables, .parquet files, HF datasets, any iterable of dicts)
become record streams that the C++ record reader pulls in chunks of jsonl
lines, so they go through the same record / chat-template / packing code as a
.jsonl file, one chunk at a time (no copy of the dataset is made in Python).

Tabular sources (DataFrame, Arrow, Parquet, HF datasets) cannot leave a field
out: a record without a column holds a null there (NaN in pandas). Those
nulls are dropped, at every depth, so that a row means what the same record
written as a .jsonl line without the field means.
"""
from __future__ import annotations

import json
import math
import os

from . import _ramtrain as _rt

_CHUNK_RECORDS = 256          # records per chunk handed to the engine
_CHUNK_BYTES = 1 << 20        # or fewer, once a chunk holds this many bytes
_TABLE_ROWS = 1024            # rows converted at a time from a frame or a table


def _json_default(o):
    # numpy scalars and arrays (pandas cells), pyarrow scalars
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "as_py"):
        return o.as_py()
    if isinstance(o, (bytes, bytearray)):
        return o.decode("utf-8")
    raise TypeError(f"a record holds a {type(o).__name__}, which has no JSON form: {o!r:.80}")


def _drop_nulls(x):
    if isinstance(x, dict):
        return {k: _drop_nulls(v) for k, v in x.items() if not _is_null(v)}
    if isinstance(x, (list, tuple)):
        return [_drop_nulls(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # numpy arrays of dicts (pandas from parquet)
        return _drop_nulls(x.tolist())
    return x


def _is_null(v):
    return v is None or (isinstance(v, float) and math.isnan(v))


def _is_path(x):
    return isinstance(x, (str, os.PathLike))


def _kind(obj):
    mod = type(obj).__module__ or ""
    name = type(obj).__name__
    if mod.startswith("pandas") and name == "DataFrame":
        return "DataFrame"
    if mod.startswith("pyarrow") and name in ("Table", "RecordBatch", "RecordBatchReader"):
        return name
    if mod.startswith("datasets") and name in ("Dataset", "IterableDataset"):
        return name
    return None


def _records(obj):
    """(label, iterator of dict records, tabular) for a non-path data object."""
    kind = _kind(obj)
    if kind == "DataFrame":
        def rows():
            for start in range(0, len(obj), _TABLE_ROWS):
                yield from obj.iloc[start:start + _TABLE_ROWS].to_dict("records")
        return "DataFrame", rows(), True
    if kind in ("Table", "RecordBatch"):
        def rows():
            batches = obj.to_batches(max_chunksize=_TABLE_ROWS) if kind == "Table" else [obj]
            for b in batches:
                yield from b.to_pylist()
        return "pyarrow." + kind, rows(), True
    if kind == "RecordBatchReader":
        def rows():
            for b in obj:
                yield from b.to_pylist()
        return "pyarrow.RecordBatchReader", rows(), True
    if kind in ("Dataset", "IterableDataset"):
        return "datasets." + kind, iter(obj), True
    if isinstance(obj, dict):
        raise TypeError("data=: a single dict is not a dataset; give a list of records ([{...}, ...])")
    try:
        it = iter(obj)
    except TypeError:
        raise TypeError(f"data=: cannot read a {type(obj).__name__}: give paths, a list of dicts, a pandas "
                        "DataFrame, a pyarrow Table, .parquet files or a HF datasets.Dataset") from None
    return ("list" if isinstance(obj, (list, tuple)) else type(obj).__name__), it, False


def _parquet_records(path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"data=: {path} is a .parquet file, which needs pyarrow: pip install pyarrow") from None
    f = pq.ParquetFile(path)

    def rows():
        for b in f.iter_batches(batch_size=_TABLE_ROWS):
            yield from b.to_pylist()
    return os.path.basename(os.fspath(path)), rows(), True


class Streams:
    """The record streams of one command: registered on entry, removed on exit.
    .error: the exception a source raised (re-raised by the caller)."""

    def __init__(self):
        self.names = []
        self.error = None

    def add(self, label, records, tabular):
        state = {"n": 0}

        def pull():
            parts, size = [], 0
            try:
                for rec in records:
                    state["n"] += 1
                    if not isinstance(rec, dict):
                        raise TypeError(f"data=: record {state['n']} is a {type(rec).__name__}, not a dict "
                                        "(a record is a dict such as {'text': ...} or {'messages': [...]})")
                    if tabular:
                        rec = _drop_nulls(rec)
                    line = json.dumps(rec, ensure_ascii=False, default=_json_default, allow_nan=False)
                    parts.append(line)
                    size += len(line)
                    if len(parts) >= _CHUNK_RECORDS or size >= _CHUNK_BYTES:
                        break
            except BaseException as e:  # noqa: B036 -- KeyboardInterrupt too: re-raised after the command
                self.error = e
                raise
            return "\n".join(parts) + "\n" if parts else None

        name = _rt.add_stream(label, pull)
        self.names.append(name)
        return name

    def resolve(self, data):
        """data= as the CLI's list of paths (record streams named in place of files)."""
        if data is None:
            return []
        if _is_path(data):
            return [self._path(data)]
        if isinstance(data, (list, tuple)) and data and all(_is_path(x) for x in data):
            return [self._path(x) for x in data]
        return [self.add(*_records(data))]

    def _path(self, p):
        p = os.fspath(p)
        if p.endswith(".parquet"):
            return self.add(*_parquet_records(p))
        return p

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for n in self.names:
            _rt.remove_stream(n)
        self.names = []
        return False
