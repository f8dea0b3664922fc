#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# start-registry.sh DIR: start docker-registry (no auth) on a free port of
# 127.0.0.1 with its storage and log in DIR; wait until /v2/ answers (at
# most 10 s) and print "PORT PID". Used by `make demo` and the benchmarks;
# the e2e tests have their own, richer tests/lib/registry.sh.
set -euo pipefail
dir=$1
mkdir -p "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$dir/registry.yml" <<EOC
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $dir/storage}, delete: {enabled: true}}
http: {addr: 127.0.0.1:$port}
EOC
docker-registry serve "$dir/registry.yml" >"$dir/registry.log" 2>&1 </dev/null &
pid=$!
for _ in $(seq 50); do
	if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/v2/')" 2>/dev/null; then
		echo "$port $pid"
		exit 0
	fi
	kill -0 "$pid" 2>/dev/null || break
	sleep 0.2
done
kill "$pid" 2>/dev/null || true
echo "start-registry.sh: docker-registry did not start:" >&2
tail -n 20 "$dir/registry.log" >&2
exit 1
