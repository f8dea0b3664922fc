# shellcheck shell=sh
# SPDX-License-Identifier: MIT
# Helpers for VM test drivers (busybox sh), installed in the guest as
# /vm/lib.sh; a driver starts with `. "$VM_LIB"`.
#
# Env set by /init: VM_RESULTS (result channel), VM_CACHE (/cache: the ext4
# cache fs, extents on), VM_PAYLOAD (/payload: the directories passed to
# mkinitramfs.sh -p).
#
#   vm_ok DESC / vm_notok DESC      one result line; the host prints
#                                   "ok - vm: DESC" / "not ok - vm: DESC"
#   vm_diag TEXT...                 indented diagnostic line(s) on the
#                                   result channel (shown by the host)
#   vm_check DESC CMD...            ok when CMD exits 0, else not ok plus
#                                   the tail of CMD's output
#   vm_registry_start [PORT]        docker-registry on 127.0.0.1:PORT (5000)
#                                   with the storage under /var/lib/registry
#                                   (mkinitramfs.sh -r preloads it); waits
#                                   up to 60 s for /v2/; sets VM_REGISTRY
#                                   (HOST:PORT) and VM_REGISTRY_PID
#   vm_mkext4 IMAGE MOUNTPOINT [MB] a fresh ext4 file system (extents, 4 KiB
#                                   blocks) in IMAGE, loop-mounted (for
#                                   tests that need a cold cachefiles cache)
#   vm_wait SECONDS CMD...          retry CMD every 0.2 s until it succeeds
#                                   or SECONDS pass
#   vm_field MNT KEY                a field of MNT's entry in ferry mount
#                                   --list --json (numbers, strings)
#   vm_cfmount CACHE IMAGE MNT [ARGS]
#                                   ferry mount --mode cachefiles of IMAGE
#                                   from the guest's registry on MNT (made),
#                                   chunk cache CACHE, bounded by 120 s
#   vm_readers ROOT LIST OUT SECS ORDER...
#                                   one reader per ORDER (sort, sort -r,
#                                   shuf) in the background: sha256sum of
#                                   LIST's files under ROOT in that order,
#                                   sorted by path, into OUT.0, OUT.1, ...
#                                   (each bounded by SECS); their pids in
#                                   VM_READERS, for wait (not a bare wait:
#                                   docker-registry is a child too)
# Busybox 1.35's `wget -T SECS` segfaults: bound wget with `timeout` instead.
VM_PASS=0
VM_FAIL=0
VM_OUT=/tmp/vm-check.log

vm_ok() {
	VM_PASS=$((VM_PASS + 1))
	echo "ok - $*" | tee "$VM_RESULTS"
}

vm_notok() {
	VM_FAIL=$((VM_FAIL + 1))
	echo "not ok - $*" | tee "$VM_RESULTS"
}

vm_diag() {
	printf '%s\n' "$@" | sed 's/^/    /' | tee "$VM_RESULTS"
}

vm_check() {
	_desc=$1
	shift
	if "$@" >"$VM_OUT" 2>&1; then
		vm_ok "$_desc"
		return 0
	else
		_rc=$?
		vm_notok "$_desc"
		vm_diag "command: $* (exit $_rc)"
		tail -n 20 "$VM_OUT" | vm_diag_stdin
		return 1
	fi
}

vm_diag_stdin() {
	sed 's/^/    /' | tee "$VM_RESULTS"
}

vm_wait() {
	_secs=$1
	shift
	_n=$((_secs * 5))
	while [ "$_n" -gt 0 ]; do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.2
		_n=$((_n - 1))
	done
	return 1
}

vm_registry_start() {
	_port=${1:-5000}
	mkdir -p /etc/docker/registry /var/lib/registry
	cat >/etc/docker/registry/config.yml <<EOF
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage:
  filesystem: {rootdirectory: /var/lib/registry}
  delete: {enabled: true}
http: {addr: 127.0.0.1:$_port, secret: ferry-vm-test}
EOF
	docker-registry serve /etc/docker/registry/config.yml >/tmp/registry.log 2>&1 &
	VM_REGISTRY_PID=$!
	export VM_REGISTRY_PID
	if vm_wait 60 timeout 10 wget -q -O /dev/null "http://127.0.0.1:$_port/v2/"; then
		VM_REGISTRY=127.0.0.1:$_port
		export VM_REGISTRY
		return 0
	fi
	echo "docker-registry did not answer on 127.0.0.1:$_port within 60 s:"
	tail -n 20 /tmp/registry.log
	return 1
}

vm_mkext4() {
	_img=$1 _mnt=$2 _mb=${3:-32}
	rm -f "$_img"
	mkfs.ext4 -q -F -T default -b 4096 -E root_owner=0:0 "$_img" "${_mb}M" &&
		mkdir -p "$_mnt" &&
		mount -t ext4 -o loop "$_img" "$_mnt"
}

vm_field() {
	ferry mount --list --json "$1" 2>/dev/null |
		sed -n "s/^ *\"$2\": *\"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -n 1
}

vm_cfmount() {
	_cache=$1 _img=$2 _mnt=$3
	shift 3
	mkdir -p "$_mnt" && timeout 120 ferry mount --mode cachefiles "$@" \
		--cache-dir "$_cache" "docker://$VM_REGISTRY/$_img" "$_mnt"
}

vm_readers() {
	_root=$1 _list=$2 _out=$3 _secs=$4
	shift 4
	VM_READERS='' _n=0
	for _order; do
		# shellcheck disable=SC2016 # the reader's sh expands them
		timeout "$_secs" sh -c 'cd "$1" && $2 "$3" | xargs sha256sum | sort -k 2' sh \
			"$_root" "$_order" "$_list" >"$_out.$_n" 2>&1 &
		VM_READERS="$VM_READERS $!"
		_n=$((_n + 1))
	done
}
