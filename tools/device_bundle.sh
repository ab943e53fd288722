#!/usr/bin/env bash
# Packs Bazel binaries built here for the GPU machine (the `run` tool's device, Ubuntu 24.04,
# no Bazel, no Debian -dev packages): builds the targets with -c opt, copies each binary
# (stripped) and every shared library it needs that the target does not bring itself into a
# folder git ignores, with a wrapper that sets LD_LIBRARY_PATH.
#
#   tools/device_bundle.sh [-o DIR] [--ip] //bench:relay_bench //daemon:tpd ...   (DIR: .device)
#
# --ip also carries this machine's iproute2 `ip` (the GPU machine has none), for
# bench/netns_pair.sh: .device/run ip ...
#
# Then, on the device (`run` with carry [".device"]):
#   .device/run relay_bench --scale=1        # .device/bin/relay_bench with .device/lib
#
# What stays behind: glibc (libc, libm, libpthread, libdl, librt, libresolv, the loader...),
# libstdc++ and libgcc_s. The target's are newer than Debian 12's and backward compatible, and
# mixing a carried glibc with the target's loader breaks. Everything else ldd lists (gRPC,
# protobuf, Abseil, TensorPipe, libuv, spdlog, fmt, OpenSSL, zlib, ...) is carried, so the
# binaries see the versions they were built against. The `run` tool carries at most 64 MiB:
# the script prints the bundle's size and fails above 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."

out=.device
with_ip=false
while [[ ${1:-} == -o || ${1:-} == --ip ]]; do
  if [[ $1 == -o ]]; then
    out=$2
    shift 2
  else
    with_ip=true
    shift
  fi
done
if [[ $# -eq 0 ]]; then
  echo "usage: $0 [-o DIR] [--ip] //pkg:target ..." >&2
  exit 2
fi

bazel build -c opt "$@"
bin_dir=$(bazel info -c opt bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"

# Libraries of the target system: never carried.
is_system() {
  case "$(basename "$1")" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libmvec.so* | libpthread.so* | \
      libdl.so* | librt.so* | libresolv.so* | libutil.so* | libanl.so* | libnsl.so* | \
      libstdc++.so* | libgcc_s.so*)
      return 0 ;;
  esac
  return 1
}

# Copies `binary` to bin/NAME and the libraries it needs that the target lacks to lib/.
carry() {
  local binary=$1 name=$2
  cp -L "$binary" "$out/bin/$name"
  chmod u+w "$out/bin/$name"
  strip --strip-unneeded "$out/bin/$name"
  # "libfoo.so.1 => /path/libfoo.so.1 (0x...)"; a library ldd cannot find fails the bundle.
  if ldd "$binary" | grep -q "not found"; then
    ldd "$binary" | grep "not found" >&2
    exit 1
  fi
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | while read -r lib; do
    is_system "$lib" && continue
    dest="$out/lib/$(basename "$lib")"
    [[ -e $dest ]] && continue
    cp -L "$lib" "$dest"
    chmod u+w "$dest"
    strip --strip-unneeded "$dest"
  done
}

for target in "$@"; do
  label=${target#//}
  pkg=${label%%:*}
  name=${label##*:}
  [[ $label == *:* ]] || name=$(basename "$pkg")
  binary="$bin_dir/$pkg/$name"
  if [[ ! -x $binary ]]; then
    echo "no executable for $target at $binary" >&2
    exit 1
  fi
  carry "$binary" "$name"
done
if $with_ip; then
  carry "$(command -v ip)" ip
fi

cat >"$out/run" <<'EOF'
#!/usr/bin/env bash
# Runs one of the bundled binaries with the bundled libraries: run NAME [ARGS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=$1
shift
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/bin/$name" "$@"
EOF
chmod +x "$out/run"

size_kib=$(du -sk "$out" | cut -f1)
echo "bundle $out: $(ls "$out/bin" | wc -l) binaries, $(ls "$out/lib" | wc -l) libraries, $((size_kib / 1024)) MiB"
if ((size_kib > 60 * 1024)); then
  echo "too large for the run tool's carry (64 MiB in all with the working tree)" >&2
  exit 1
fi
