// SPDX-License-Identifier: MIT

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/snapshots"
	"github.com/containerd/containerd/snapshots/proxy"
	"github.com/containerd/containerd/snapshots/testsuite"
	"google.golang.org/grpc"
)

// proxied starts ferry-snapshotter on @root and returns containerd's proxy
// client of it, as containerd's [proxy_plugins] would use it.
func proxied(ctx context.Context, root string, ferryd string) (snapshots.Snapshotter, func() error, error) {
	c := defaults()
	c.Root = filepath.Join(root, "state")
	c.Address = filepath.Join(root, "snapshotter.sock")
	c.FerrydSocket = ferryd
	c.CacheDir = filepath.Join(root, "cache")
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- serve(sctx, c, true) }()
	for i := 0; i < 500; i++ { // up to 5 s for the socket
		if _, err := os.Stat(c.Address); err == nil {
			break
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

func TestImageRef(t *testing.T) {
	for _, c := range []struct {
		labels map[string]string
		want   string
	}{
		{map[string]string{labelCRIRef: "127.0.0.1:5001/deb:two", labelCRIManifest: "sha256:ab"},
			"docker://127.0.0.1:5001/deb@sha256:ab"},
		{map[string]string{labelCRIRef: "127.0.0.1:5001/deb", labelCRIManifest: "sha256:ab"},
			"docker://127.0.0.1:5001/deb@sha256:ab"},
		{map[string]string{labelCRIRef: "h/deb@sha256:cd", labelCRIManifest: "sha256:cd"},
			"docker://h/deb@sha256:cd"},
		{map[string]string{labelStargzRef: "127.0.0.1:5001/deb:two"},
			"docker://127.0.0.1:5001/deb:two"},
		{map[string]string{}, ""},
	} {
		got, err := imageRef(c.labels)
		if got != c.want || (err != nil) != (c.want == "") {
			t.Errorf("imageRef(%v) = %q, %v; want %q", c.labels, got, err, c.want)
		}
	}
}

// fakeFerryd answers every request ok and sends it to @reqs.
func fakeFerryd(t *testing.T, path string, reqs chan<- map[string]interface{}) {
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
				reqs <- req
			}
			ans := `{"ok":true,"pid":1}`
			if req["op"] == "umount" {
				ans = `{"ok":false,"error":"not ferryd's","errno":2}`
			}
			conn.Write([]byte(ans + "\n"))
			conn.Close()
		}
	}()
}

// A ferry image's layers become committed remote snapshots; the bootstrap
// one asks ferryd to mount the image by manifest digest; Remove unmounts.
func TestRemoteLayers(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	reqs := make(chan map[string]interface{}, 16)
	fakeFerryd(t, filepath.Join(root, "ferryd.sock"), reqs)
	sn, closer, err := proxied(ctx, root, filepath.Join(root, "ferryd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer closer()
	cri := map[string]string{labelCRIRef: "127.0.0.1:5001/deb:two", labelCRIManifest: "sha256:ab"}
	prepare := func(key, parent, chain, kind string) error {
		l := map[string]string{"containerd.io/snapshot.ref": chain, kind: "true"}
		for k, v := range cri {
			l[k] = v
		}
		_, err := sn.Prepare(ctx, key, parent, snapshots.WithLabels(l))
		return err
	}
	if err := prepare("k1", "", "chain1", labelBlob); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("blob layer: Prepare gave %v, want already exists", err)
	}
	if len(reqs) != 0 {
		t.Fatalf("a blob layer asked ferryd: %v", <-reqs)
	}
	if err := prepare("k2", "chain1", "chain2", labelBootstrap); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("bootstrap layer: Prepare gave %v, want already exists", err)
	}
	<-reqs // the umount of a stale mount
	mount := <-reqs
	if mount["op"] != "mount" || mount["image"] != "docker://127.0.0.1:5001/deb@sha256:ab" ||
		mount["suid"] != true || mount["dev"] != false || mount["mode"] != "auto" {
		t.Fatalf("mount request %v", mount)
	}
	info, err := sn.Stat(ctx, "chain2")
	if err != nil || info.Kind != snapshots.KindCommitted || info.Parent != "chain1" {
		t.Fatalf("Stat(chain2) = %+v, %v", info, err)
	}
	// A layer that is no ferry layer is an ordinary snapshot to unpack into.
	if err := prepare("k3", "", "chain3", "containerd.io/snapshot/other"); err != nil {
		t.Fatalf("fallback layer: Prepare gave %v", err)
	}
	if err := sn.Remove(ctx, "k3"); err != nil {
		t.Fatal(err)
	}
	if err := sn.Remove(ctx, "chain2"); err != nil {
		t.Fatal(err)
	}
	for len(reqs) > 0 {
		if r := <-reqs; r["op"] == "umount" && r["mountpoint"] == mount["mountpoint"] {
			return
		}
	}
	t.Fatal("Remove did not ask ferryd to unmount the bootstrap's mount")
}

