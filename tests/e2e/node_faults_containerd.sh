#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The node fault matrix's containerd cells (issue 44; docs/TESTING.md,
# "The node fault matrix"): kill -9 of ferry-snapshotter, ferryd and the
# mount's keeper in each order, under a running container reading a
# lazily served image, for FUSE and fanotify. containerd 1.6 from a
# scratch config, ferry-snapshotter and ferryd started by PID
# (tests/lib/containerd.sh), images pulled with ctr-remote image rpull.
#
# Each cell has an image of its own (its data not cached yet) and a
# long-lived `ctr run -d` task whose reader (busybox from a bind mount, so
# that its own binaries are not what the faults take away) reads the
# image's files by passes, logging each file's sha256 or error with its
# times. The fault proxy sends blob bodies at 512 KiB/s while the first
# pass runs: reads are in flight when the kills come, 1 s into it (the
# check asks for one). The snapshotter is restarted 1 s after its kill
# (systemd's RestartSec=1s); a ferryd killed alone is replaced by its
# keeper's successor; with ferryd and its keeper both gone, the test
# starts ferryd as ferryd.socket would.
# Every cell asserts:
#   - no wrong byte: every file the container read has the reference's
#     sha256, or its read failed (EIO; ENOTCONN on a FUSE mount that lost
#     ferryd and its keeper, ECONNABORTED for a read in flight then);
#   - no hang: every read ends within NF_READ, the first pass within
#     CN_PASS of the kill, containerd prepares a snapshot again within
#     CN_REACH of the snapshotter's restart, and so on (bounds below);
#   - ferryd answers `ferry daemon status` and `ferry mount --list`;
#   - the restarted snapshotter keeps a mount ferryd still serves, or is
#     about to serve again (no mount again: snapshotter-ferryd restarts
#     it while ferryd's successor takes the mount over; before, it
#     detached the mount and the container lost its files); containerd
#     prepares, mounts and removes a snapshot on the image's chain, starts
#     a new container on the same image that reads every file right, and
#     removes the image and its mount;
#   - after the fault clears, the running container reads every file right
#     (a second pass, its pages dropped) where a ferryd still serves its
#     mount, and ferry cache verify is clean.
# The two cells that leave nothing serving the running container's mount
# (all three killed at once) are reported as node.sh reports them: FUSE
# reads fail with ENOTCONN (asserted: never wrong bytes), fanotify reads
# holes as zeros (the kernel's fail-open; not counted).
# About 5.5 min on a loaded host (docs/TESTING.md): a watchdog of 20.
E2E_TIMEOUT=${E2E_TIMEOUT:-1200}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
. "$(dirname "$0")/../lib/node.sh"
. "$(dirname "$0")/../lib/containerd.sh"
need_ferryd
need_cmds containerd ctr runc ctr-remote go busybox

GO=$TOP/contrib/containerd/go.sh
SNAP=$SCRATCH/ferry-snapshotter
CTD=$SCRATCH/ctd
NS=ferry-nf-$$ # pulled into with ctr-remote image rpull
SNROOT=$CTD/snapshotter
CTD_NAMESPACES=("$NS")
SN_JSON="\"pullers\": {\"$NS\": \"rpull\"}"
mkdir -p "$CTD"

# Bounds (seconds) beyond node.sh's NF_*: the first pass ends after the
# kill; containerd reaches a restarted snapshotter (its gRPC redial
# backoff, docs/containerd.md); a pull, a container's start and reads, an
# image's removal.
CN_PASS=60
CN_REACH=30
CN_CTR=60

eval "_ctd_prev_exit=$(trap -p EXIT | sed -e 's/^trap -- //' -e 's/ EXIT$//')"
trap 'ctd_stop_all; '"$_ctd_prev_exit" EXIT

check "build ferry-snapshotter (offline, GOPATH mode)" "$GO" build -o "$SNAP" || { e2e_done; exit 1; }

ctr_() { ctr_ns "$NS" "$@"; }

