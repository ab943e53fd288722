"""C++ code generation for .proto files with Debian's protoc and grpc_cpp_plugin.

Bazel 4's native proto rules want to build protoc from source; offline we use the system
compiler instead. `tpd_proto_library(name = "x_proto", src = "x.proto")` generates
x.pb.{h,cc} (and x.grpc.pb.{h,cc} when `grpc` is true) next to the source, so code includes
"proto/x.pb.h", and wraps them in a cc_library of the same name.
"""

def tpd_proto_library(name, src, deps = [], grpc = True, proto_root = "", alwayslink = False, visibility = None):
    """Generates and compiles C++ code for one .proto file.

    Args:
      name: name of the resulting cc_library.
      src: the .proto file in this package, or, with `proto_root`, its path under that root.
      deps: other tpd_proto_library targets whose .proto files `src` imports.
      grpc: also generate gRPC service stubs.
      proto_root: an absolute directory outside the workspace holding `src` (for the
        well-known gRPC protos Debian installs under /usr/share/grpc-proto).
      alwayslink: link the generated code into every binary that depends on it, even where
        no symbol of it is referenced, so its descriptor is in the binary's descriptor pool
        (what server reflection answers from).
      visibility: visibility of the cc_library.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]

    pkg = native.package_name()
    if proto_root:
        # Generated files land under this package, e.g. bazel/grpc/grpc/health/v1/...
        srcs = []
        includes = "-I" + proto_root
        out_dir = "$(GENDIR)/" + pkg
        proto_arg = proto_root + "/" + src
    else:
        srcs = [src]
        includes = "-I."
        out_dir = "$(GENDIR)"
        proto_arg = "$(location " + src + ")"

    plugin = " --grpc_out=" + out_dir + " --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)" if grpc else ""
    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = "protoc " + includes + " --cpp_out=" + out_dir + plugin + " " + proto_arg,
    )
    native.filegroup(
        name = name + "_srcs",
        srcs = srcs,
        visibility = visibility,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."] if proto_root else [],
        alwayslink = alwayslink,
        deps = deps + ["@system//:grpc", "@system//:protobuf"],
        visibility = visibility,
    )
