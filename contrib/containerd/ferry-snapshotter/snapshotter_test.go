// SPDX-License-Identifier: MIT

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/snapshots"
	"github.com/containerd/containerd/snapshots/proxy"
	"github.com/containerd/containerd/snapshots/testsuite"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	"google.golang.org/grpc"
)

// With FERRY_TEST_SERVE=CONFIG the test binary is a ferry-snapshotter
// daemon until SIGTERM: a restart is a new process, as in production.
func TestMain(m *testing.M) {
	if path := os.Getenv("FERRY_TEST_SERVE"); path != "" {
		c, err := loadConfig(path)
		if err == nil {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
			err = serve(ctx, c, false)
			stop()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// daemon runs @c in a child process; stop sends SIGTERM and waits.
func daemon(t *testing.T, c config) (snapshots.Snapshotter, func()) {
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(filepath.Dir(c.Root), "config.json")
	if err := os.WriteFile(path, data, 0600); err != nil {
		t.Fatal(err)
	}
	os.Remove(c.Address)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "FERRY_TEST_SERVE="+path)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000 && !listening(c.Address); i++ { // up to 10 s
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.Dial("unix://"+c.Address, grpc.WithInsecure())
	if err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			conn.Close()
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		})
	}
	t.Cleanup(stop)
	return proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "ferry"), stop
}

// listening: a connection to @path succeeds (the socket file exists
// between bind and listen already).
func listening(path string) bool {
	conn, err := net.Dial("unix", path)
	if err == nil {
		conn.Close()
	}
	return err == nil
}

func testConfig(root, ferryd string) config {
	c := defaults()
	c.Root = filepath.Join(root, "state")
	c.Address = filepath.Join(root, "snapshotter.sock")
	c.FerrydSocket = ferryd
	c.CacheDir = filepath.Join(root, "cache")
	c.Pullers = map[string]string{"k8s.io": pullerCRI, "default": pullerRpull}
	c.HostsDir = filepath.Join(root, "certs.d") // the host's own is not the test's
	return c
}

// proxied starts ferry-snapshotter on @root and returns containerd's proxy
// client of it, as containerd's [proxy_plugins] would use it.
func proxied(ctx context.Context, root string, ferryd string) (snapshots.Snapshotter, func() error, error) {
	return proxiedConfig(ctx, testConfig(root, ferryd), true)
}

// proxiedConfig: with @closeAtEnd false the snapshots stay, as when the
// daemon stops, for a restart.
func proxiedConfig(ctx context.Context, c config, closeAtEnd bool) (snapshots.Snapshotter, func() error, error) {
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	os.Remove(c.Address)
	go func() { done <- serve(sctx, c, closeAtEnd) }()
	for i := 0; i < 500 && !listening(c.Address); i++ { // up to 5 s
		select {
		case err := <-done:
			cancel()
			return nil, nil, err
		default:
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.Dial("unix://"+c.Address, grpc.WithInsecure())
	if err != nil {
		cancel()
		return nil, nil, err
	}
	sn := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "ferry")
	return sn, func() error {
		conn.Close()
		cancel()
		return <-done
	}, nil
}

// containerd's snapshotter conformance suite, through the gRPC proxy.
func TestConformance(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the suite mounts overlays: run as root")
	}
	testsuite.SnapshotterSuite(t, "ferry", func(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
		return proxied(ctx, root, filepath.Join(root, "no-ferryd.sock"))
	})
}

// The chain ID of a ferry image's layers, as containerd computes it from
// the config's diff_ids (docs/FORMAT.md 1a).
func ferryChain(blobs []digest.Digest, bootstrap digest.Digest) []digest.Digest {
	ids := make([]digest.Digest, 0, len(blobs)+1)
	for _, b := range blobs {
		ids = append(ids, ferryDiffID(blobDiffIDPrefix, b))
	}
	if bootstrap != "" {
		ids = append(ids, ferryDiffID(bootDiffIDPrefix, bootstrap))
	}
	return identity.ChainIDs(ids)
}

