"""torch.distributed.rpc.options on tpd: the options ``init_rpc`` takes."""

from typing import Any, List, Optional

from torch.distributed.rpc import TensorPipeRpcBackendOptions as _TorchOptions

__all__ = ["TensorPipeRpcBackendOptions"]


class TensorPipeRpcBackendOptions(_TorchOptions):
    """torch's ``TensorPipeRpcBackendOptions``, the same arguments, validation and messages;
    tpd also reads the private ``_transports`` and ``_channels`` torch drops.

    Args:
        num_worker_threads (int): threads that run this worker's incoming calls.
        rpc_timeout (float): default timeout of calls, in seconds (0: none).
        init_method (str): the rendezvous URL (tpd.rpc.api says which: env://, tcp://,
            file://, etcd://, tpd://).
        device_maps (Dict[str, Dict]): per callee, this worker's devices to the callee's.
        devices (List): the devices this worker's calls may use.
        _transports, _channels (List[str]): the TensorPipe transports and channels to offer.
    """

    def __init__(self, *args: Any, _transports: Optional[List[str]] = None,
                 _channels: Optional[List[str]] = None, **kwargs: Any) -> None:
        super().__init__(*args, _transports=_transports, _channels=_channels, **kwargs)
        self._tpd_transports = list(_transports or [])
        self._tpd_channels = list(_channels or [])
