#!/usr/bin/env bash
# The Debian package (deploy/make_deb.sh, tools/package.sh), built from this test's binaries
# and checked without touching the machine: its control fields and contents, dpkg unpacking
# it into an alternate root, the unit's sysusers and tmpfiles entries applied to that root,
# the installed unit verified by systemd-analyze, the installed Python package loading the
# installed library, the man pages rendering without warnings, and lintian finding nothing
# beyond deploy/lintian-overrides. Cases whose tool is missing report themselves skipped.
set -uo pipefail

ws="${TEST_SRCDIR}/${TEST_WORKSPACE}"
JUNIT_SUITE=PackageTest
# shellcheck source=tests/deploy/junit_cases.sh
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/deploy/junit_cases.sh"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
version="$(sed -n 's/.*kVersion\[\] = "\(.*\)";/\1/p' "$ws/daemon/version.h")"

if ! deb="$(bash "$ws/deploy/make_deb.sh" --tpd "$ws/daemon/tpd" --tpctl "$ws/client/tpctl" \
            --lib "$ws/client/c/libtpd_client.so" --out "$work/out" 2>"$work/make.err")"; then
  record BuildsWithDpkgDeb fail "make_deb.sh failed: $(cat "$work/make.err")"
  finish
fi
field() { dpkg-deb -f "$deb" "$1"; }
depends="$(field Depends)"
if [[ "$(basename "$deb")" == "tpd_${version}_$(dpkg --print-architecture).deb" &&
      "$(field Package)" == tpd && "$(field Version)" == "$version" &&
      "$depends" == *libgrpc++* && "$depends" == *libtensorpipe* && "$depends" == *systemd* ]]; then
  record BuildsWithDpkgDeb pass "$(basename "$deb"), Depends: $depends"
else
  record BuildsWithDpkgDeb fail "unexpected name or fields: $(basename "$deb"); $(dpkg-deb -f "$deb")"
fi

contents="$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|')"
missing=""
for path in /usr/sbin/tpd /usr/bin/tpctl /usr/lib/tpd/libtpd_client.so /usr/include/tpd_client.h \
            /usr/lib/python3/dist-packages/tpd/__init__.py /usr/lib/python3/dist-packages/tpd/rpc/__init__.py \
            /usr/lib/python3/dist-packages/tpd/_lib/libtpd_client.so /lib/systemd/system/tpd.service \
            /usr/lib/sysusers.d/tpd.conf /usr/lib/tmpfiles.d/tpd.conf /etc/tpd/tpd.toml \
            /usr/share/man/man8/tpd.8.gz /usr/share/man/man1/tpctl.1.gz /usr/share/doc/tpd/copyright \
            /usr/share/doc/tpd/operations.md; do
  grep -qx "$path" <<<"$contents" || missing+=" $path"
done
conffiles="$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)"
if [[ -z "$missing" && "$conffiles" == /etc/tpd/tpd.toml ]] &&
   ! grep -q "csrc" <<<"$contents"; then
  record ContentsAreWhereTheUnitAndPythonLookForThem pass "$(wc -l <<<"$contents") entries"
else
  record ContentsAreWhereTheUnitAndPythonLookForThem fail "missing:$missing; conffiles: $conffiles"
fi

# dpkg's own unpacking, into a root of its own (configure would run the maintainer scripts
# chrooted there, where no shell is: the next case applies what they do).
root="$work/root"
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
touch "$root/var/lib/dpkg/status"
if unpacked="$(dpkg --root="$root" --force-depends --force-not-root --unpack "$deb" 2>&1)" &&
   dpkg --root="$root" -s tpd | grep -q "^Status: install ok unpacked" &&
   dpkg --root="$root" -s tpd | grep -q "/etc/tpd/tpd.toml" &&
   [[ -x "$root/usr/sbin/tpd" ]]; then
  record DpkgUnpacksIntoAnAlternateRoot pass "status unpacked, conffile registered"
else
  record DpkgUnpacksIntoAnAlternateRoot fail "$unpacked $(dpkg --root="$root" -s tpd 2>&1)"
