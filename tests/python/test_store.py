"""tpd.Store: a torch.distributed.Store over the daemon's store."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import rpc_workers
import tpd


def test_c10d_operations(daemon):
    store = tpd.Store(daemon.socket, namespace="job1")
    assert isinstance(store, dist.Store)
    store.set("k", "v")
    assert store.get("k") == b"v"
    assert store.add("n", 5) == 5 and store.add("n", -2) == 3
    assert store.compare_set("k", "v", "w") == b"w"
    assert store.compare_set("k", "nope", "x") == b"w"
    assert store.check(["k", "n"]) and not store.check(["absent"])
    assert store.num_keys() >= 2
    assert store.delete_key("k") and not store.delete_key("k")
    store.set_timeout(timedelta(milliseconds=200))
    with pytest.raises(RuntimeError, match="Timeout"):
        store.get("absent")
    with pytest.raises(RuntimeError, match="Timeout"):
        store.wait(["absent"], timedelta(milliseconds=100))
    with pytest.raises(TypeError):
        store.set("k", 3)
    # Namespaces keep jobs apart.
    assert not tpd.Store(daemon.socket, namespace="job2").check(["n"])


def _gloo(rank, world_size, init_method, socket=None):
    store = tpd.Store(socket, namespace="gloo-job")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


def test_gloo_process_group_over_tpd_store(daemon):
    results = rpc_workers.run(_gloo, 2, [daemon.socket], "", socket=daemon.socket)
    assert results == {0: [3.0] * 4, 1: [3.0] * 4}