func TestChainIDs(t *testing.T) {
	l := digest.FromString("blob")
	if got, want := ferryDiffID(blobDiffIDPrefix, l), digest.FromString("dev.ferry.blob "+l.String()); got != want {
		t.Fatalf("ferryDiffID = %s, want %s", got, want)
	}
	a, b, c := digest.FromString("a"), digest.FromString("b"), digest.FromString("c")
	chain := identity.ChainIDs([]digest.Digest{a, b, c})
	if chainNext("", a) != chain[0] || chainNext(chain[0], b) != chain[1] || chainNext(chain[1], c) != chain[2] {
		t.Fatal("chainNext is not containerd's chain ID")
	}
	for parent, want := range map[string]digest.Digest{
		"": "", a.String(): a, "k8s.io/12/" + b.String(): b,
	} {
		if got, err := parentChain(parent); err != nil || got != want {
			t.Errorf("parentChain(%q) = %s, %v; want %s", parent, got, err, want)
		}
	}
	if _, err := parentChain("k8s.io/12/extract-1 x"); err == nil {
		t.Error("parentChain accepted a name that is no chain ID")
	}
	for key, want := range map[string]string{
		"k8s.io/3/extract-1 sha256:ab": "k8s.io", "default/17/x/y": "default",
		"extract-1": "", "k8s.io/x/y": "", "/3/y": "",
	} {
		got, err := keyNamespace(key)
		if got != want || (err != nil) != (want == "") {
			t.Errorf("keyNamespace(%q) = %q, %v; want %q", key, got, err, want)
		}
	}
}

