"""Schema, wire encoding and pack/unpack, without MPI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from csrun.stream.errors import BatchError
from csrun.stream.message import pack, unpack
from csrun.stream.refill import sent_in_place
from csrun.stream.schema import Schema

pytestmark = pytest.mark.timeout(30)


def _nested():
    return {"ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
            "pair": (torch.ones(2, 4), [torch.tensor([True, False]), torch.full((2,), 1.5, dtype=torch.bfloat16)]),
            "scalar": torch.tensor(7, dtype=torch.int16)}


def _roundtrip(schema: Schema, batch):
    wire = [torch.from_numpy(b.copy()) for b in schema.encode(batch)]
    return schema.decode(wire)


def test_nested_structure_survives_json_and_wire():
    batch = _nested()
    schema = Schema.infer(batch)
    again = Schema.from_json(schema.to_json())
    assert again == schema
    assert [l.path for l in schema.leaves] == ["['ids']", "['pair'][0]", "['pair'][1][0]", "['pair'][1][1]",
                                               "['scalar']"]
    out = _roundtrip(again, batch)
    assert isinstance(out, dict) and isinstance(out["pair"], tuple) and isinstance(out["pair"][1], list)
    for got, want in zip(again.flatten(out), schema.flatten(batch)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_int64_travels_as_int32_and_comes_back_int64():
    batch = (torch.tensor([[-(2**31), 2**31 - 1]]), torch.zeros(1, 2))
    schema = Schema.infer(batch)
    assert (schema.leaves[0].dtype, schema.leaves[0].wire_dtype) == ("int64", "int32")
    assert schema.leaves[0].nbytes == 8 and schema.nbytes == 16
    wire = schema.encode(batch)
    assert wire[0].nbytes == 8
    out = _roundtrip(schema, batch)
    assert out[0].dtype == torch.int64 and out[0].tolist() == [[-(2**31), 2**31 - 1]]


def test_copy_into_gives_what_the_wire_gives_in_buffers_it_owns():
    """The lone chief's batches (Schema.copy_into): the values, dtypes, shapes and structure that
    decode(encode(batch)) gives, contiguous, in the given buffers and not in the batch's memory."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    batch = {**_nested(), "strided": base.t()[:, :2]}  # a non-contiguous leaf
    schema = Schema.infer(batch)
    buffers = schema.local_buffers()
    out, wire = schema.copy_into(schema.flatten(batch), buffers), _roundtrip(schema, batch)
    assert isinstance(out, dict) and isinstance(out["pair"], tuple) and isinstance(out["pair"][1], list)
    for got, want, buf, given in zip(schema.flatten(out), schema.flatten(wire), buffers, schema.flatten(batch)):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        assert got.is_contiguous() and got.data_ptr() == buf.data_ptr() != given.data_ptr()
    batch["pair"][0].fill_(7.0)  # the loader refills its tensor in place: the copy keeps its values
    assert torch.equal(out["pair"][0], torch.ones(2, 4))


def _through(schema: Schema, how: str):
    return schema.encode if how == "encode" else lambda b: schema.copy_into(schema.flatten(b), schema.local_buffers())


@pytest.mark.parametrize("through", ["encode", "copy_into"])
@pytest.mark.parametrize("bad", [2**31, -(2**31) - 1, 3_000_000_000])
def test_lossy_int64_is_refused_naming_the_value(bad, through):
    batch = {"labels": torch.tensor([1, bad])}
    schema = Schema.infer(batch)
    with pytest.raises(BatchError, match=rf"int64 tensor at \['labels'\] holds {bad}, which does not fit int32"):
        _through(schema, through)(batch)


@pytest.mark.parametrize("through", ["encode", "copy_into"])
def test_batches_must_match_the_first_one(through):
    schema = Schema.infer((torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64)))
    send = _through(schema, through)
    with pytest.raises(BatchError, match=r"at \[0\] is float32\[1, 3\], the first batch had float32\[2, 3\]"):
        send((torch.zeros(1, 3), torch.zeros(2, dtype=torch.int64)))
    with pytest.raises(BatchError, match=r"at \[1\] is int32\[2\], the first batch had int64\[2\]"):
        send((torch.zeros(2, 3), torch.zeros(2, dtype=torch.int32)))
    with pytest.raises(BatchError, match="tuple of 2"):
        send([torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64)])


