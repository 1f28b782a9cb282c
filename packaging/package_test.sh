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
for path in ./usr/bin/sluiced ./usr/lib/systemd/system/sluiced.service ./etc/sluice/sluice.toml \
            ./usr/share/doc/sluiced/examples/sluice.toml; do
  grep -qE " ${path}\$" <<<"$contents" || fail "$path missing from the package"
done
grep -qE '^-rwxr-xr-x .* ./usr/bin/sluiced$' <<<"$contents" || fail "/usr/bin/sluiced is not 0755"
if grep -qE '\./usr/(include|lib/cmake)|\.a$' <<<"$contents"; then fail "library files leaked into the package"; fi

[ "$(dpkg-deb -f "$deb" Package)" = "sluiced" ] || fail "Package is not sluiced"
dpkg-deb -f "$deb" Version | grep -qE '^[0-9]+\.[0-9]+\.[0-9]+' || fail "no Version"
dpkg-deb -f "$deb" Depends | grep -q 'libc6' || fail "Depends lacks the shared libraries (shlibdeps)"
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
"$root/usr/bin/sluiced" --check-config --config "$root/etc/sluice/sluice.toml" || fail "packaged config invalid"

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