// admit: the puller the namespace names, its labels only, and a blob's
// chain its own.
func TestAdmit(t *testing.T) {
	pullers := map[string]string{"k8s.io": pullerCRI, "default": pullerRpull}
	blob, other := digest.FromString("blob"), digest.FromString("victim layer")
	m := digest.FromString("manifest").String()
	chain := ferryChain([]digest.Digest{blob}, "")
	cri := func(target digest.Digest, kind string, extra ...string) map[string]string {
		l := map[string]string{labelTarget: target.String(), kind: "true",
			labelCRIRef: "127.0.0.1:5001/app:1", labelCRIManifest: m, labelCRILayer: blob.String()}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	rpull := map[string]string{labelTarget: chain[0].String(), labelBlob: "true",
		labelStargzRef: "127.0.0.1:5001/app:1", labelStargzLayer: blob.String()}
	for _, c := range []struct {
		name, key, parent string
		labels            map[string]string
		err               string // substring; "" = admitted
	}{
		{"CRI blob", "k8s.io/1/x", "", cri(chain[0], labelBlob), ""},
		{"rpull blob", "default/1/x", "", rpull, ""},
		{"no puller for the namespace", "other/1/x", "", cri(chain[0], labelBlob), "has no puller"},
		{"not containerd's key", "x", "", cri(chain[0], labelBlob), "NAMESPACE/N/KEY"},
		{"CRI labels in an rpull namespace", "default/1/x", "", cri(chain[0], labelBlob), labelCRIRef},
		{"stargz labels in a CRI namespace", "k8s.io/1/x", "",
			cri(chain[0], labelBlob, labelStargzRef, "127.0.0.1:5001/private:1"), labelStargzRef},
		{"a victim's diff_id claimed", "k8s.io/1/x", "", cri(other, labelBlob), "not that of data blob"},
		{"the blob's own digest as diff_id (format 2)", "k8s.io/1/x", "", cri(blob, labelBlob), "format 3"},
		{"over another parent", "k8s.io/1/x", other.String(), cri(chain[0], labelBlob), "not that of data blob"},
		{"no manifest digest", "k8s.io/1/x", "", cri(chain[0], labelBootstrap, labelCRIManifest, ""), labelCRIManifest},
	} {
		a, err := admit(pullers, c.key, c.parent, c.labels)
		if c.err == "" && err != nil {
			t.Errorf("%s: refused: %v", c.name, err)
		} else if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: got %v, want an error naming %q", c.name, err, c.err)
		} else if err == nil && (a.kind != kindBlob || a.layer != blob) {
			t.Errorf("%s: admitted as %+v", c.name, a)
		}
	}
	a, err := admit(pullers, "k8s.io/2/y", chain[0].String(), cri(digest.FromString("t"), labelBootstrap))
	if err != nil || a.image != "docker://127.0.0.1:5001/app@"+m || a.pin != m {
		t.Errorf("CRI bootstrap: %+v, %v", a, err)
	}
	rpull[labelBootstrap], rpull[labelBlob] = "true", ""
	a, err = admit(pullers, "default/2/y", chain[0].String(), rpull)
	if err != nil || a.image != "docker://127.0.0.1:5001/app:1" || a.pin != "" {
		t.Errorf("rpull bootstrap: %+v, %v", a, err)
	}
	boot := digest.FromString("bootstrap")
	a.target = ferryChain([]digest.Digest{blob}, boot)[1]
	if err := a.checkBootstrap(m, boot.String()); err != nil {
		t.Errorf("the bootstrap of its chain: %v", err)
	}
	if err := a.checkBootstrap(m, digest.FromString("another").String()); err == nil ||
		!strings.Contains(err.Error(), "containerd asked for") {
		t.Errorf("another bootstrap: %v", err)
	}
}

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	load := func(text string) (config, error) {
		p := filepath.Join(dir, "c.json")
		if err := os.WriteFile(p, []byte(text), 0600); err != nil {
			t.Fatal(err)
		}
		return loadConfig(p)
	}
	if _, err := load(`{"fetch": {"creds": "u:p"}}`); err == nil || !strings.Contains(err.Error(), `"auths"`) {
		t.Errorf("a global fetch.creds: %v, want a refusal naming auths", err)
	}
	if _, err := load(`{"pullers": {"k8s.io": "ctr"}}`); err == nil {
		t.Error("an unknown puller was accepted")
	}
	if _, err := load(`{"auths": {"r.example": {"auth": "!!"}}}`); err == nil {
		t.Error("an auth that is not base64 was accepted")
	}
	if _, err := load(`{"logLevel": "loud"}`); err == nil {
		t.Error("an unknown log level was accepted")
	}
	c, err := load(`{"root": "` + dir + `", "pullers": {"default": "rpull"},
		"auths": {"127.0.0.1:5000": {"username": "u", "password": "p"}}, "fetch": {"retries": 2}}`)
	if err != nil {
		t.Fatal(err)
	}
	if c.Pullers["k8s.io"] != "" || c.Pullers["default"] != pullerRpull {
		t.Errorf("pullers %v: the config's replace the defaults", c.Pullers)
	}
	fetch, err := c.fetchOptions()
	var opts map[string]interface{}
	if err != nil || json.Unmarshal(fetch, &opts) != nil || opts["authfile"] != c.authFile() ||
		opts["retries"] != 2.0 {
		t.Fatalf("fetch options %s, %v", fetch, err)
	}
	if err := c.writeAuths(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(c.authFile())
	data, _ := os.ReadFile(c.authFile())
	if err != nil || st.Mode().Perm() != 0600 ||
		string(data) != `{"auths":{"127.0.0.1:5000":{"username":"u","password":"p"}}}` {
		t.Errorf("credentials file %v %s, %v", st, data, err)
	}
}

// fakeFerryd answers like ferryd and sends every request to reqs: a mount
// names the digests @images gives for its image (and fails for others), a
// probe answers what @probes has for its image (else: no ferry index), a
// umount finds nothing there, a list shows the mounts @listed (serve).
type fakeFerryd struct {
	mu     sync.Mutex
	images map[string][2]string // image -> manifest, bootstrap digest
	probes map[string]map[string]interface{}
	listed []interface{}
	reqs   chan map[string]interface{}
}

