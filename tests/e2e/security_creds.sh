#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 14, finding 6: registry credentials never show in any process's
# command line or environment, which every local user can read
# (/proc/PID/cmdline, and environ of their own processes). A scanner
# reads /proc/*/cmdline and /proc/*/environ of every process every few
# milliseconds for the password while ferry works against a registry with
# htpasswd auth:
#   - it finds the password in a decoy's argv (--creds USER:PASS, as
#     before the fix), so it would see a leak;
#   - ferry convert pushes with --creds-file, ferry check pulls every
#     blob with --username --password-stdin; ferry mount in each mode (local, fuse, fanotify,
#     fuse in the foreground) with one or the other; ferryd and the
#     keepers serve reads long after: the password shows nowhere, and
#     every pull works (without credentials it fails);
#   - a credentials file group or others may read is refused, saying to
#     chmod 600 it.
E2E_TIMEOUT=${E2E_TIMEOUT:-300}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
need_cmds docker-registry htpasswd python3
need_ferryd

# A password of this run alone: other tests on the machine use the shared one.
REG_TEST_PASS=creds-$$-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
if ! reg_start basic 2>"$LOG"; then
	notok "start docker-registry (htpasswd auth)"
	diag "$LOG"
	e2e_done
fi
# Only ferry's own ways may carry the password from here on: not this
# script's exports (children would show it in environ).
export -n REG_PASS
PW=$REG_PASS
CREDS=$SCRATCH/creds
printf '%s:%s\n' "$REG_USER" "$PW" >"$CREDS"
chmod 600 "$CREDS"

# --- the scanner ---------------------------------------------------------
HITS=$SCRATCH/hits
: >"$HITS"
python3 - "$CREDS" "$HITS" "$SCRATCH/scan.stop" "$SCRATCH/scan.count" <<'EOF' &
import os, sys, time
creds, hits, stop, count = sys.argv[1:]
pw = open(creds, "rb").read().strip().split(b":", 1)[1]
me, scans = os.getpid(), 0
while not os.path.exists(stop):
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        for f in ("cmdline", "environ"):
            try:
                with open("/proc/%s/%s" % (p, f), "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            if pw in data:
                try:
                    comm = open("/proc/%s/comm" % p).read().strip()
                except OSError:
                    comm = "?"
                with open(hits, "a") as h:
                    h.write("%s %s %s\n" % (p, comm, f))
    scans += 1
    open(count + ".tmp", "w").write(str(scans))
    os.replace(count + ".tmp", count)
    time.sleep(0.005)
EOF
SCANNER=$!
scans() { cat "$SCRATCH/scan.count" 2>/dev/null || echo 0; }
scan_wait() { # one more full scan from now
	local n
	n=$(scans)
	poll 10 eval '[ "$(scans)" -gt $((n + 1)) ]'
}

# The decoy: the password in argv, as --creds USER:PASS puts it there.
sh -c 'sleep 5; exit 0' ferry-decoy "--creds=$REG_USER:$PW" &
DECOY=$!
poll 10 grep -q "^$DECOY " "$HITS"
expect "the scanner finds the password in a decoy's argv (--creds USER:PASS)" \
	grep -q "^$DECOY .* cmdline" "$HITS"
kill "$DECOY" 2>/dev/null
wait "$DECOY" 2>/dev/null
: >"$HITS"

# --- convert: push with --creds-file, pull with --password-stdin ---------
SRC=$SCRATCH/src
mkdir -p "$SRC/sub"
head -c $((3 << 20)) /dev/urandom >"$SRC/big"
echo "credentials stay out of argv" >"$SRC/sub/motd"
IMG=docker://$REG/sec/creds:1
check "convert dir: -> docker:// with --creds-file (push, auth)" \
	"$FERRY" convert -q --creds-file "$CREDS" "dir:$SRC" "$IMG" || e2e_done
check_exit "ferry check without credentials fails (the registry wants them)" 1 \
	"$FERRY" check "$IMG"
check_stdin() { printf '%s\n' "$PW" | "$FERRY" check --username "$REG_USER" --password-stdin "$IMG"; }
check "ferry check docker:// (every blob pulled) with --username --password-stdin" check_stdin

# --- a credentials file others may read is refused -------------------------
chmod 644 "$CREDS"
check_exit "a 0644 credentials file is refused (exit 1)" 1 \
	"$FERRY" convert -q --creds-file "$CREDS" "$IMG" "dir:$SCRATCH/loose"
expect "... saying to chmod 600 it" grep -q "chmod 600 $CREDS" "$LOG"
chmod 600 "$CREDS"

# --- mounts in every mode; ferryd and the keepers keep serving -------------
lazy_use creds
check "mount --mode local with --creds-file" mount_local "$IMG" "$SCRATCH/m-local" --creds-file "$CREDS" &&
	check "... reads right" cmp "$SRC/big" "$SCRATCH/m-local/big"
MF=$SCRATCH/m-fuse
check "mount --mode fuse with --creds-file" mount_lazy fuse "$IMG" "$MF" --creds-file "$CREDS"
fn_stdin() {
	mkdir -p "$1"
	printf '%s\n' "$PW" | timeout -k 5 90 "$FERRY" mount --mode fanotify --socket "$FSOCK" \
		--cache-dir "$FCACHE" --creds "$REG_USER" --password-stdin "$IMG" "$1"
}
MN=$SCRATCH/m-fanotify
check "mount --mode fanotify with --creds USER --password-stdin" fn_stdin "$MN"
# A foreground ferryd: the request reaches it through a descriptor.
MFG=$SCRATCH/m-fg
mkdir -p "$MFG"
"$FERRY" mount --mode fuse -f --socket "$SCRATCH/fg.sock" --cache-dir "$SCRATCH/fg-cache" \
	--creds-file "$CREDS" "$IMG" "$MFG" </dev/null >"$SCRATCH/fg.log" 2>&1 &
FG=$!
FERRYD_SOCKS+=("$SCRATCH/fg.sock")
expect "mount --mode fuse -f (foreground ferryd) with --creds-file" poll 30 is_mounted "$MFG"
scan_wait
# Lazy reads long after the mount still authenticate.
for m in "$MF" "$MN" "$MFG"; do
	check "lazy reads of ${m##*/} authenticate, long after the mount" \
		cmp "$SRC/big" "$m/big"
done
scan_wait
n=$(scans)
expect "the password was in no process's cmdline or environ ($n scans of every process)" \
	test ! -s "$HITS"
diag "$HITS" 10
for m in "$MF" "$MN"; do
	check "umount ${m##*/}" umount_lazy "$m"
done
check "umount m-fg" timeout -k 5 60 "$FERRY" umount --socket "$SCRATCH/fg.sock" "$MFG"
wait_gone 10 "$FG"
umount_local "$SCRATCH/m-local" >/dev/null 2>&1

touch "$SCRATCH/scan.stop"
wait "$SCANNER" 2>/dev/null
e2e_done