# ------------------------------------------------------------ the images
# One image per cell: busybox (sh, sha256sum for a new container) and
# data/: big.bin (4 MiB), mid.bin (1 MiB), 16 small files, random bytes
# of the cell's own; img/NAME.files lists them, img/NAME.sums their
# sha256.
cell_image() { # NAME
	local d=$SCRATCH/img/$1 i
	mkdir -p "$d/bin" "$d/data/small"
	cp /bin/busybox "$d/bin/busybox"
	for i in sh sha256sum cat sleep; do
		ln -s busybox "$d/bin/$i"
	done
	head -c $((4 << 20)) /dev/urandom >"$d/data/big.bin"
	head -c $((1 << 20)) /dev/urandom >"$d/data/mid.bin"
	for i in $(seq 16); do
		head -c $((i * 4099)) /dev/urandom >"$d/data/small/f$i"
	done
	(cd "$d/data" && find . -type f | sed 's|^\./||' | sort >"$SCRATCH/img/$1.files" &&
		xargs sha256sum <"$SCRATCH/img/$1.files" >"$SCRATCH/img/$1.sums")
	"$FERRY" convert -q "dir:$d" "docker://$REG/ferry/$1:1"
}

reg_start anon || { notok "docker-registry"; e2e_done; exit 1; }
fp_start || { notok "faultproxy"; e2e_done; exit 1; }
# CN_MODES and CN_ORDERS choose cells (all by default).
MODES=${CN_MODES:-fuse fanotify}
ORDERS=${CN_ORDERS:-snapshotter ferryd keeper snapshotter-ferryd ferryd-snapshotter all}
for mode in $MODES; do
	for order in $ORDERS; do
		cell_image "$mode-$order" || { notok "the image of cell $mode-$order"; e2e_done; exit 1; }
	done
done
ok "the cells' images converted to the registry"

# ------------------------------------------------------------ the reader
# The running container's reader: pass N starts when /out/go.N exists and
# logs "N T0 T1 FILE SHA256|ERR:message" per file of /out/files (T0, T1:
# /proc/uptime), then "N end". Only builtins and /out's busybox.
cat >"$SCRATCH/reader.sh" <<'EOF'
n=1
while :; do
	until [ -e /out/go.$n ]; do
		[ -e /out/stop ] && exit 0
		/out/busybox usleep 100000
	done
	echo "$n start" >>/out/log
	while read -r f; do
		read -r t0 _ </proc/uptime
		if s=$(/out/busybox sha256sum "/data/$f" 2>&1); then
			s=${s%% *}
		else
			s="ERR:${s##*: }"
		fi
		read -r t1 _ </proc/uptime
		echo "$n $t0 $t1 $f $s" >>/out/log
	done </out/files
	echo "$n end" >>/out/log
	n=$((n + 1))
done
EOF

# The log's pass N has ended.
pass_ended() { grep -qx "$2 end" "$1/log"; } # OUT N

# One check: pass N of OUT's log read only right bytes or an allowed
# error (EIO; with errors, ENOTCONN and ECONNABORTED too), every read
# within NF_READ. With WHOLE,
# every file read right.
pass_right() { # DESC OUT N SUMS whole|errors [KILL]
	python3 - "$@" <<'EOF'
import sys
desc, out, n, sums, want = sys.argv[1:6]
kill = float(sys.argv[6]) if len(sys.argv) > 6 else None
flight = []
ref = {}
for line in open(sums):
    d, f = line.split(None, 1)
    ref[f.strip()] = d
# A FUSE mount whose /dev/fuse closed: the kernel ends the requests in
# flight with ECONNABORTED (fuse_abort_conn), later ones get ENOTCONN.
allowed = ["Input/output error"] + (["Transport endpoint is not connected",
                                     "Software caused connection abort"] if want == "errors" else [])
wrong, errs, slow, seen = [], [], [], set()
for line in open(out + "/log"):
    w = line.split(None, 4)
    if len(w) < 5 or w[0] != n:
        continue
    t0, t1, f, s = float(w[1]), float(w[2]), w[3], w[4].strip()
    seen.add(f)
    if kill is not None and t0 <= kill <= t1:
        flight.append(f)
    if t1 - t0 > 30:
        slow.append("%s %.1f s" % (f, t1 - t0))
    if s.startswith("ERR:"):
        errs.append("%s (%s)" % (f, s[4:]))
        if want == "whole" or s[4:] not in allowed:
            wrong.append("%s %s" % (f, s))
    elif s != ref.get(f):
        wrong.append("%s read as %s, not %s" % (f, s[:12], ref.get(f, "?")[:12]))
missing = sorted(set(ref) - seen)
ok = not wrong and not slow and not missing and (kill is None or flight)
what = "every file right" if want == "whole" else "right bytes or an error"
problems = wrong + ["slow: " + s for s in slow] + ["never read: " + m for m in missing]
# The first problem in the check's own line: CI's summary shows only it.
print("%s - %s: %s, every read < 30 s (%d files, %d errors%s)%s" %
      ("ok" if ok else "not ok", desc, what, len(seen), len(errs),
       "" if kill is None else ", in flight at the kill: " + (" ".join(flight) or "none"),
       "; " + problems[0] if problems else ""))
for x in problems[:10]:
    print("    " + x)
if errs and ok:
    print("    errors: " + ", ".join(errs[:6]))
sys.exit(0 if ok else 1)
EOF
}
# pass_right as a check of the test's counts.
pass_check() { # DESC OUT N SUMS whole|errors
	local out rc
	out=$(pass_right "$@")
	rc=$?
	echo "$out"
	if [ "$rc" = 0 ]; then
		E2E_PASS=$((E2E_PASS + 1))
	else
		E2E_FAIL=$((E2E_FAIL + 1))
	fi
	return "$rc"
}