func startFakeFerryd(t *testing.T, path string) *fakeFerryd {
	f := &fakeFerryd{images: map[string][2]string{}, probes: map[string]map[string]interface{}{},
		reqs: make(chan map[string]interface{}, 64)}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			var req map[string]interface{}
			line, _ := bufio.NewReader(conn).ReadBytes('\n')
			if json.Unmarshal(line, &req) == nil {
				f.reqs <- req
			}
			var ans interface{} = map[string]interface{}{"ok": true, "pid": 1}
			switch req["op"] {
			case "umount":
				ans = map[string]interface{}{"ok": false, "error": "not ferryd's", "errno": 2}
			case "list":
				f.mu.Lock()
				ans = map[string]interface{}{"ok": true, "pid": 1, "mounts": append([]interface{}{}, f.listed...)}
				f.mu.Unlock()
			case "mount":
				f.mu.Lock()
				d, ok := f.images[req["image"].(string)]
				f.mu.Unlock()
				if ok {
					ans = map[string]interface{}{"ok": true, "pid": 1, "imageDigest": d[0], "bootstrapDigest": d[1]}
				} else {
					ans = map[string]interface{}{"ok": false, "error": "registry down", "errno": 111}
				}
			case "probe":
				f.mu.Lock()
				p, ok := f.probes[req["image"].(string)]
				f.mu.Unlock()
				if ok {
					ans = p
				} else {
					ans = map[string]interface{}{"ok": false, "error": "no ferry index", "errno": int(syscall.EMEDIUMTYPE)}
				}
			}
			out, _ := json.Marshal(ans)
			conn.Write(append(out, '\n'))
			conn.Close()
		}
	}()
	return f
}

func (f *fakeFerryd) set(image, manifest, bootstrap string) {
	f.mu.Lock()
	if manifest == "" {
		delete(f.images, image)
	} else {
		f.images[image] = [2]string{manifest, bootstrap}
	}
	f.mu.Unlock()
}

// serve: list @image mounted at @mountpoint from now on.
func (f *fakeFerryd) serve(mountpoint, image string) {
	f.mu.Lock()
	f.listed = append(f.listed, map[string]interface{}{"mountpoint": mountpoint, "image": image, "state": "mounted"})
	f.mu.Unlock()
}

func (f *fakeFerryd) setProbe(image string, answer map[string]interface{}) {
	f.mu.Lock()
	f.probes[image] = answer
	f.mu.Unlock()
}

// next: the next request of @op (others skipped), or nil.
func (f *fakeFerryd) next(op string) map[string]interface{} {
	for {
		select {
		case r := <-f.reqs:
			if r["op"] == op {
				return r
			}
		case <-time.After(5 * time.Second):
			return nil
		}
	}
}

func (f *fakeFerryd) drain() {
	for len(f.reqs) > 0 {
		<-f.reqs
	}
}

// remoteImage: a snapshotter daemon on a fake ferryd that mounts one ferry
// image (a data blob and its bootstrap) by its manifest digest.
type remoteImage struct {
	ferryd     *fakeFerryd
	c          config
	sn         snapshots.Snapshotter
	stop       func()
	blob, boot digest.Digest
	m          string // the manifest's digest
	chain      []digest.Digest
	image      string // as ferryd is asked to mount it
}

func newRemoteImage(t *testing.T) *remoteImage {
	root := t.TempDir()
	r := &remoteImage{ferryd: startFakeFerryd(t, filepath.Join(root, "ferryd.sock")),
		c:    testConfig(root, filepath.Join(root, "ferryd.sock")),
		blob: digest.FromString("blob"), boot: digest.FromString("bootstrap"),
		m: digest.FromString("manifest").String()}
	r.sn, r.stop = daemon(t, r.c)
	r.chain = ferryChain([]digest.Digest{r.blob}, r.boot)
	r.image = "docker://127.0.0.1:5001/deb@" + r.m
	r.ferryd.set(r.image, r.m, r.boot.String())
	return r
}

