"""Arrow IPC streams written as their messages directly: the schema's message, each batch's,
the end-of-stream marker. pyarrow's stream writer costs about three times as much for a
small batch and writes the same bytes (the tests compare them); a schema with dictionaries,
whose messages go between, takes the writer. The wire's `arrow` values (`protocol`) and the
compact deltas' messages (`store.formats.compact`) are made here."""
from __future__ import annotations

from typing import Sequence

import pyarrow as pa

EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"   # the end-of-stream marker


def has_dictionary(schema: pa.Schema) -> bool:
    return any(pa.types.is_dictionary(t) for t in schema.types)


def after_schema(schema: pa.Schema, message, batches: Sequence[pa.RecordBatch]) -> pa.Buffer:
    """The messages of a stream of `batches` (whose columns are `schema`'s) that follow the
    schema's own message (`message`, `schema.serialize()`): the batches' and the end of the
    stream. A batch's message holds no names, so a batch whose types are the schema's goes
    as it is."""
    if has_dictionary(schema):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            for b in batches:
                writer.write_batch(pa.RecordBatch.from_arrays(b.columns, schema=schema))
        stream = sink.getvalue()
        if not stream.slice(0, len(message)).equals(pa.py_buffer(message)):
            raise AssertionError("an Arrow stream that does not begin with its schema message")
        return stream.slice(len(message))
    types = schema.types
    return pa.py_buffer(b"".join(
        [(b if b.schema.types == types else pa.RecordBatch.from_arrays(
            b.columns, schema=schema)).serialize() for b in batches] + [EOS]))


def stream(batch: pa.RecordBatch) -> bytes:
    """A stream of one batch, as pyarrow's stream writer writes it."""
    message = batch.schema.serialize()
    if has_dictionary(batch.schema):
        return b"".join((message, after_schema(batch.schema, message, [batch])))
    return b"".join((message, batch.serialize(), EOS))   # (a task's every batch: kept short)
