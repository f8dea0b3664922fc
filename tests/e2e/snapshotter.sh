#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-snapshotter (contrib/containerd): it builds offline in GOPATH mode
# from Debian's Go sources, passes go vet, and its Go tests pass:
# containerd's snapshotter conformance suite (snapshots/testsuite) through
# containerd's gRPC proxy client, the chain-ID and puller rules, the
# configuration (fetch.creds refused, auths), and the remote-layer protocol
# against a fake ferryd (blob layers ask nothing, a bootstrap claiming
# another chain is refused and nothing committed, fallback, a restart in a
# new process with the registry down, Remove unmounts and releases; a
# restart while ferryd is being replaced leaves the kernel's mount alone).
. "$(dirname "$0")/../lib/common.sh"
need_root
need_cmds go

GO=$TOP/contrib/containerd/go.sh
check "go vet" "$GO" vet
if check "go test -c (offline, GOPATH mode)" "$GO" test -c -o "$SCRATCH/snapshotter.test"; then
	(cd "$SCRATCH" && ./snapshotter.test -test.v -test.timeout 5m) >"$LOG" 2>&1
	rc=$?
	passed=$(grep -cE '^\s*--- PASS' "$LOG")
	expect "Go tests pass (exit $rc)" [ "$rc" -eq 0 ]
	failed=$(grep -cE '^\s*--- FAIL' "$LOG")
	expect "... $passed passed (conformance suite included), $failed failed" \
		test "$passed" -ge 20 -a "$failed" -eq 0
	[ "$rc" -eq 0 ] || grep -E -- '--- FAIL|_test.go' "$LOG" | head -20 | sed 's/^/    /'
	expect "the suite's Prepare/Commit/View/Remove/Walk/Update tests are among them" \
		grep -qE -- '--- PASS: TestConformance/(Basic|Walk|Update|Remove)' "$LOG"
fi
e2e_done
