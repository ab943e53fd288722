"""The C ABI (libtpd_client.so) as any foreign caller sees it, through tpd._client."""

import ctypes
import os
import signal
import subprocess
import threading
import time

import pytest
import torch
import torch.utils.dlpack

from tpd import _capi, _client
from tpd._client import Client


def test_the_library_exports_only_the_c_abi():
    library = _capi.library()._name
    out = subprocess.run(["nm", "-D", "--defined-only", library], check=True,
                         capture_output=True, text=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert names, out
    assert [n for n in names if not n.startswith("tpd_")] == []
    assert "tpd_call_async" in names and "tpd_next_event" in names


def test_the_structs_mirrored_in_python_are_checked_against_the_librarys():
    lib = _capi.library()
    assert lib.tpd_layout(b"tpd_tensor", None) == ctypes.sizeof(_capi.Tensor)
    offset = _capi.EventInfo.payload_size.offset
    assert lib.tpd_layout(b"tpd_event_info", b"payload_size") == offset
    assert lib.tpd_layout(b"tpd_nothing", None) == ctypes.c_size_t(-1).value

    class Moved:  # a library whose tpd_event_info grew a field before `tag`
        def tpd_layout(self, struct, field):
            value = lib.tpd_layout(struct, field)
            return value + 8 if struct == b"tpd_event_info" and field == b"tag" else value

    with pytest.raises(RuntimeError, match=r"tpd_event_info\.tag is at offset 16 there, 8"):
        _capi._check_layouts(Moved(), "lib.so")


def test_reading_no_event_is_invalid_argument():
    lib = _capi.library()
    info = _capi.EventInfo()
    assert lib.tpd_event_read(None, info) == _capi.INVALID_ARGUMENT
    assert lib.tpd_last_error() == b"event is NULL"


def test_no_daemon_is_unavailable_naming_the_socket(workdir):
    with pytest.raises(_capi.TpdError) as error:
        Client(os.path.join(workdir, "none.sock"), connect_timeout=0.2)
    assert error.value.code == _capi.UNAVAILABLE
    assert "none.sock" in str(error.value)


def test_bad_join_options_are_invalid_argument_naming_the_option(daemon):
    client = Client(daemon.socket)
    with pytest.raises(_capi.TpdError) as error:
        client.join({"rank": "two"})
    assert error.value.code == _capi.INVALID_ARGUMENT and "'rank'" in str(error.value)
    with pytest.raises(_capi.TpdError, match="unknown join option 'colour'"):
        client.join({"colour": "blue"})
    with pytest.raises(_capi.TpdError, match="not NAME=VALUE"):
        client.join({"env": "MASTER_ADDR"})
    # An unknown transport: the daemon's own validation, with its code.
    with pytest.raises(_capi.TpdError) as error:
        client.join({"group": "g", "name": "a", "world_size": 1, "rank": 0,
                     "init_method": f"tcp://{daemon.peer_address}", "transport": "carrier-pigeon"})
    assert error.value.code == _capi.INVALID_ARGUMENT and "carrier-pigeon" in str(error.value)
    client.close()


def test_next_event_times_out_and_stops(daemon):
    client = Client(daemon.socket)
    assert client.next_event(_capi.QUEUE_REQUESTS, timeout=0.01) is None
    client.stop_events()
    with pytest.raises(_capi.TpdError) as error:
        client.next_event(_capi.QUEUE_REQUESTS, timeout=1)
    assert error.value.code == _capi.CANCELLED
    client.close()


def _pair(daemon):
    a, b = Client(daemon.socket), Client(daemon.socket)
    for client, name in ((a, "a"), (b, "b")):
        client.join({"group": "g", "name": name, "timeout": 10.0,
                     "init_method": f"tcp://{daemon.peer_address}"})
    b.serve("echo")
    return a, b


def _bytes_tensor(data):
    t = _capi.Tensor()
    t.dtype, t.ndim, t.nbytes, t.device_type = 6, 1, len(data), _capi.CPU
    t.shape[0] = len(data)
    t.data = ctypes.cast(data, ctypes.c_void_p)
    return t


def test_a_call_by_the_reverse_map_is_delivered_and_unknown_flags_are_refused(daemon):
    """TPD_CALL_REVERSE_MAP (torch's distributed autograd sends gradients by the reverse of
    the forward pass's map) passes the daemon's checks; what it changes, where CUDA tensors
    land, is tested on the GPU machine (test_backend.py)."""
    a, b = _pair(daemon)
    data = ctypes.create_string_buffer(b"gradient", 8)
    a.call_async("g", "b", "echo", b"back", [_bytes_tensor(data)], 5.0, tag=4,
                 flags=_capi.CALL_REVERSE_MAP)
    request = b.next_event(_capi.QUEUE_REQUESTS, timeout=5)
    assert request.read() == (_capi.OK, "", b"back", 1)
    request.reply(b"done")
    reply = a.next_event(_capi.QUEUE_REPLIES, timeout=5)
    assert (reply.tag, reply.status(), reply.payload()) == (4, (0, ""), b"done")
    with pytest.raises(_capi.TpdError) as error:
        a.call_async("g", "b", "echo", b"x", [], 5.0, tag=5, flags=4)
    assert error.value.code == _capi.INVALID_ARGUMENT
    assert "flags 4 has unknown bits" in str(error.value)
    a.close()
    b.close()


def test_requests_answered_later_from_another_thread_with_tensors(daemon):
    a, b = _pair(daemon)
    data = ctypes.create_string_buffer(b"tensor bytes", 12)
    a.call_async("g", "b", "echo", b"hello", [_bytes_tensor(data)], 5.0, tag=7)
    request = b.next_event(_capi.QUEUE_REQUESTS, timeout=5)
    assert (request.kind, request.method, request.caller, request.payload()) == (
        _capi.EVENT_REQUEST, "echo", "a", b"hello")
    assert request.read() == (_capi.OK, "", b"hello", 1)  # all of it in one call
    view = torch.utils.dlpack.from_dlpack(request.dlpack(0, copy=0))
    assert bytes(view.numpy()) == b"tensor bytes"
    threading.Thread(target=request.reply, args=(b"later",)).start()
    reply = a.next_event(_capi.QUEUE_REPLIES, timeout=5)
    assert (reply.kind, reply.tag, reply.status(), reply.payload()) == (
        _capi.EVENT_REPLY, 7, (0, ""), b"later")
    assert reply.read() == (_capi.OK, "", b"later", 0)
    # The view outlives its event; its block goes back when the tensor does.
    del request
    assert bytes(view.numpy()) == b"tensor bytes"
    assert b.call_stats()["rx_view_bytes"] == 12
    del view
    assert b.call_stats()["rx_view_bytes"] == 0
    a.close()
    b.close()


def test_a_view_of_the_receive_heap_sent_back_or_on_goes_where_it_lies(daemon):
    """A request's tensor returned in the reply, or passed on in a call, is sent from the
    receive heap (no copy into the arena); the view's block stays until the daemon sent it."""
    a, b = _pair(daemon)
    a.serve("echo")
    data = ctypes.create_string_buffer(bytes(range(256)) * 64, 16384)
    a.call_async("g", "b", "echo", b"there", [_bytes_tensor(data)], 5.0, tag=1)
    request = b.next_event(_capi.QUEUE_REQUESTS, timeout=5)
    assert request.read() == (_capi.OK, "", b"there", 1)
    view = torch.utils.dlpack.from_dlpack(request.dlpack(0, copy=0))
    before = b.call_stats()
    # On: a call of b's carrying the view (its second half, a range inside it).
    half = _client.storage_descriptor(view.data_ptr() + 8192, 8192)
    b.call_async("g", "a", "echo", b"on", [half], 5.0, tag=2)
    forwarded = a.next_event(_capi.QUEUE_REQUESTS, timeout=5)
    assert forwarded.read() == (_capi.OK, "", b"on", 1)
    got = torch.utils.dlpack.from_dlpack(forwarded.dlpack(0, copy=1))
    assert bytes(got.numpy()) == data.raw[8192:]
    forwarded.reply(b"")
    assert b.next_event(_capi.QUEUE_REPLIES, timeout=5).status() == (0, "")
    # Back: the reply carries the whole view.
    request.reply(b"back", [_client.storage_descriptor(view.data_ptr(), view.numel())])
    reply = a.next_event(_capi.QUEUE_REPLIES, timeout=5)
    assert reply.read() == (_capi.OK, "", b"back", 1)
    assert bytes(torch.utils.dlpack.from_dlpack(reply.dlpack(0, copy=1)).numpy()) == data.raw
    after = b.call_stats()
    assert after["tensors_in_place"] - before["tensors_in_place"] == 2, (before, after)
    assert after["tensors_copied_in"] == before["tensors_copied_in"], (before, after)
    del request, view
    a.close()
    b.close()


def test_an_arena_dlpack_tensor_is_sent_in_place_and_outlives_its_client(daemon):
    a, b = _pair(daemon)
    block = torch.utils.dlpack.from_dlpack(a.arena_dlpack(4096))
    assert block.dtype == torch.uint8 and block.numel() == 4096
    block.copy_(torch.arange(4096) % 251)
    before = a.call_stats()
    whole = _client.storage_descriptor(block.data_ptr(), 4096)
    prefix = _client.storage_descriptor(block.data_ptr(), 100)
    a.call_async("g", "b", "echo", b"arena", [whole, prefix], 5.0, tag=1)
    request = b.next_event(_capi.QUEUE_REQUESTS, timeout=5)
    assert request.read() == (_capi.OK, "", b"arena", 2)
    got = [bytes(torch.utils.dlpack.from_dlpack(request.dlpack(i, copy=1)).numpy())
           for i in range(2)]
    assert got == [bytes(block.numpy()), bytes(block.numpy()[:100])]
    after = a.call_stats()
    assert after["tensors_in_place"] - before["tensors_in_place"] == 2, (before, after)
    assert after["tensors_copied_in"] == before["tensors_copied_in"], (before, after)
    # A range inside the block not at its start is copied in (a block is sent from its start).
    middle = _client.storage_descriptor(block.data_ptr() + 8, 8)
    request.reply(b"")
    a.call_async("g", "b", "echo", b"middle", [middle], 5.0, tag=2)
    request = b.next_event(_capi.QUEUE_REQUESTS, timeout=5)
    assert bytes(torch.utils.dlpack.from_dlpack(request.dlpack(0, copy=1)).numpy()) == \
        bytes(block.numpy()[8:16])
    assert a.call_stats()["tensors_copied_in"] == after["tensors_copied_in"] + 1
    request.reply(b"")
    for _ in range(2):
        assert a.next_event(_capi.QUEUE_REPLIES, timeout=5).status() == (0, "")
    assert not a.arena_in_flight(block.data_ptr())
    with pytest.raises(_capi.TpdError) as error:
        a.arena_in_flight(block.data_ptr() + 8)
    assert error.value.code == _capi.NOT_FOUND
    # The tensor outlives its client: its block goes with it, after the client closed.
    a.close()
    assert int(block[4095]) == 4095 % 251
    del block
    b.close()


def test_a_request_dropped_unanswered_answers_internal_at_once(daemon):
    a, b = _pair(daemon)
    a.call_async("g", "b", "echo", b"x", [], 30.0, tag=1)
    b.next_event(_capi.QUEUE_REQUESTS, timeout=5).free()
    reply = a.next_event(_capi.QUEUE_REPLIES, timeout=5)
    code, message = reply.status()
    assert code == _capi.INTERNAL and "dropped the call unanswered" in message
    assert reply.read() == (code, message, b"", 0)
    # An error reply keeps its code, marked as the remote handler's.
    a.call_async("g", "b", "echo", b"x", [], 30.0, tag=2)
    b.next_event(_capi.QUEUE_REQUESTS, timeout=5).reply_error(_capi.NOT_FOUND, "no such key")
    code, message = a.next_event(_capi.QUEUE_REPLIES, timeout=5).status()
    assert code == _capi.NOT_FOUND and "remote handler of worker 'b'" in message
    a.close()
    b.close()


def test_bad_tensors_are_refused_before_anything_is_sent(daemon):
    a, b = _pair(daemon)
    t = _capi.Tensor()
    t.dtype, t.ndim, t.nbytes = 1, 1, 8
    t.shape[0] = 3  # 3 float32 are 12 bytes, not 8
    t.data = ctypes.cast(ctypes.create_string_buffer(8), ctypes.c_void_p)
    with pytest.raises(_capi.TpdError, match="12 bytes, the tensor has 8"):
        a.call("g", "b", "echo", b"", [t])
    t.ndim = 9
    with pytest.raises(_capi.TpdError, match="ndim 9"):
        a.call("g", "b", "echo", b"", [t])
    a.close()
    b.close()


def test_a_reply_sent_with_a_release_tag_tells_when_its_tensors_may_change(daemon):
    a, b = _pair(daemon)
    a.call_async("g", "b", "echo", b"x", [], 5.0, tag=3)
    request = b.next_event(_capi.QUEUE_REQUESTS, timeout=5)
    request.reply(b"y", release_tag=41)
    assert a.next_event(_capi.QUEUE_REPLIES, timeout=5).payload() == b"y"
    # No CUDA tensor holds the notice here, so the daemon's release is not waited for.
    released = b.next_event(_capi.QUEUE_REPLIES, timeout=5)
    assert (released.kind, released.tag) == (_capi.EVENT_RELEASED, 41)
    a.close()
    b.close()


def test_an_arena_block_is_in_flight_until_the_daemon_lets_go_of_it(daemon):
    a, b = _pair(daemon)
    lib = _capi.library()
    data = ctypes.c_void_p()
    _capi.check(lib.tpd_arena_alloc(a._handle, 1 << 20, ctypes.byref(data)))
    flag = ctypes.c_int(-1)

    def in_flight():
        _capi.check(lib.tpd_arena_in_flight(a._handle, data, ctypes.byref(flag)))
        return flag.value

    assert in_flight() == 0
    t = _capi.Tensor()
    t.dtype, t.ndim, t.nbytes, t.device_type = 6, 1, 1 << 20, _capi.CPU
    t.shape[0] = 1 << 20
    t.data = data
    a.call_async("g", "b", "echo", b"", [t], 5.0, tag=3)
    request = b.next_event(_capi.QUEUE_REQUESTS, timeout=5)
    # b (a C ABI client) takes no tensors in a's memory: the daemon copied the block for it
    # and lets go of it, whatever b still holds.
    deadline = time.monotonic() + 5
    while in_flight() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert in_flight() == 0
    request.reply(b"")
    assert a.next_event(_capi.QUEUE_REPLIES, timeout=5).status() == (0, "")
    with pytest.raises(_capi.TpdError) as error:
        _capi.check(lib.tpd_arena_in_flight(a._handle, ctypes.c_void_p(64), ctypes.byref(flag)))
    assert error.value.code == _capi.NOT_FOUND
    lib.tpd_arena_free(a._handle, data)
    a.close()
    b.close()


def test_a_forked_child_forgets_its_parents_handles_and_connects_with_its_own_library(daemon):
    """A forked child (a DataLoader worker, say) that drops what it inherited, a request not
    yet answered and clients in a group, answers nothing and ends nothing of its parent's;
    and it connects through a copy of the library of its own (the parent's copy shares gRPC's
    polling with the parent), while the parent serves on."""
    a, b = _pair(daemon)
    store = b.store(group="g")
    store.set("k", b"v")
    a.call_async("g", "b", "echo", b"x", [], 30.0, tag=1)
    request = b.next_event(_capi.QUEUE_REQUESTS, timeout=5)
    child = os.fork()
    if child == 0:
        code = 1
        try:
            request.free()  # would answer INTERNAL
            store.close()
            a.close()  # would end the sessions: a and b would leave
            b.close()
            own = Client(daemon.socket)
            assert own._lib is not a._lib
            mine = own.store()
            mine.set("child", b"own")
            code = 0 if mine.get("child", timeout=5) == b"own" else 2
            own.close()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            pytest.fail("the forked child hung in its parent's handles")
        time.sleep(0.02)
    assert os.waitstatus_to_exitcode(status) == 0
    request.reply(b"from the parent")
    assert a.next_event(_capi.QUEUE_REPLIES, timeout=5).read() == (
        _capi.OK, "", b"from the parent", 0)
    # Both are still in the group, and the store still open.
    a.call_async("g", "b", "echo", b"y", [], 5.0, tag=2)
    b.next_event(_capi.QUEUE_REQUESTS, timeout=5).reply(b"again")
    assert a.next_event(_capi.QUEUE_REPLIES, timeout=5).payload() == b"again"
    assert store.get("k", timeout=5) == b"v"
    store.close()
    a.close()
    b.close()