@pytest.mark.parametrize("batch, message", [
    ({"name": "x"}, r"leaf at \['name'\] is a str"),
    ({1: torch.zeros(1)}, "dict key 1"),
    (np.zeros(2), r"leaf at <batch> is a ndarray"),
])
def test_unstreamable_batches_are_refused(batch, message):
    with pytest.raises(BatchError, match=message):
        Schema.infer(batch)


def test_decode_views_the_buffer_unless_copy():
    schema = Schema.infer(torch.zeros(2, 2))
    buf = schema.alloc()
    view = schema.decode(buf)
    assert view.untyped_storage().data_ptr() == buf[0].untyped_storage().data_ptr()
    copy = schema.decode(buf, copy=True)
    assert copy.untyped_storage().data_ptr() != buf[0].untyped_storage().data_ptr()


def test_malformed_schema_json_is_refused():
    with pytest.raises(BatchError, match="malformed stream schema"):
        Schema.from_json(b'{"tree": {"leaf": 3}, "leaves": []}')
    with pytest.raises(BatchError, match="unknown dtype .nope. in a stream schema"):
        Schema.from_json(json.dumps({"tree": {"leaf": 0}, "leaves": [
            {"path": "", "dtype": "nope", "wire_dtype": "int32", "shape": [1]}]}).encode())


def test_pack_unpack_without_pickle():
    obj = {"loss": 1.5, "n": 3, "t": torch.arange(4, dtype=torch.int64), "a": np.eye(2), "tag": "x",
           "nested": (None, [True, torch.tensor(2.0, dtype=torch.bfloat16)])}
    data = pack(obj)
    assert b"pickle" not in data and not data.startswith(b"\x80")
    out = unpack(data)
    assert out["loss"] == 1.5 and out["n"] == 3 and out["tag"] == "x"
    assert torch.equal(out["t"], obj["t"]) and np.array_equal(out["a"], obj["a"])
    assert out["nested"][0] is None and out["nested"][1][0] is True
    assert out["nested"][1][1].dtype == torch.bfloat16 and float(out["nested"][1][1]) == 2.0
    with pytest.raises(BatchError, match="cannot pack a object"):
        pack(object())


def test_the_receive_pool_reuses_a_buffer_set_once_its_batch_is_gone():
    """More batches alive at once than the old 4 tracked sets (the loop's, the device queue's, the
    one it runs): once the oldest is dropped, its buffers are lent again, not reallocated."""
    from csrun.stream.buffers import LENT_TRACKED, BufferPool

    schema = Schema.infer((torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64)))
    pool = BufferPool(schema.alloc, track=LENT_TRACKED)
    alive = []
    for _ in range(8):
        bufs = pool.take()
        alive.append(schema.decode(bufs.tensors))  # the user holds the batch
        pool.lend(bufs)
    first = pool._lent[0]
    alive.pop(0)  # the oldest batch is dropped
    assert pool.take() is first


def test_the_leaves_a_sender_sends_in_place_are_watched_for_writes():
    """encode sends contiguous, not narrowed leaves from the batch's memory: those are watched (by
    their version counters); an int64 leaf (sent from its int32 copy), a non-contiguous one (sent
    from a contiguous copy) and a view (whose counter moves with its base) are not."""
    base = torch.zeros(4, 6)
    with torch.inference_mode():
        made_for_inference = torch.zeros(3)  # no version counter to read
    batch = (torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64), base.t()[:, :2], base[:2], torch.ones(2),
             made_for_inference)
    schema = Schema.infer(batch)
    watched = sent_in_place(schema, schema.flatten(batch))
    assert [path for path, _, _ in watched] == ["[0]", "[4]"]
    batch[0].add_(1)
    assert [t._version != v for _, t, v in watched] == [True, False]


def test_a_lazily_conjugated_complex_leaf_streams_its_values():
    """x.conj() is a view with a conjugate bit: the wire and the lone chief's copy carry its values."""
    x = torch.tensor([[1 + 2j, 3 - 4j]], dtype=torch.complex64)
    batch = (x.conj(), -x)
    schema = Schema.infer(batch)
    for out in (_roundtrip(schema, batch), schema.copy_into(schema.flatten(batch), schema.local_buffers())):
        assert torch.equal(out[0], torch.tensor([[1 - 2j, 3 + 4j]], dtype=torch.complex64))
        assert torch.equal(out[1], torch.tensor([[-1 - 2j, -3 + 4j]], dtype=torch.complex64))
