#!/usr/bin/env bash
# Builds tpd's Debian package from binaries already built, offline, with dpkg-deb:
#
#   deploy/make_deb.sh --tpd BIN --tpctl BIN --lib LIBTPD_CLIENT_SO --out DIR
#
# prints the .deb's path. tools/package.sh builds the binaries (-c opt) and calls this;
# tests/deploy:package_test calls it on the test's own builds. What goes where:
#
#   /usr/sbin/tpd, /usr/bin/tpctl                  the daemon, the operator's command line
#   /usr/lib/tpd/libtpd_client.so                  the C ABI (private directory: no SONAME;
#   /usr/include/tpd_client.h                      its version is tpd_abi_version, checked
#                                                  by every user at load)
#   /usr/lib/python3/dist-packages/tpd/            tpd.rpc, tpd.Store (pure Python; _lib/ links
#                                                  to the library above). tpd.backend's torch
#                                                  extension is built where torch is: pip
#                                                  install ./python from the source tree.
#   /lib/systemd/system/tpd.service                the unit, binaries at the paths above
#   /usr/lib/sysusers.d/tpd.conf, tmpfiles.d/tpd.conf   user tpd, /var/lib/tpd
#   /etc/tpd/tpd.toml                              the config, a conffile (0640 root:tpd)
#   /usr/share/man/man8/tpd.8.gz, man1/tpctl.1.gz, /usr/share/doc/tpd/
#
# Depends: from dpkg-shlibdeps (the Debian packages of the libraries the binaries link).
# TPD_MAINTAINER ("Name <address>") names the maintainer; lintian's remaining findings are
# overridden in deploy/lintian-overrides, each with its reason.
set -euo pipefail

deploy_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root_dir="$(dirname "$deploy_dir")"
tpd_bin="" tpctl_bin="" lib="" out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tpd) tpd_bin=$2; shift 2 ;;
    --tpctl) tpctl_bin=$2; shift 2 ;;
    --lib) lib=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "make_deb.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in tpd_bin tpctl_bin lib out; do
  [[ -n "${!v}" ]] || { echo "usage: make_deb.sh --tpd BIN --tpctl BIN --lib SO --out DIR" >&2; exit 2; }
done

maintainer="${TPD_MAINTAINER:-tpd maintainers <tpd@localhost>}"
version="$(sed -n 's/.*kVersion\[\] = "\(.*\)";/\1/p' "$root_dir/daemon/version.h")"
arch="$(dpkg --print-architecture)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pkg="$work/tpd"
mkdir -p "$pkg/DEBIAN"

# Files, with the modes Debian wants (lintian checks them). Binaries are stripped.
put() {  # MODE SOURCE DEST
  install -D -m "$1" "$2" "$pkg/$3"
}
put 0755 "$tpd_bin" usr/sbin/tpd
put 0755 "$tpctl_bin" usr/bin/tpctl
put 0644 "$lib" usr/lib/tpd/libtpd_client.so
strip --strip-unneeded --remove-section=.comment --remove-section=.note \
  "$pkg/usr/sbin/tpd" "$pkg/usr/bin/tpctl" "$pkg/usr/lib/tpd/libtpd_client.so"
put 0644 "$root_dir/client/c/tpd_client.h" usr/include/tpd_client.h
(cd "$root_dir/python" && find tpd -name '*.py' -not -path 'tpd/csrc/*' -print0) |
  while IFS= read -r -d '' file; do
    put 0644 "$root_dir/python/$file" "usr/lib/python3/dist-packages/$file"
  done
mkdir -p "$pkg/usr/lib/python3/dist-packages/tpd/_lib"
ln -s ../../../../tpd/libtpd_client.so "$pkg/usr/lib/python3/dist-packages/tpd/_lib/libtpd_client.so"

mkdir -p "$pkg/lib/systemd/system"
sed -e 's|/usr/local/bin/tpd |/usr/sbin/tpd |' -e 's|/usr/local/bin/tpctl |/usr/bin/tpctl |' \
  -e 's|Install with deploy/install.sh (which also creates the system user|Installed by the tpd package (whose sysusers.d entry creates the system user|' \
  "$deploy_dir/tpd.service" > "$pkg/lib/systemd/system/tpd.service"
chmod 0644 "$pkg/lib/systemd/system/tpd.service"
mkdir -p "$pkg/usr/lib/sysusers.d" "$pkg/usr/lib/tmpfiles.d"
cat > "$pkg/usr/lib/sysusers.d/tpd.conf" <<'EOF'
# The daemon's own unprivileged system user (tpd.service: User=tpd); it never logs in.
u tpd - "tpd per-node RPC daemon" /var/lib/tpd /usr/sbin/nologin
EOF
cat > "$pkg/usr/lib/tmpfiles.d/tpd.conf" <<'EOF'
# The unit's StateDirectory, also present before the first start (file:// rendezvous).
d /var/lib/tpd 0750 tpd tpd -
d /var/lib/tpd/rendezvous 0750 tpd tpd -
EOF
chmod 0644 "$pkg/usr/lib/sysusers.d/tpd.conf" "$pkg/usr/lib/tmpfiles.d/tpd.conf"
put 0644 "$deploy_dir/tpd.toml" etc/tpd/tpd.toml

