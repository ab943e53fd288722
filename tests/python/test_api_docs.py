"""The Python package's public API is documented and typed: every public function, class and
method of tpd.rpc, tpd.Store and tpd.rpc.functions has a docstring, functions that take
arguments say them under "Args:", and every parameter and return value is annotated. Names
torch defines and tpd.rpc re-exports unchanged (WorkerInfo, BackendType, RpcBackendOptions)
are torch's to document."""

import ast
import inspect
import pathlib

import pytest

import tpd
import tpd.rpc
import tpd.rpc.functions

TORCHS = {"WorkerInfo", "BackendType", "RpcBackendOptions", "UNSET_RPC_TIMEOUT"}


def _public():
    for name in sorted(dir(tpd.rpc)):
        obj = getattr(tpd.rpc, name)
        if name.startswith("_") or name in TORCHS or inspect.ismodule(obj):
            continue
        yield f"tpd.rpc.{name}", obj
        if inspect.isclass(obj):
            for method, fn in vars(obj).items():
                if not method.startswith("_") and callable(fn):
                    yield f"tpd.rpc.{name}.{method}", fn
    yield "tpd.rpc.functions.async_execution", tpd.rpc.functions.async_execution
    yield "tpd.Store", tpd.Store
    for method, fn in vars(tpd.Store).items():
        if not method.startswith("_") and callable(fn):
            yield f"tpd.Store.{method}", fn


PUBLIC = list(_public())


@pytest.mark.parametrize("name,obj", PUBLIC, ids=[name for name, _ in PUBLIC])
def test_documented_and_typed(name, obj):
    assert inspect.getdoc(obj), f"{name} has no docstring"
    fn = obj.__init__ if inspect.isclass(obj) else obj
    signature = inspect.signature(fn)
    params = [p for p in signature.parameters.values() if p.name not in ("self", "cls")]
    for p in params:
        assert p.annotation is not inspect.Parameter.empty, f"{name}: {p.name} not annotated"
    assert signature.return_annotation is not inspect.Signature.empty, \
        f"{name}: return not annotated"
    named = [p for p in params if not p.name.startswith("_")
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(named) > 1:
        assert "Args:" in inspect.getdoc(obj), f"{name} takes arguments but has no Args:"


def test_only_the_ctypes_layer_touches_ctypes_and_the_library():
    """tpd._capi (the library's loading, its C types) and tpd._client (the handles over it) are
    the ctypes layer: every other module sees Python values and errors only. tpd.rpc._state's
    use of CPython's own API (ctypes.pythonapi, to keep a forked child's agent forever) is not
    the library's."""
    root = pathlib.Path(tpd.__file__).parent
    layer = {"_capi.py", "_client.py"}
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.name in layer:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                touches_ctypes = name == "ctypes" and path.name != "_state.py"
                if touches_ctypes or name.endswith("_capi"):
                    offenders.append(f"{path.relative_to(root)}: imports {name}")
    assert offenders == []
