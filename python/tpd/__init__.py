"""tpd: PyTorch programs on the node's tpd daemon.

- ``tpd.rpc``: a drop-in for ``torch.distributed.rpc`` (``import tpd.rpc as rpc``);
- ``tpd.Store``: a ``torch.distributed.Store`` over the daemon's store.

Nothing starts, connects or loads a library at import: a process may import tpd and fork.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so that importing tpd (or tpd.rpc's options) does not pull torch.distributed in
    # before it is needed.
    if name == "Store":
        from tpd._store import Store
        return Store
    raise AttributeError(f"module 'tpd' has no attribute {name!r}")