// prepare: Prepare of one of its layers (@kind labelBlob or
// labelBootstrap, chain ID @target) with CRI's labels.
func (r *remoteImage) prepare(ctx context.Context, key, parent string, target digest.Digest, kind string) error {
	l := map[string]string{labelTarget: target.String(), kind: "true",
		labelCRIRef: "127.0.0.1:5001/deb:two", labelCRIManifest: r.m, labelCRILayer: r.blob.String()}
	_, err := r.sn.Prepare(ctx, key, parent, snapshots.WithLabels(l))
	return err
}

// A ferry image's layers through the gRPC proxy, as containerd's unpacker
// prepares them: the blob becomes an empty committed snapshot without a
// word to ferryd, the bootstrap is mounted by manifest digest and
// committed when its chain is the one asked for; an image claiming
// another image's diff_ids is refused and nothing is committed; Remove
// unmounts and releases the image; a restart mounts it again by digest,
// and one that fails leaves the snapshotter serving.
func TestRemoteLayers(t *testing.T) {
	ctx := context.Background()
	r := newRemoteImage(t)
	ferryd, c, sn, stop := r.ferryd, r.c, r.sn, r.stop
	boot, m, chain, image := r.boot, r.m, r.chain, r.image
	prepare := func(key, parent string, target digest.Digest, kind string) error {
		return r.prepare(ctx, key, parent, target, kind)
	}
	// The attacker's bootstrap over a verified blob, claiming a victim's
	// diff_id: ferryd mounts it, its chain is not the one asked for.
	victim := chainNext(chain[0], digest.FromString("victim layer"))
	if err := prepare("k8s.io/1/k1", "", chain[0], labelBlob); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("blob layer: Prepare gave %v, want already exists", err)
	}
	if len(ferryd.reqs) != 0 {
		t.Fatalf("a blob layer asked ferryd: %v", <-ferryd.reqs)
	}
	err := prepare("k8s.io/2/k2", chain[0].String(), victim, labelBootstrap)
	if err == nil || !strings.Contains(err.Error(), "containerd asked for "+victim.String()) {
		t.Fatalf("a bootstrap claiming another chain: Prepare gave %v", err)
	}
	if _, err := sn.Stat(ctx, victim.String()); !errdefs.IsNotFound(err) {
		t.Fatalf("the claimed chain was committed: %v", err)
	}
	if r := ferryd.next("mount"); r == nil || r["image"] != image || r["imageDigest"] != m {
		t.Fatalf("mount request %v", r)
	}
	if r := ferryd.next("umount"); r == nil || r["release"] != true {
		t.Fatalf("the refused mount was not unmounted and released: %v", r)
	}
	if _, err := sn.Stat(ctx, "k8s.io/2/k2"); !errdefs.IsNotFound(err) {
		t.Fatalf("the refused layer's snapshot stays: %v", err)
	}
	// The image's own chain.
	if err := prepare("k8s.io/3/k3", chain[0].String(), chain[1], labelBootstrap); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("bootstrap layer: Prepare gave %v, want already exists", err)
	}
	mount := ferryd.next("mount")
	if mount == nil || mount["image"] != image || mount["suid"] != true || mount["dev"] != false ||
		mount["mode"] != "auto" || !strings.HasPrefix(mount["mountpoint"].(string), filepath.Join(c.Root, "mounts")) {
		t.Fatalf("mount request %v", mount)
	}
	info, err := sn.Stat(ctx, chain[1].String())
	if err != nil || info.Kind != snapshots.KindCommitted || info.Parent != chain[0].String() {
		t.Fatalf("Stat(%s) = %+v, %v", chain[1], info, err)
	}
	// Another namespace's pull finds it verified, without a mount.
	ferryd.drain()
	if err := prepare("k8s.io/4/k4", chain[0].String(), chain[1], labelBootstrap); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("bootstrap layer again: Prepare gave %v, want already exists", err)
	}
	if len(ferryd.reqs) != 0 {
		t.Fatalf("a committed bootstrap was mounted again: %v", <-ferryd.reqs)
	}
	// A layer that is no ferry layer is an ordinary snapshot to unpack into.
	if _, err := sn.Prepare(ctx, "k8s.io/5/k5", "", snapshots.WithLabels(map[string]string{
		labelTarget: "sha256:" + strings.Repeat("1", 64)})); err != nil {
		t.Fatalf("fallback layer: Prepare gave %v", err)
	}
	if err := sn.Remove(ctx, "k8s.io/5/k5"); err != nil {
		t.Fatal(err)
	}

	// Restart with the registry down: it starts, the container fails.
	stop()
	var closer func() error
	ferryd.set(image, "", "")
	ferryd.drain()
	sn, closer, err = proxiedConfig(ctx, c, true)
	if err != nil {
		t.Fatalf("restart with a snapshot that cannot be mounted: %v", err)
	}
	defer closer()
	if r := ferryd.next("mount"); r == nil || r["image"] != image || r["imageDigest"] != m {
		t.Fatalf("restore: mount request %v, want %s by its digest", r, image)
	}
	_, err = sn.Prepare(ctx, "k8s.io/6/container", chain[1].String())
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "registry down") {
		t.Fatalf("a container on the unrestored image: %v, want unavailable saying why", err)
	}
	// The registry is back: the next container mounts it again.
	ferryd.set(image, m, boot.String())
	remountBackoff = 0
	if _, err := sn.Prepare(ctx, "k8s.io/7/container", chain[1].String()); err != nil {
		t.Fatalf("a container once the image can be mounted: %v", err)
	}
	for _, k := range []string{"k8s.io/6/container", "k8s.io/7/container"} {
		if err := sn.Remove(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	ferryd.drain()
	if err := sn.Remove(ctx, chain[1].String()); err != nil {
		t.Fatal(err)
	}
	if r := ferryd.next("umount"); r == nil || r["release"] != true ||
		!strings.HasPrefix(r["mountpoint"].(string), filepath.Join(c.Root, "mounts")) {
		t.Fatalf("Remove did not unmount and release the bootstrap's mount: %v", r)
	}
}

// A ferry snapshot without a record was committed by an earlier
// ferry-snapshotter that verified nothing: after a restart neither another
// pull nor a container may use it, and both errors say what to do.
func TestUnverifiedSnapshot(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	startFakeFerryd(t, filepath.Join(root, "ferryd.sock"))
	c := testConfig(root, filepath.Join(root, "ferryd.sock"))
	sn, stop := daemon(t, c)
	blob, boot := digest.FromString("blob"), digest.FromString("bootstrap")
	chain := ferryChain([]digest.Digest{blob}, boot)
	labels := map[string]string{labelTarget: chain[0].String(), labelBlob: "true",
		labelCRIRef: "127.0.0.1:5001/deb:two", labelCRIManifest: digest.FromString("manifest").String(),
		labelCRILayer: blob.String()}
	if _, err := sn.Prepare(ctx, "k8s.io/1/k1", "", snapshots.WithLabels(labels)); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("blob layer: Prepare gave %v, want already exists", err)
	}
	stop()
	records, err := filepath.Glob(filepath.Join(c.Root, "snapshots", "*", recordName))
	if err != nil || len(records) != 1 {
		t.Fatalf("records of the committed blob layer: %v, %v", records, err)
	}
	if err := os.Remove(records[0]); err != nil {
		t.Fatal(err)
	}

	sn, closer, err := proxiedConfig(ctx, c, true)
	if err != nil {
		t.Fatalf("restart with an unverified snapshot: %v", err)
	}
	defer closer()
	_, err = sn.Prepare(ctx, "k8s.io/2/k2", "", snapshots.WithLabels(labels))
	if err == nil || !strings.Contains(err.Error(), "without verification") {
		t.Fatalf("another pull of the unverified layer: Prepare gave %v", err)
	}
	_, err = sn.Prepare(ctx, "k8s.io/3/container", chain[0].String())
	if err == nil || !strings.Contains(err.Error(), "without verification") {
		t.Fatalf("a container on the unverified layer: Prepare gave %v", err)
	}
}