mkdir -p "$pkg/usr/share/man/man8" "$pkg/usr/share/man/man1"
gzip -9n < "$deploy_dir/man/tpd.8" > "$pkg/usr/share/man/man8/tpd.8.gz"
gzip -9n < "$deploy_dir/man/tpctl.1" > "$pkg/usr/share/man/man1/tpctl.1.gz"
doc="$pkg/usr/share/doc/tpd"
mkdir -p "$doc"
cp "$root_dir/docs/operations.md" "$root_dir/docs/security.md" "$doc/"
cat > "$doc/copyright" <<'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: tpd
Source: the tpd source tree

Files: *
Copyright: 2026 the tpd authors
License: proprietary
 No license has been granted for tpd yet: all rights are reserved by its authors.
EOF
printf 'tpd (%s) unstable; urgency=medium\n\n  * Built from the tpd source tree by tools/package.sh.\n\n -- %s  %s\n' \
  "$version" "$maintainer" "$(date -R -d @"${SOURCE_DATE_EPOCH:-$(git -C "$root_dir" log -1 --format=%ct 2>/dev/null || date +%s)}")" |
  gzip -9n > "$doc/changelog.gz"
mkdir -p "$pkg/usr/share/lintian/overrides"
cp "$deploy_dir/lintian-overrides" "$pkg/usr/share/lintian/overrides/tpd"
find "$pkg" -type d -exec chmod 0755 {} +
find "$doc" "$pkg/usr/share/man" "$pkg/usr/share/lintian" -type f -exec chmod 0644 {} +

# Maintainer scripts: what debhelper would write for a unit, a sysusers and a tmpfiles entry.
cat > "$pkg/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  systemd-sysusers tpd.conf
  # NVIDIA device files are group video where distributions restrict them.
  if getent group video >/dev/null; then usermod --append --groups video tpd; fi
  systemd-tmpfiles --create tpd.conf
  # The config holds the cluster token: the daemon's group reads it, nobody else.
  chgrp tpd /etc/tpd/tpd.toml
  chmod 0640 /etc/tpd/tpd.toml
fi
if [ "$1" = configure ] || [ "$1" = abort-upgrade ] || [ "$1" = abort-deconfigure ] || [ "$1" = abort-remove ]; then
  deb-systemd-helper unmask tpd.service >/dev/null || true
  if deb-systemd-helper --quiet was-enabled tpd.service; then
    deb-systemd-helper enable tpd.service >/dev/null || true
  else
    deb-systemd-helper update-state tpd.service >/dev/null || true
  fi
  if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
    if [ -n "$2" ]; then _dh_action=restart; else _dh_action=start; fi
    deb-systemd-invoke $_dh_action tpd.service >/dev/null || true
  fi
fi
EOF
cat > "$pkg/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
# Stopping drains the node (the unit's ExecStop: tpctl drain --exit).
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  deb-systemd-invoke stop tpd.service >/dev/null || true
fi
EOF
cat > "$pkg/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl --system daemon-reload >/dev/null || true
fi
if [ "$1" = remove ]; then
  if [ -x "/usr/bin/deb-systemd-helper" ]; then
    deb-systemd-helper mask tpd.service >/dev/null || true
  fi
fi
if [ "$1" = purge ]; then
  if [ -x "/usr/bin/deb-systemd-helper" ]; then
    deb-systemd-helper purge tpd.service >/dev/null || true
    deb-systemd-helper unmask tpd.service >/dev/null || true
  fi
  rm -rf /var/lib/tpd
fi
EOF
chmod 0755 "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/prerm" "$pkg/DEBIAN/postrm"
echo /etc/tpd/tpd.toml > "$pkg/DEBIAN/conffiles"

# Depends: the packages of the libraries the binaries need, as dpkg-shlibdeps finds them.
mkdir -p "$work/debian"
printf 'Source: tpd\n\nPackage: tpd\nArchitecture: any\n' > "$work/debian/control"
shlibs="$(cd "$work" && dpkg-shlibdeps -O -e tpd/usr/sbin/tpd -e tpd/usr/bin/tpctl \
  -e tpd/usr/lib/tpd/libtpd_client.so 2>/dev/null | sed -n 's/^shlibs:Depends=//p')"
installed_kib="$(du -k -s --exclude=DEBIAN "$pkg" | cut -f1)"
cat > "$pkg/DEBIAN/control" <<EOF
Package: tpd
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_kib
Depends: $shlibs, systemd, passwd, python3
Recommends: python3-torch
Section: net
Priority: optional
Homepage: https://localhost/tpd
Description: per-node RPC daemon for distributed tensor work
 One daemon per machine hosts the TensorPipe agent and device-mapped CUDA
 transfers for every process on it. Local processes reach it over a gRPC unix
 socket (rendezvous, group membership, a c10d-compatible store) and shared
 memory (tensors). Python programs use tpd.rpc, a drop-in for
 torch.distributed.rpc; C and C++ programs use libtpd_client.so. Operators use
 tpctl, Prometheus metrics and the journal.
EOF
(cd "$pkg" && find . -type f -not -path './DEBIAN/*' -printf '%P\0' | sort -z |
  xargs -0 md5sum > DEBIAN/md5sums)
chmod 0644 "$pkg/DEBIAN/control" "$pkg/DEBIAN/conffiles" "$pkg/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/tpd_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
echo "$deb"
