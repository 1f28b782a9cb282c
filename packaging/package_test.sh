#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the sluiced .deb from a configured, built tree and checks it: contents (dpkg-deb -c),
# control fields and conffiles, that the packaged binary runs and accepts the packaged config, and
# that the unit file passes `systemd-analyze verify` where systemd-analyze is available.
#
#   packaging/package_test.sh BUILD_DIR
set -euo pipefail
build="$(cd "${1:?usage: package_test.sh BUILD_DIR}" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fail() { echo "package_test: FAIL: $*" >&2; exit 1; }

(cd "$build" && cpack -G DEB -B "$work/out" --config CPackConfig.cmake >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log"; fail "cpack failed"; }
deb="$(ls "$work"/out/sluiced_*.deb 2>/dev/null | head -n1)"
[ -n "$deb" ] || { ls -R "$work/out"; fail "no sluiced_*.deb produced"; }
echo "package_test: built $(basename "$deb")"

contents="$(dpkg-deb -c "$deb")"
echo "$contents"
for path in ./usr/bin/sluiced ./usr/bin/sluice ./usr/lib/systemd/system/sluiced.service ./etc/sluice/sluice.toml \
            ./usr/share/doc/sluiced/examples/sluice.toml ./usr/share/doc/sluiced/changelog.Debian.gz \
            ./usr/share/man/man1/sluiced.1.gz ./usr/share/man/man1/sluice.1.gz \
            ./usr/share/sluice/sluiced-dashboard.json; do
  grep -qE " ${path}\$" <<<"$contents" || fail "$path missing from the package"
done
grep -qE '^-rwxr-xr-x .* ./usr/bin/sluiced$' <<<"$contents" || fail "/usr/bin/sluiced is not 0755"
if grep -qE '\./usr/(include|lib/cmake)|\.a$' <<<"$contents"; then fail "library files leaked into the package"; fi

[ "$(dpkg-deb -f "$deb" Package)" = "sluiced" ] || fail "Package is not sluiced"
dpkg-deb -f "$deb" Version | grep -qE '^[0-9]+\.[0-9]+\.[0-9]+' || fail "no Version"
dpkg-deb -f "$deb" Depends | grep -q 'libc6' || fail "Depends lacks the shared libraries (shlibdeps)"
dpkg-deb -f "$deb" Depends | grep -q 'libsystemd0' || fail "Depends lacks libsystemd0 (sd_notify)"
dpkg-deb -f "$deb" Depends | grep -q 'init-system-helpers' || fail "Depends lacks init-system-helpers"
[ "$(dpkg-deb -f "$deb" Recommends)" = "librsvg2-bin" ] || fail "Recommends is not librsvg2-bin (--png)"
maintainer="$(dpkg-deb -f "$deb" Maintainer)"
grep -qE '^[^<>]+ <[^<>@ ]+@[^<> ]+>$' <<<"$maintainer" || fail "Maintainer is not \"Name <address>\": $maintainer"
# Maintainer scripts as dh_installsystemd writes them: enablement kept, policy-rc.d honoured.
scripts="$work/control"
mkdir -p "$scripts"
dpkg-deb -e "$deb" "$scripts"
grep -q 'deb-systemd-invoke start sluiced.service' "$scripts/postinst" || fail "postinst does not start via deb-systemd-invoke"
grep -q 'deb-systemd-helper' "$scripts/postinst" || fail "postinst does not use deb-systemd-helper"
grep -q 'deb-systemd-invoke stop sluiced.service' "$scripts/prerm" || fail "prerm does not stop via deb-systemd-invoke"
grep -q 'chmod 0640 /etc/sluice/sluice.toml' "$scripts/postinst" || fail "postinst leaves the config world-readable"
for s in postinst prerm postrm; do sh -n "$scripts/$s" || fail "$s is not valid sh"; done
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/sluice/sluice.toml ||
  fail "/etc/sluice/sluice.toml is not a conffile"

root="$work/root"
dpkg-deb -x "$deb" "$root"
"$root/usr/bin/sluiced" --version | grep -q '^sluiced ' || fail "packaged sluiced --version"
# The licence, machine-readable (DEP-5), with those of the header-only libraries compiled in.
copyright="$root/usr/share/doc/sluiced/copyright"
head -n 1 "$copyright" | grep -q '^Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' ||
  fail "no machine-readable copyright"
for licence in Apache-2.0 BSL-1.0 Expat BSD-3-clause; do
  grep -q "^License: $licence\$" "$copyright" || fail "copyright lacks $licence"
done
"$root/usr/bin/sluiced" --check-config --config "$root/etc/sluice/sluice.toml" | grep -q ': ok (1 rules, 0 overrides, backend memory)$' ||
  fail "the packaged config is not the minimal one, or invalid"
"$root/usr/bin/sluiced" --check-config --config "$root/usr/share/doc/sluiced/examples/sluice.toml" >/dev/null ||
  fail "the packaged example config is invalid"
zcat "$root/usr/share/doc/sluiced/changelog.Debian.gz" | head -n 1 | grep -q "^sluiced ($(dpkg-deb -f "$deb" Version)) " ||
  fail "the changelog does not start with this version"
zcat "$root/usr/share/doc/sluiced/changelog.Debian.gz" | grep -qF " -- $maintainer  " ||
  fail "the changelog is not signed by the Maintainer"
for page in sluiced sluice; do
  zcat "$root/usr/share/man/man1/$page.1.gz" | grep -q '^\.SH DESCRIPTION' || fail "man page $page has no DESCRIPTION"
done
zcat "$root/usr/share/man/man1/sluice.1.gz" | grep -q 'Exit codes' || fail "sluice(1) lacks the exit codes"
grep -qx 'Type=notify' "$root/usr/lib/systemd/system/sluiced.service" || fail "the unit is not Type=notify"

if command -v systemd-analyze >/dev/null 2>&1; then
  # Verify a copy whose paths point into the unpacked tree, so that ExecStart's binary exists.
  # Any output (unknown keys, bad values) counts as a failure, not only a non-zero exit.
  unit="$work/unit/sluiced.service"
  mkdir -p "$work/unit"
  sed -e "s|/usr/bin/sluiced|$root/usr/bin/sluiced|g" -e "s|/etc/sluice/|$root/etc/sluice/|g" \
    "$root/usr/lib/systemd/system/sluiced.service" >"$unit"
  if ! out="$(systemd-analyze verify "$unit" 2>&1)" || [ -n "$out" ]; then
    echo "$out"
    fail "systemd-analyze verify"
  fi
  echo "package_test: systemd-analyze verify: ok"
  # Hardened as Debian's own daemons are: an exposure of at most 1.5 (redis-server's unit: 1.2).
  if ! systemd-analyze security --offline=yes --threshold=15 "$unit" >"$work/security.txt" 2>&1; then
    cat "$work/security.txt"
    fail "systemd-analyze security: exposure above 1.5"
  fi
  grep 'Overall exposure level' "$work/security.txt"
else
  echo "package_test: systemd-analyze not available; unit not verified"
fi
echo "package_test: ok"