# ------------------------------------------------------------ the daemons

# The mount point ferryd serves IMAGE at (ferry mount --list).
image_mount() { # IMAGE
	timeout -k 2 "$NF_LIST" "$FERRY" mount --list --json "${FERRYD_SOCK_OPT[@]}" </dev/null |
		python3 -c '
import json, sys
for m in json.load(sys.stdin)["mounts"]:
    if m["image"].startswith(sys.argv[1]) and m.get("state") == "mounted":
        print(m["mountpoint"])
        sys.exit(0)
sys.exit(1)' "$1"
}
# The mount's id in /proc/self/mountinfo: a mount made again has another.
mount_id() { awk -v m="$1" '$5 == m { print $1 }' /proc/self/mountinfo; } # MNT

# One check: ferryd answers ferry daemon status and ferry mount --list
# within NF_LIST.
status_lists() { # DESC
	check "$1: ferryd answers ferry daemon status (< $NF_LIST s)" \
		timeout -k 1 "$NF_LIST" "$FERRY" daemon status "${FERRYD_SOCK_OPT[@]}"
	lists "$1"
}

# The snapshotter as systemd restarts it, SN_WAIT s after its kill
# (RestartSec=1s); one check that
# containerd prepares a snapshot again within CN_REACH.
SN_WAIT=1
sn_restart() { # DESC MODE
	local t0 ms
	sleep "$SN_WAIT"
	t0=$(now_ms)
	ctd_start_snapshotter "$2" >"$LOG" 2>&1
	ms=$(($(now_ms) - t0))
	expect_sh "$1: the snapshotter restarts, containerd prepares and removes a snapshot ($ms ms, < $CN_REACH s)" \
		'[ "$ms" -lt $((CN_REACH * 1000)) ] && kill -0 "$SN_PID"' || { diag "$LOG" 5; ctd_diagnose | sed 's/^/    /'; }
}
# ferryd.socket starts ferryd at a connection unless one runs (a keeper
# may start one before its own kill lands).
ferryd_again() {
	timeout -k 1 "$NF_LIST" "$FERRY" daemon status "${FERRYD_SOCK_OPT[@]}" >/dev/null 2>&1 ||
		ctd_start_ferryd
}
sn_kill() { kill -KILL "$SN_PID" && wait "$SN_PID" 2>/dev/null; true; }
sn_log() { grep -c -- "$1" "$CTD/snapshotter.log"; } # PATTERN