// fuseAborted tells a FUSE mount whose connection the kernel ended (every
// /dev/fuse descriptor closed: ferryd and its keeper gone) from one a
// descriptor still holds (a keeper waiting for a successor: statfs waits
// for an answer) and from a directory that is no FUSE mount.
func TestFuseAborted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts FUSE: needs root")
	}
	dir := t.TempDir()
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("/dev/fuse: %v", err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	if err := syscall.Mount("ferry-test", dir, "fuse", syscall.MS_RDONLY, opts); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	t0 := time.Now()
	if fuseAborted(dir) {
		t.Fatal("a connection a descriptor still holds was taken for ended")
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("fuseAborted waited %v for a connection nobody answers", d)
	}
	syscall.Close(fd)
	if !fuseAborted(dir) {
		t.Fatal("a connection with no descriptor left was not taken for ended")
	}
	if fuseAborted(t.TempDir()) {
		t.Fatal("a plain directory was taken for an ended FUSE mount")
	}
}

// A snapshotter restarted while ferryd is being replaced (kill -9: the
// mounts' keepers start a successor that takes each mount over) leaves
// the kernel's mount alone. While ferryd does not answer, a container is
// refused as unavailable; once a ferryd answers, the restart waits for it
// to list the mount (its keeper hands it over) and a container runs on it,
// with no mount or umount request. Before, the restart detached the mount
// when ferryd did not answer, and the successor found nothing to take
// over: the running containers lost their files (node_faults_containerd).
func TestRestartDuringTakeover(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	ctx := context.Background()
	ri := newRemoteImage(t)
	c, chain := ri.c, ri.chain
	if err := ri.prepare(ctx, "k8s.io/1/k", "", chain[0], labelBlob); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("blob layer: Prepare gave %v, want already exists", err)
	}
	if err := ri.prepare(ctx, "k8s.io/2/k", chain[0].String(), chain[1], labelBootstrap); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("bootstrap layer: Prepare gave %v, want already exists", err)
	}
	r := ri.ferryd.next("mount")
	if r == nil {
		t.Fatal("the bootstrap was not mounted")
	}
	dir := r["mountpoint"].(string)
	ri.stop()
	// The kernel's mount of the image, which a successor is to take over
	// (a tmpfs stands in for it).
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	saved := takeoverWait
	takeoverWait = time.Second
	t.Cleanup(func() { takeoverWait = saved })

	// ferryd was killed: nothing answers on its socket.
	c.FerrydSocket = filepath.Join(filepath.Dir(c.Root), "successor.sock")
	sn, closer, err := proxiedConfig(ctx, c, false)
	if err != nil {
		t.Fatal(err)
	}
	defer closer()
	_, err = sn.Prepare(ctx, "k8s.io/3/container", chain[1].String())
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "is ferryd running?") {
		t.Fatalf("a container while ferryd does not answer: %v, want unavailable saying why", err)
	}
	if ok, _ := mountinfo.Mounted(dir); !ok {
		t.Fatal("the restarted snapshotter detached the mount while ferryd did not answer")
	}
	// The successor answers; the keeper hands the mount over 0.3 s later.
	successor := startFakeFerryd(t, c.FerrydSocket)
	go func() {
		time.Sleep(300 * time.Millisecond)
		successor.serve(dir, ri.image)
	}()
	if _, err := sn.Prepare(ctx, "k8s.io/4/container", chain[1].String()); err != nil {
		t.Fatalf("a container once the successor serves the mount: %v", err)
	}
	if ok, _ := mountinfo.Mounted(dir); !ok {
		t.Fatal("the mount the successor took over was detached")
	}
	for len(successor.reqs) > 0 {
		if r := <-successor.reqs; r["op"] != "list" {
			t.Fatalf("the successor was asked %v, not only for its list", r)
		}
	}
}
