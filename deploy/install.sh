#!/usr/bin/env bash
# Installs a built tpd and tpctl, the systemd unit and (if absent) the example config.
#
#   sudo deploy/install.sh [TPD_BINARY [TPCTL_BINARY]]
#
# Binaries default to Bazel's outputs (bazel build //daemon:tpd //client:tpctl), relative to
# the current directory. An existing /etc/tpd/tpd.toml is kept. Then: systemctl enable --now tpd
set -euo pipefail

deploy_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tpd_bin="${1:-bazel-bin/daemon/tpd}"
tpctl_bin="${2:-bazel-bin/client/tpctl}"

install -D -m 0755 "$tpd_bin" /usr/local/bin/tpd
install -D -m 0755 "$tpctl_bin" /usr/local/bin/tpctl
install -D -m 0644 "$deploy_dir/tpd.service" /etc/systemd/system/tpd.service
if [[ ! -e /etc/tpd/tpd.toml ]]; then
  install -D -m 0644 "$deploy_dir/tpd.toml" /etc/tpd/tpd.toml
fi

# Only a running systemd (PID 1) can reload; in a container or chroot, skip it.
if [[ "$(cat /proc/1/comm 2>/dev/null)" == systemd ]]; then
  systemctl daemon-reload
fi
echo "installed tpd, tpctl and tpd.service; start with: systemctl enable --now tpd"