# ------------------------------------------------------------ a cell
# kill -9 in ORDER (snapshotter, ferryd, keeper, snapshotter-ferryd and
# ferryd-snapshotter 0.5 s apart, all: the three at once) under a running
# container of the cell's image.
cell() { # MODE ORDER
	local mode=$1 order=$2 c="kill -9 $2 under a container, $1" name=$1-$2
	local img=$PROXY/ferry/$1-$2:1 out=$SCRATCH/out-$1-$2 id=run-$1-$2
	local mnt dpid kpid t0 up mid restored again served=1 restart_s again_s
	mkdir -p "$out"
	cp /bin/busybox "$SCRATCH/reader.sh" "$out/"
	cp "$SCRATCH/img/$name.files" "$out/files"
	check "$c: ctr-remote image rpull" bounded "$CN_CTR" ctr-remote --address "$CTD/containerd.sock" \
		-n "$NS" image rpull --plain-http --snapshotter ferry "$img" || return
	if ! mnt=$(image_mount "docker://$img"); then
		notok "$c: ferryd lists the image's mount"
		return
	fi
	mid=$(mount_id "$mnt")
	dpid=$(daemon_pids | head -n 1)
	kpid=$(keeper_pid "$mnt")
	if [ -z "$dpid" ] || ! is_keeper "${kpid:-none}"; then
		notok "$c: find ferryd (${dpid:-none}) and the keeper (${kpid:-none})"
		return
	fi
	touch "$out/go.1"
	fp_set trickle count=-1 "method=^GET$" path=/blobs/ rate=524288
	if ! check "$c: a container reads the image" bounded "$CN_CTR" ctr_ run -d --snapshotter ferry \
		--mount "type=bind,src=$out,dst=/out,options=rbind:rw" "$img" "$id" /out/busybox sh /out/reader.sh ||
		! poll 10 grep -q "^1 start" "$out/log"; then
		fp_set none
		return
	fi
	sleep 1
	restored=$(sn_log "ferry: restored docker://$PROXY/ferry/$name@")
	again=$(sn_log "mounting docker://$PROXY/ferry/$name@.* again")
	t0=$SECONDS
	read -r up _ </proc/uptime
	# The snapshotter restarts 1 s after its kill (systemd's RestartSec):
	# after ferryd's kill 0.5 s later, or right when ferryd is killed 1 s
	# later (snapshotter-ferryd), while its keeper starts a successor.
	case $order in
	snapshotter) sn_kill && sn_restart "$c" "$mode" ;;
	ferryd) kill -KILL "$dpid" ;;
	keeper) kill -KILL "$kpid" ;;
	snapshotter-ferryd) sn_kill && sleep 1 && kill -KILL "$dpid" && SN_WAIT=0 sn_restart "$c" "$mode" ;;
	ferryd-snapshotter) kill -KILL "$dpid" && sleep 0.5 && sn_kill && sn_restart "$c" "$mode" ;;
	all)
		# ferryd.socket starts ferryd at the restarted snapshotter's
		# first connection.
		# shellcheck disable=SC2046
		kill -KILL $(daemon_pids) $(keeper_pids) "$SN_PID" && wait "$SN_PID" 2>/dev/null
		sleep 1
		check "$c: a ferryd serves its socket again" ferryd_again
		restart_s=$(date +%s)
		SN_WAIT=0 sn_restart "$c" "$mode"
		;;
	esac
	check "$c: the container's first pass ends (< $CN_PASS s after the kill)" \
		poll $((CN_PASS - (SECONDS - t0))) pass_ended "$out" 1
	fp_set none
	if [ "$order" = all ] && [ "$mode" = fanotify ]; then
		served=
		pass_right "$c: the container's reads (KNOWN: fail-open, not counted)" \
			"$out" 1 "$SCRATCH/img/$name.sums" errors "$up" | sed 's/^\(not \)\?ok - /    # /'
	else
		[ "$order" = all ] && served=
		pass_check "$c: the container's first pass" "$out" 1 "$SCRATCH/img/$name.sums" errors "$up"
	fi
	case $order in
	ferryd* | snapshotter-ferryd)
		check "$c: a successor serves the mount (< $NF_TAKEOVER s)" \
			poll "$NF_TAKEOVER" successor_serves "$dpid" "$mnt" ;;
	keeper)
		check "$c: a new keeper holds the mount (< $NF_TAKEOVER s)" \
			poll "$NF_TAKEOVER" eval '[ "$(keeper_pid "$mnt")" != "$kpid" ] && successor_keeper "$mnt"' ;;
	esac
	status_lists "$c"
	case $order in
	snapshotter* | *snapshotter)
		expect "$c: the restarted snapshotter finds the container's mount live" \
			poll 30 eval '[ "$(sn_log "ferry: restored docker://$PROXY/ferry/$name@")" -gt "$restored" ]'
		;;
	all)
		expect "$c: the restarted snapshotter mounts the image again" \
			poll 30 eval '[ "$(sn_log "mounting docker://$PROXY/ferry/$name@.* again")" -gt "$again" ]'
		# A FUSE mount whose connection ended with its keeper is mounted
		# again at once; fanotify's kernel mount lives on, waited for
		# (takeoverWait, 10 s) in case a successor takes it over.
		again_s=$(date -d "$(grep "mounting docker://$PROXY/ferry/$name@.* again" "$CTD/snapshotter.log" |
			tail -n 1 | sed -n 's/^time="\([^"]*\)".*/\1/p')" +%s 2>/dev/null)
		if [ "$mode" = fuse ]; then
			expect_sh "$c: ... within 8 s of its restart, its FUSE connection ended ($((${again_s:-0} - restart_s)) s)" \
				'[ -n "$again_s" ] && [ $((again_s - restart_s)) -lt 8 ]'
		fi
		;;
	esac
	# The container's mount, kept where a ferryd serves it.
	if [ -n "$served" ]; then
		expect_sh "$c: the container's mount is the one it had (mount id $mid)" \
			'[ "$(mount_id "$mnt")" = "$mid" ] && [ "$(image_mount "docker://$img")" = "$mnt" ] &&
			[ "$(sn_log "mounting docker://$PROXY/ferry/$name@.* again")" = "$again" ]'
	fi
	# After the fault: a second pass in the running container, its pages
	# dropped.
	drop_pages $(sed "s|^|$mnt/data/|" "$out/files") 2>/dev/null
	touch "$out/go.2"
	check "$c, after: the container's second pass ends (< $CN_PASS s)" poll "$CN_PASS" pass_ended "$out" 2
	if [ -n "$served" ]; then
		pass_check "$c, after: the container's second pass" "$out" 2 "$SCRATCH/img/$name.sums" whole
	elif [ "$mode" = fuse ]; then
		pass_check "$c, after: the container's dead mount" "$out" 2 "$SCRATCH/img/$name.sums" errors
	else
		pass_right "$c, after: the container's mount (KNOWN: fail-open, not counted)" \
			"$out" 2 "$SCRATCH/img/$name.sums" errors | sed 's/^\(not \)\?ok - /    # /'
	fi
	# containerd prepares, mounts and removes snapshots on the image, and
	# a new container reads it right.
	new_container "$c, after" "$img" "$name" "$id"
	touch "$out/stop"
	ctr_ tasks kill -s KILL "$id" >/dev/null 2>&1
	poll 10 eval '! ctr_ tasks ls -q | grep -qx "$id"'
	check "$c, after: remove the container" ctr_ containers rm "$id"
	check "$c, after: ctr image rm --sync (< $CN_CTR s)" bounded "$CN_CTR" ctr_ images rm --sync "$img"
	expect "$c, after: ... leaves no mount of the image" eval '! image_mount "docker://$img" &&
		! ctd_ferry_mounts | grep -q .'
	verify_clean "$c, after"
}

