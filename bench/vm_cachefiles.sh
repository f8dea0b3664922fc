#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The cachefiles-mode benchmarks (`make bench`): EROFS over fscache needs a
# kernel with CACHEFILES_ONDEMAND, so they run in the QEMU/TCG guest of
# tests/vm/ (the kernel tests/vm/build-kernel.sh caches), in one guest and
# one run (bench/vm-cachefiles-driver.sh):
#   cold start: ferry mount to the end of the startup workload of
#   bench/lazy.sh, for --mode cachefiles, --mode fuse and a full pull
#   (--mode local: every blob fetched and verified first), fresh caches;
#   warm: sequential read (tar of the tree), 300 random small files,
#   metadata walk (ls -lR) of --mode cachefiles against --mode local (the
#   kernel's EROFS over the complete chunk cache) and --mode fuse.
# The image is the e2e tests' Debian fixture (tests/tools/mkoci.sh, tag
# base), converted with ferry and served by docker-registry on the guest's
# loopback. Prints markdown (medians, ratios); docs/PERFORMANCE.md records
# it. Env: FERRY_BENCH_RUNS (rounds, default 5), FERRY_FIXTURES.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$top/bench/lib.sh"
export BIN
if ! command -v qemu-system-x86_64 >/dev/null ||
	! dpkg-query -W -f='${Status}' linux-source-6.12 2>/dev/null | grep -q "install ok installed"; then
	echo "bench/vm_cachefiles.sh: skipped (needs qemu-system-x86 and linux-source-6.12: make deps)"
	exit 0
fi
work=$(mktemp -d /var/tmp/ferry-vmbench.XXXXXX)
reg_pid=
cleanup() {
	[ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

kernel=$("$top/tests/vm/build-kernel.sh")
fix=$(bash "$top/tests/tools/mkoci.sh" "${FERRY_FIXTURES:-/var/tmp/ferry-fixtures}")/debian
read -r port reg_pid < <("$top/tests/tools/start-registry.sh" "$work/reg")
"$ferry" convert -q "oci:$fix:base" "docker://127.0.0.1:$port/deb:base"
read -r total usize < <("$ferry" inspect --json "docker://127.0.0.1:$port/deb:base" | python3 -c '
import json, sys
b = json.load(sys.stdin)["blobs"]
print(sum(x["size"] for x in b), sum(x.get("uncompressedSize", 0) for x in b))')
kill "$reg_pid"
wait "$reg_pid" 2>/dev/null || true
reg_pid=
mkdir -p "$work/payload"
printf 'IMAGE=deb:base\nRUNS=%d\n' "$runs" >"$work/payload/env"
"$top/tests/vm/mkinitramfs.sh" -o "$work/initrd.gz" -d "$top/bench/vm-cachefiles-driver.sh" \
	-p "$work/payload:bench" -r "$work/reg/storage" -c 0 >/dev/null
# A guest of 3 GiB: the registry, the image's copies and the caches all
# live in its RAM.
"$top/tests/vm/run-vm.sh" -t 1800 -l "$work/vm" -m 3072 "$kernel" "$work/initrd.gz" >"$work/out" || {
	cat "$work/out" >&2
	exit 1
}
sed -n 's/^[# ]*\(disk use\|small files\)/\1/p' "$work/out"
echo "image: the Debian fixture's deb:base, $total bytes of ferry blobs ($usize uncompressed)"
echo
python3 - "$work/out" "$runs" <<'PY'
import collections, statistics, sys
t = collections.defaultdict(dict)
fetched = collections.defaultdict(list)
split = collections.defaultdict(lambda: ([], []))
for line in open(sys.argv[1]):
    w = line.split()
    if w[:1] == ["#"]:  # run-vm.sh passes the guest's diagnostics on as comments
        w = w[1:]
    if len(w) >= 5 and w[0] == "BENCH":
        t[(w[1], w[2])][int(w[3])] = float(w[4])
        if len(w) > 5 and w[5].isdigit():
            fetched[w[2]].append(int(w[5]))
        if len(w) > 7:
            split[w[2]][0].append(float(w[6]))
            split[w[2]][1].append(float(w[7]))
runs = int(sys.argv[2])
med = lambda k: statistics.median(t[k].values())
def ratios(a, b):  # per-round a/b: the same round ran both under the same load
    return sorted(t[a][r] / t[b][r] for r in t[a] if r in t[b])
def row(name, k, base):
    r = ratios(k, base) if base else []
    rs = " ".join("%.2f" % x for x in r)
    return "| %s | %.2f | %.2f–%.2f | %s |" % (name, med(k), min(t[k].values()), max(t[k].values()),
                                             "%.2f (rounds: %s)" % (statistics.median(r), rs) if r else "1")
print("### cold start: ferry mount to the end of the startup workload (%d rounds, interleaved)" % runs)
print()
print("| mode | median (s) | min–max (s) | per-round ratio to FUSE, median |")
print("|---|---:|---:|---|")
for name, k in (("cachefiles", ("cold", "cachefiles")), ("fuse", ("cold", "fuse")),
                ("full pull (--mode local)", ("cold", "local"))):
    print(row(name, k, None if k[1] == "fuse" else ("cold", "fuse")))
print()
print("medians of the parts: " + "; ".join(
    "%s: ferry mount returned %.2f s, first byte of /etc/os-release %.2f s" %
    (m, statistics.median(split[m][0]), statistics.median(split[m][1]))
    for m in ("cachefiles", "fuse", "local") if split[m][0]))
# The workload alone (from ferry mount's return to its end), per round.
rest = {m: {r: t[("cold", m)][r] - split[m][0][i] for i, r in enumerate(sorted(t[("cold", m)]))}
        for m in ("cachefiles", "fuse") if len(split[m][0]) == len(t[("cold", m)])}
if len(rest) == 2:
    r = sorted(rest["cachefiles"][k] / rest["fuse"][k] for k in rest["cachefiles"] if k in rest["fuse"])
    print()
    print("the workload alone (ferry mount returned → done): cachefiles %.2f × fuse (rounds: %s)" %
          (statistics.median(r), " ".join("%.2f" % x for x in r)))
for m in ("cachefiles", "fuse"):
    if fetched[m]:
        print()
        print("bytes fetched by the workload, %s: %d (median)" % (m, statistics.median(fetched[m])))
print()
for w, title in (("seq_read", "warm sequential read (tar cf - . | cat)"),
                 ("small", "warm: 300 random small files (cat)"),
                 ("walk", "warm metadata walk (ls -lR)")):
    print("### %s (%d rounds, interleaved)" % (title, runs))
    print()
    print("| mount | median (s) | min–max (s) | per-round ratio to local, median |")
    print("|---|---:|---:|---|")
    for name, m in (("cachefiles", "cf"), ("local (kernel EROFS)", "local"), ("fuse", "fuse")):
        print(row(name, (w, m), None if m == "local" else (w, "local")))
    print()
PY
