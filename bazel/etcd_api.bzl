"""The @etcd_api repository: where etcd's v3 API .proto files are on this machine.

etcd 3.4's rpc.proto imports "etcd/mvcc/mvccpb/kv.proto", "gogoproto/gogo.proto" and
"google/api/annotations.proto". Debian ships them in three Go source packages
(tools/setup.sh unpacks them under /usr/local/share/tpd/etcd-api, or they are installed
under /usr/share/gocode/src). This rule links each import root into one include tree,
<repo>/include/{etcd,gogoproto,google/api}, and writes root.bzl with that tree's absolute
path for bazel/etcd/BUILD.bazel, which compiles the files with tpd_proto_library as
bazel/grpc compiles /usr/share/grpc-proto. Nothing is copied into the source tree.
"""

# Where the Go source trees may be, first match wins. TPD_ETCD_API_ROOT overrides.
_GOCODE_ROOTS = [
    "/usr/local/share/tpd/etcd-api/usr/share/gocode/src",
    "/usr/share/gocode/src",
]

# include-tree path -> (path under a gocode root, the Debian package that ships it).
_LINKS = {
    "etcd": ("go.etcd.io/etcd", "golang-etcd-server-dev"),
    "gogoproto": ("github.com/gogo/protobuf/gogoproto", "golang-github-gogo-protobuf-dev"),
    "google/api": (
        "github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis/google/api",
        "golang-github-grpc-ecosystem-grpc-gateway-dev",
    ),
}

# A file each link must hold for the root to count.
_PROBES = {
    "etcd": "etcdserver/etcdserverpb/rpc.proto",
    "gogoproto": "gogo.proto",
    "google/api": "annotations.proto",
}

def _etcd_api_impl(rctx):
    roots = list(_GOCODE_ROOTS)
    override = rctx.os.environ.get("TPD_ETCD_API_ROOT", "")
    if override:
        roots = [override] + roots
    missing = []
    for link, (subdir, package) in _LINKS.items():
        found = None
        for root in roots:
            candidate = rctx.path(root + "/" + subdir)
            if rctx.path(str(candidate) + "/" + _PROBES[link]).exists:
                found = candidate
                break
        if found == None:
            missing.append("%s (%s, from %s)" % (subdir, link, package))
        else:
            rctx.symlink(found, "include/" + link)
    if missing:
        fail(("etcd's v3 API .proto files are missing: %s; searched %s. Run tools/setup.sh " +
              "(it unpacks the Debian packages named above into " +
              "/usr/local/share/tpd/etcd-api).") % (", ".join(missing), ", ".join(roots)))
    rctx.file("root.bzl", "ETCD_API_INCLUDE = %r\n" % str(rctx.path("include")))
    rctx.file("BUILD.bazel", "exports_files([\"root.bzl\"])\n")

etcd_api_repository = repository_rule(
    implementation = _etcd_api_impl,
    environ = ["TPD_ETCD_API_ROOT"],
    local = True,
)