fi

if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null; then
  mkdir -p "$root/etc"
  systemd-sysusers --root="$root" >"$work/sysusers.log" 2>&1
  systemd-tmpfiles --root="$root" --create "$root/usr/lib/tmpfiles.d/tpd.conf" >>"$work/sysusers.log" 2>&1
  tpd_uid="$(awk -F: '$1 == "tpd" {print $3}' "$root/etc/passwd" 2>/dev/null)"
  if [[ -n "$tpd_uid" && "$(stat -c '%u %a' "$root/var/lib/tpd/rendezvous" 2>/dev/null)" == "$tpd_uid 750" ]]; then
    record SysusersAndTmpfilesMakeTheUserAndItsState pass "user tpd uid $tpd_uid owns /var/lib/tpd"
  else
    record SysusersAndTmpfilesMakeTheUserAndItsState fail "$(cat "$work/sysusers.log"); passwd: $(cat "$root/etc/passwd" 2>&1)"
  fi
else
  record SysusersAndTmpfilesMakeTheUserAndItsState skip "systemd-sysusers or systemd-tmpfiles is not installed"
fi

if command -v systemd-analyze >/dev/null; then
  # As installed, with the executables it names pointing into the alternate root.
  sed -e "s|=/usr/sbin/tpd |=$root/usr/sbin/tpd |" -e "s|=-/usr/bin/tpctl |=-$root/usr/bin/tpctl |" \
    "$root/lib/systemd/system/tpd.service" > "$work/tpd.service"
  verify="$(systemd-analyze verify "$work/tpd.service" 2>&1)"
  if [[ $? -eq 0 && -z "$(grep -F "$work/tpd.service" <<<"$verify")" ]] &&
     grep -q "^ExecStart=/usr/sbin/tpd " "$root/lib/systemd/system/tpd.service" &&
     grep -q "^ExecStop=-/usr/bin/tpctl " "$root/lib/systemd/system/tpd.service"; then
    record InstalledUnitVerifies pass "ExecStart /usr/sbin/tpd, ExecStop /usr/bin/tpctl drain"
  else
    record InstalledUnitVerifies fail "$verify"
  fi
else
  record InstalledUnitVerifies skip "systemd-analyze is not installed"
fi

if [[ -x /usr/bin/python3 ]]; then
  loaded="$(cd "$work" && PYTHONPATH="$root/usr/lib/python3/dist-packages" /usr/bin/python3 -c \
    'import tpd._capi as c; print(c.library()._name)' 2>&1)"
  if [[ "$loaded" == "$root/usr/lib/python3/dist-packages/tpd/_lib/libtpd_client.so" ]]; then
    record InstalledPythonLoadsTheInstalledLibrary pass "$loaded"
  else
    record InstalledPythonLoadsTheInstalledLibrary fail "$loaded"
  fi
else
  record InstalledPythonLoadsTheInstalledLibrary skip "/usr/bin/python3 is not installed"
fi

if command -v man >/dev/null; then
  warnings="$(for page in "$root"/usr/share/man/man*/*.gz; do
    LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null; done)"
  if [[ -z "$warnings" ]]; then
    record ManPagesRenderWithoutWarnings pass "tpd(8), tpctl(1)"
  else
    record ManPagesRenderWithoutWarnings fail "$warnings"
  fi
else
  record ManPagesRenderWithoutWarnings skip "man is not installed"
fi

if command -v lintian >/dev/null; then
  findings="$(lintian --fail-on error,warning "$deb" 2>&1)"
  lintian_rc=$?
  findings="$(grep -v "running with root privileges" <<<"$findings")"
  if [[ $lintian_rc -eq 0 && -z "$findings" ]]; then
    record LintianFindsNothingUnexplained pass "overrides: deploy/lintian-overrides"
  else
    record LintianFindsNothingUnexplained fail "$findings"
  fi
else
  record LintianFindsNothingUnexplained skip "lintian is not installed"
fi
finish
