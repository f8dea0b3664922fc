#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry index (issue 45): the size of the index attached to an ordinary
# image against the image's compressed layers, per --span, and the time to
# build it against `gzip -dc` of the same layer (interleaved rounds, same-run
# ratios, wall and CPU time: `ferry index` runs on four threads, gzip on
# one, so on a loaded machine the CPU ratio is the one to trust). Images: bench/lib.sh's "minbase" and "big", each one gzip layer
# in an OCI layout (umoci compresses with gzip, as registries hold them).
# Env: FERRY_BENCH_RUNS (default 5), FERRY_BENCH_SETS (default "minbase big").
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
sets=${FERRY_BENCH_SETS:-minbase big}
. "$top/bench/lib.sh"
bench_workdir index

for set in $sets; do
	dataset "$set"
	lay=$work/$set
	umoci init --layout "$lay" >/dev/null
	umoci new --image "$lay:1" >/dev/null
	umoci raw add-layer --image "$lay:1" "$data/$set.tar" >/dev/null
	layer=$(ls -S "$lay/blobs/sha256" | head -n 1)
	gz=$lay/blobs/sha256/$layer
	echo "## $set: $(stat -c %s "$gz") bytes of gzip layer, $(stat -c %s "$data/$set.tar") bytes of tar, $(nproc) CPUs"
	echo
	echo "| --span | resume points | index bytes | index / layer | bootstrap (raw) |"
	echo "|---|---|---|---|---|"
	for span in 128K 256K 384K 512K 768K 1M; do
		"$ferry" index --json --span "$span" "oci:$lay:1" >"$work/s.json"
		python3 - "$work/s.json" "$span" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("| %s | %d | %d | %.2f%% | %d |" % (sys.argv[2], s["points"], s["indexBytes"],
      100.0 * s["indexBytes"] / s["layerBytes"], s["bootstrapSize"]))
PY
	done
	echo
	python3 "$top/bench/interleave.py" --base gzip --cpu "$runs" "$top/bench/prepare.sh" \
		"gzip=gzip -dc $gz > /dev/null" \
		"ferry index=$ferry index -q oci:$lay:1" \
		"ferry index, zlib inflate=FERRY_INFLATE=zlib $ferry index -q oci:$lay:1"
	echo
done
