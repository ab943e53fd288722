"""tpd's Python package; pyproject.toml holds its metadata. This file adds tpd._C, the TPD
backend's agent, a torch C++ extension built against the torch installed where pip runs:
only when that torch's C++ headers are there (Debian: libtorch-dev) and the package is built
from tpd's source tree (the sources include client/c/tpd_client.h). Without them the package
installs without it: tpd.rpc works, and `import tpd.backend` says what is missing.

    pip install --no-build-isolation ./python   # build isolation would hide the installed torch
"""

import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _extension():
    try:
        from torch.utils import cpp_extension
    except ImportError:
        return None, "torch is not importable here (pip's build isolation hides it?)"
    headers = os.path.join(cpp_extension.include_paths()[0], "torch", "csrc", "distributed",
                           "rpc", "rpc_agent.h")
    if not os.path.exists(headers):
        return None, f"torch's C++ headers are not installed ({headers})"
    if not os.path.exists(os.path.join(ROOT, "client", "c", "tpd_client.h")):
        return None, f"{ROOT} is not tpd's source tree (client/c/tpd_client.h)"
    sys.path.insert(0, os.path.join(HERE, "tpd", "csrc"))
    import build  # python/tpd/csrc/build.py: the flags, shared with Bazel's build

    import torch
    cuda = bool(torch.version.cuda)
    extension = cpp_extension.CppExtension(
        name="tpd._C",
        sources=[os.path.join("tpd", "csrc", source) for source in build.SOURCES],
        include_dirs=[ROOT] + ([build.cuda_include()] if cuda else []),
        define_macros=[("TPD_TORCH_CUDA", None)] if cuda else [],
        extra_compile_args=["-std=c++17", "-Wno-deprecated-declarations"],
        libraries=["torch_python"] + (["c10_cuda"] if cuda else []))
    return (extension, cpp_extension.BuildExtension), None


built, why_not = _extension()
if built is None:
    print(f"tpd: building without tpd._C (the TPD backend): {why_not}", file=sys.stderr)
    setup()
else:
    setup(ext_modules=[built[0]], cmdclass={"build_ext": built[1]})
