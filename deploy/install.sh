#!/usr/bin/env bash
# Installs a built tpd and tpctl, the system user the unit runs as, the systemd unit and (if
# absent) the example config.
#
#   sudo deploy/install.sh [TPD_BINARY [TPCTL_BINARY]]
#
# Binaries default to Bazel's outputs (bazel build //daemon:tpd //client:tpctl), relative to
# the current directory. An existing /etc/tpd/tpd.toml is kept, but made readable by the
# daemon's group and nobody else (it holds the cluster token). Then: systemctl enable --now tpd
set -euo pipefail

deploy_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tpd_bin="${1:-bazel-bin/daemon/tpd}"
tpctl_bin="${2:-bazel-bin/client/tpctl}"

# The daemon's own unprivileged system user and group (tpd.service: User=tpd). Its home is the
# unit's StateDirectory; it never logs in.
if ! getent passwd tpd >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /var/lib/tpd \
    --shell /usr/sbin/nologin --comment "tpd per-node RPC daemon" tpd
fi
# NVIDIA device files are group `video` on distributions that restrict them (0660); where
# the group exists, tpd joins it so CUDA IPC can open them.
if getent group video >/dev/null; then
  usermod --append --groups video tpd
fi

install -D -m 0755 "$tpd_bin" /usr/local/bin/tpd
install -D -m 0755 "$tpctl_bin" /usr/local/bin/tpctl
install -D -m 0644 "$deploy_dir/tpd.service" /etc/systemd/system/tpd.service
if [[ ! -e /etc/tpd/tpd.toml ]]; then
  install -D -m 0640 -o root -g tpd "$deploy_dir/tpd.toml" /etc/tpd/tpd.toml
else
  chgrp tpd /etc/tpd/tpd.toml
  chmod 0640 /etc/tpd/tpd.toml
fi

# Only a running systemd (PID 1) can reload; in a container or chroot, skip it.
if [[ "$(cat /proc/1/comm 2>/dev/null)" == systemd ]]; then
  systemctl daemon-reload
fi
echo "installed tpd, tpctl and tpd.service (runs as user tpd); start with: systemctl enable --now tpd"
echo "socket_group in /etc/tpd/tpd.toml? add tpd to it first: usermod --append --groups GROUP tpd"
