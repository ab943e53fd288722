"""tpd.rpc's pickling of messages, in process: a thread's pickler is kept between messages and
starts each one afresh, and a message is checked against the tensors it carries."""

import pickle
import threading

import pytest
import torch

from tpd.rpc import _pickler


def test_each_message_starts_afresh_on_the_kept_pickler():
    x = torch.arange(6.0)
    payload, descriptors, keep = _pickler.dumps((x, x[1:], "first"))
    assert len(descriptors) == 1 and keep == [x]  # one storage for both views
    y = torch.ones(3)
    again, descriptors2, keep2 = _pickler.dumps((y, "second"))
    # Nothing of the first message is left: its storages, keep-alive list or memo.
    assert len(descriptors2) == 1 and descriptors2[0].data == y.data_ptr()
    assert keep2 == [y] and keep == [x]
    assert descriptors[0].data == x.data_ptr()
    plain, _, _ = _pickler.dumps(("second",))
    assert pickle.loads(plain) == ("second",)
    # A message that failed to pickle leaves nothing behind either.
    with pytest.raises(TypeError):
        _pickler.dumps((torch.ones(2), threading.Lock()))
    _, descriptors3, keep3 = _pickler.dumps(("after",))
    assert descriptors3 == [] and keep3 == []


def test_a_large_message_does_not_leave_its_buffer_behind():
    payload, _, _ = _pickler.dumps(b"x" * (1 << 20))
    assert len(payload) > 1 << 20
    small, _, _ = _pickler.dumps(b"y")
    assert pickle.loads(small) == b"y"


def test_a_message_naming_a_tensor_it_does_not_carry_is_refused():
    payload, descriptors, _ = _pickler.dumps((torch.ones(4),))
    assert len(descriptors) == 1
    # Its tensor did not come with it: unpickling says so instead of reading anything else.
    with pytest.raises(ValueError, match="names tensor 0 of the 0 it carries"):
        _pickler.loads(payload, 0, None)
    assert _pickler.loads(pickle.dumps(("no tensors", 1)), 0, None) == ("no tensors", 1)


def test_an_rref_pickles_only_into_a_message_to_a_worker():
    from tpd.rpc.rref import RRef
    rref = RRef.__new__(RRef)  # refused before anything is counted: no agent needed
    # As torch: not by Python's pickle; nor by tpd's without a receiver, whose RRef the owner
    # would have to count.
    for dumps in (pickle.dumps, _pickler.dumps):
        with pytest.raises(RuntimeError, match="Can not pickle rref in python pickler, rref can "
                                               "only be pickled when using RPC"):
            dumps(rref)
