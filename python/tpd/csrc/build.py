"""Builds tpd._C, the TPD agent (torch's RpcAgent on tpd), against the torch this Python has.

    python3 python/tpd/csrc/build.py [--out OUT] [--root REPO]

writes python/tpd/_C<EXT_SUFFIX> (_C.cpython-311-x86_64-linux-gnu.so) by default.

Bazel runs it (//python:torch_agent), and so does the GPU machine's bundle, where torch is
another version (torch extensions are built where they run). `pip install ./python` builds
the same sources through setuptools (python/setup.py). The flags are torch's own for its
extensions (torch.utils.cpp_extension), so the binding shares torch's pybind11 types.
"""

import argparse
import os
import subprocess
import sys
import sysconfig

SOURCES = ["agent.cc", "client_api.cc", "module.cc"]


def compile_flags():
    """The compiler flags torch gives its extensions, and those of this module."""
    import torch
    from torch.utils import cpp_extension
    # torch's headers use std::iterator, which C++17 deprecates: warnings that are not ours.
    flags = ["-O2", "-fPIC", "-std=c++17", "-Wno-deprecated-declarations",
             "-DTORCH_EXTENSION_NAME=_C",
             "-DTORCH_API_INCLUDE_EXTENSION_H",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        value = getattr(torch._C, f"_PYBIND11_{name}", None)
        if value is not None:
            flags.append(f'-DPYBIND11_{name}="{value}"')
    includes = cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]
    if torch.version.cuda:
        # CUDA tensors: the agent reads torch's current CUDA streams (c10/cuda), whose headers
        # include the CUDA runtime's.
        flags.append("-DTPD_TORCH_CUDA")
        includes.append(cuda_include())
    return flags + [f"-I{path}" for path in includes]


def cuda_include():
    """Where cuda_runtime_api.h is: $TPD_CUDA_INCLUDE, the CUDA toolkit's, or the one the
    torch wheel's CUDA runtime package brings (nvidia/*/include)."""
    import glob
    candidates = [os.environ.get("TPD_CUDA_INCLUDE", "")]
    candidates += [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")]
    for path in sys.path:
        candidates += sorted(glob.glob(os.path.join(path, "nvidia", "*", "include")))
    for candidate in candidates:
        if candidate and os.path.exists(os.path.join(candidate, "cuda_runtime_api.h")):
            return candidate
    sys.exit("cannot build tpd._C for this torch with CUDA: no cuda_runtime_api.h (set "
             "$TPD_CUDA_INCLUDE to the CUDA toolkit's include directory)")


def libraries():
    """The torch libraries the module links."""
    import torch
    return ["c10", "torch", "torch_cpu", "torch_python"] + (["c10_cuda"] if torch.version.cuda
                                                            else [])


def link_flags():
    from torch.utils import cpp_extension
    flags = []
    for path in cpp_extension.library_paths():
        flags += [f"-L{path}", f"-Wl,-rpath,{path}"]
    return flags + [f"-l{library}" for library in libraries()]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(
        here, "..", "_C" + sysconfig.get_config_var("EXT_SUFFIX")))
    parser.add_argument("--root", default=os.path.join(here, "..", "..", ".."),
                        help="the repository, whose client/c/tpd_client.h the sources include")
    parser.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    args = parser.parse_args()
    try:
        flags = compile_flags()
    except ImportError as e:
        sys.exit(f"cannot build tpd._C: {e} (it needs torch and its headers: Debian's "
                 "python3-torch and libtorch-dev)")
    command = ([args.cxx, "-shared", "-o", args.out, f"-I{args.root}"] + flags +
               [os.path.join(here, source) for source in SOURCES] + link_flags())
    sys.exit(subprocess.call(command))


if __name__ == "__main__":
    main()