# One check: containerd prepares a snapshot on the image's top chain ID
# (the snapshotter checks its mount), gives its mounts and removes it;
# one: a new container on IMAGE reads every file right.
new_container() { # DESC IMAGE NAME ID
	local top key=nf-view-$RANDOM out want
	# The running container's snapshot (its key is its ID) is on the
	# image's top chain ID.
	top=$(ctr_ snapshots --snapshotter ferry ls | awk -v k="$4" '$1 == k { print $2 }')
	check "$1: containerd prepares, mounts and removes a snapshot on the image's chain (< $CN_CTR s)" \
		bounded "$CN_CTR" bash -c 'c() { ctr --address "$1" -n "$2" snapshots --snapshotter ferry "${@:3}" </dev/null; }
			c "$1" "$2" prepare "$3" "$4" >/dev/null && c "$1" "$2" mounts /mnt "$3" | grep -q overlay &&
			c "$1" "$2" rm "$3"' _ "$CTD/containerd.sock" "$NS" "$key" "$top"
	want=$(cat "$SCRATCH/img/$3.sums")
	out=$(bounded "$CN_CTR" ctr_ run --rm --snapshotter ferry "$2" "new-$3" \
		sh -c "cd /data && sha256sum $(tr '\n' ' ' <"$SCRATCH/img/$3.files")" 2>&1)
	expect "$1: a new container on the same image reads every file right (< $CN_CTR s)" \
		[ "$out" = "$want" ] || { echo "$out" | head -5 | sed 's/^/    /'; ctd_diagnose | sed 's/^/    /'; }
}

# ------------------------------------------------------------ the matrix
T0=$SECONDS
for mode in $MODES; do
	lazy_use "ctd-$mode"
	check "ferryd starts ($mode)" ctd_start_ferryd || break
	check "ferry-snapshotter starts ($mode)" ctd_start_snapshotter "$mode" || break
	if [ -z "$CTD_PID" ]; then
		check "containerd 1.6 starts from a scratch config" ctd_start_containerd || break
	fi
	for order in $ORDERS; do
		t=$SECONDS
		cell "$mode" "$order"
		echo "# cell $mode $order took $((SECONDS - t)) s"
	done
	ctd_stop "$SN_PID"
	wait "$SN_PID" 2>/dev/null
	ferryd_stop $(daemon_pids)
done
echo "# the matrix took $((SECONDS - T0)) s"
e2e_done
