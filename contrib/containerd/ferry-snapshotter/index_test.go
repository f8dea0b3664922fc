// SPDX-License-Identifier: MIT

package main

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/snapshots"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
)

// indexPosition: the layer whose chain containerd asked for, over the
// right parent, with the right layer digest; diff_ids that are not the
// image's give no position.
func TestIndexPosition(t *testing.T) {
	l := []digest.Digest{digest.FromString("l0"), digest.FromString("l1"), digest.FromString("l2")}
	d := []digest.Digest{digest.FromString("d0"), digest.FromString("d1"), digest.FromString("d2")}
	c := identity.ChainIDs(append([]digest.Digest(nil), d...))
	p := &probeReply{Layers: l, DiffIDs: d, IndexDigest: "sha256:idx"}
	for i := range l {
		var parent digest.Digest
		if i > 0 {
			parent = c[i-1]
		}
		if got, err := indexPosition(p, l[i], parent, c[i]); err != nil || got != i {
			t.Errorf("layer %d: %d, %v", i, got, err)
		}
	}
	for name, tc := range map[string]struct {
		layer, parent, target digest.Digest
		want                  string
	}{
		"another layer digest": {l[0], c[0], c[1], "not layer"},
		"another parent":       {l[1], "", c[1], "not over nothing"},
		"a chain of other diff_ids": {l[0], "", digest.FromString("victim"),
			"none of the chains"},
	} {
		if _, err := indexPosition(p, tc.layer, tc.parent, tc.target); err == nil ||
			!strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if _, err := indexPosition(&probeReply{Layers: l, DiffIDs: d[:2]}, l[0], "", c[0]); err == nil {
		t.Error("a probe with fewer diff_ids than layers was accepted")
	}
}

func TestRepoTrusted(t *testing.T) {
	trusted := []string{"reg.example/team", "127.0.0.1:5001/"}
	for repo, want := range map[string]bool{
		"reg.example/team": true, "reg.example/team/app": true, "reg.example/teamx": false,
		"reg.example/other": false, "127.0.0.1:5001/deb": true, "127.0.0.1:50011/deb": false,
		"docker.io/library/debian": false,
	} {
		if got := repoTrusted(trusted, repo); got != want {
			t.Errorf("repoTrusted(%q) = %v", repo, got)
		}
	}
	if repoTrusted(nil, "reg.example/team") || repoTrusted([]string{""}, "x/y") {
		t.Error("no entry trusted a repository")
	}
}

// guardLowers: lower directories end at an indexed image's mount; an
// empty lower layer without one above it is refused.
func TestGuardLowers(t *testing.T) {
	kinds := map[string]string{"/s/top/fs": kindIndex, "/s/p1/fs": kindIndexLayer,
		"/s/p0/fs": kindIndexLayer, "/s/blob/fs": kindBlob}
	kindOf := func(dir string) string { return kinds[dir] }
	overlay := func(opts ...string) []mount.Mount {
		return []mount.Mount{{Type: "overlay", Source: "overlay", Options: opts}}
	}
	for name, tc := range map[string]struct {
		in, want []mount.Mount
		err      string
	}{
		"a container on the index": {
			in:   overlay("workdir=/w", "upperdir=/u", "lowerdir=/s/top/fs:/s/p1/fs:/s/p0/fs"),
			want: overlay("workdir=/w", "upperdir=/u", "lowerdir=/s/top/fs"),
		},
		"a layer unpacked over the index": {
			in:   overlay("upperdir=/u", "lowerdir=/s/gz/fs:/s/top/fs:/s/p1/fs:/s/p0/fs"),
			want: overlay("upperdir=/u", "lowerdir=/s/gz/fs:/s/top/fs"),
		},
		"a view of the index": {
			in:   overlay("lowerdir=/s/top/fs:/s/p1/fs:/s/p0/fs"),
			want: []mount.Mount{{Type: "bind", Source: "/s/top/fs", Options: []string{"ro", "rbind"}}},
		},
		"an ordinary image": {
			in:   overlay("upperdir=/u", "lowerdir=/s/a/fs:/s/b/fs"),
			want: overlay("upperdir=/u", "lowerdir=/s/a/fs:/s/b/fs"),
		},
		"a layer unpacked over an empty lower layer": {
			in:  overlay("upperdir=/u", "lowerdir=/s/gz/fs:/s/p1/fs:/s/p0/fs"),
			err: "p1 is the empty lower layer",
		},
		"a view of an empty lower layer": {
			in:  []mount.Mount{{Type: "bind", Source: "/s/p0/fs", Options: []string{"ro", "rbind"}}},
			err: "p0 is the empty lower layer",
		},
	} {
		got, err := guardLowers(tc.in, kindOf)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", name, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, tc.want)
		}
	}
}

// An indexed image's layers through the gRPC proxy, as containerd's
// unpacker prepares them: probed (by manifest digest), the lower layer an
// empty committed snapshot, the top one ferryd's mount pinned to the
// probed index; a container sees the mount alone; an image without the
// index over the empty layer, a view of it, and an indexed base image
// whose top it is are refused; an index
// whose diff_ids are not the image's, a repository not trusted and an
// image without an index are unpacked as usual; a restart mounts the top
// again by manifest and index digest.
func TestIndexedLayers(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	ferryd := startFakeFerryd(t, filepath.Join(root, "ferryd.sock"))
	c := testConfig(root, filepath.Join(root, "ferryd.sock"))
	c.Indexes = []string{"127.0.0.1:5001/deb"}
	sn, stop := daemon(t, c)
	l := []digest.Digest{digest.FromString("gz0"), digest.FromString("gz1")}
	d := []digest.Digest{digest.FromString("tar0"), digest.FromString("tar1")}
	chain := identity.ChainIDs(append([]digest.Digest(nil), d...))
	m, idx, boot := digest.FromString("manifest").String(), digest.FromString("index").String(),
		digest.FromString("bootstrap").String()
	image := "docker://127.0.0.1:5001/deb@" + m
	probe := func(ids []digest.Digest) map[string]interface{} {
		return map[string]interface{}{"ok": true, "imageDigest": m, "bootstrapDigest": boot,
			"indexDigest": idx, "layers": l, "diffIds": ids}
	}
	ferryd.setProbe(image, probe(d))
	ferryd.set(image, m, boot)
	prepare := func(key, parent string, target, layer digest.Digest, ref, manifest string) ([]mount.Mount, error) {
		return sn.Prepare(ctx, key, parent, snapshots.WithLabels(map[string]string{
			labelTarget: target.String(), labelCRIRef: ref, labelCRIManifest: manifest,
			labelCRILayer: layer.String()}))
	}
	if _, err := prepare("k8s.io/1/k1", "", chain[0], l[0], "127.0.0.1:5001/deb:1", m); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("lower layer: Prepare gave %v, want already exists", err)
	}
	if r := ferryd.next("probe"); r == nil || r["image"] != image || r["imageDigest"] != m {
		t.Fatalf("probe request %v", r)
	}
	if _, err := prepare("k8s.io/2/k2", chain[0].String(), chain[1], l[1], "127.0.0.1:5001/deb:1", m); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("top layer: Prepare gave %v, want already exists", err)
	}
	if r := ferryd.next("mount"); r == nil || r["image"] != image || r["imageDigest"] != m ||
		r["indexDigest"] != idx {
		t.Fatalf("mount request %v, want %s pinned to index %s", r, image, idx)
	}
	top, err := sn.Stat(ctx, chain[1].String())
	if err != nil || top.Kind != snapshots.KindCommitted || top.Parent != chain[0].String() {
		t.Fatalf("Stat(%s) = %+v, %v", chain[1], top, err)
	}
	ms, err := sn.Prepare(ctx, "k8s.io/3/container", chain[1].String())
	if err != nil || len(ms) != 1 || ms[0].Type != "overlay" {
		t.Fatalf("container: %+v, %v", ms, err)
	}
	for _, o := range ms[0].Options {
		if strings.HasPrefix(o, "lowerdir=") && strings.Contains(o, ":") {
			t.Errorf("the container's lower directories go below the index mount: %s", o)
		}
	}
	// Another image sharing the lower layer, without the index.
	other := chainNext(chain[0], digest.FromString("tar other"))
	_, err = prepare("k8s.io/4/k4", chain[0].String(), other, digest.FromString("gz other"),
		"127.0.0.1:5001/deb:other", digest.FromString("other manifest").String())
	if err == nil || !strings.Contains(err.Error(), "empty lower layer of an indexed image") {
		t.Fatalf("an image without the index over its empty lower layer: %v", err)
	}
	if _, err := sn.View(ctx, "k8s.io/5/view", chain[0].String()); err == nil ||
		!strings.Contains(err.Error(), "empty lower layer") {
		t.Fatalf("a view of the empty lower layer: %v", err)
	}
	// An indexed base image: its only layer is that empty lower layer.
	mb := digest.FromString("base manifest").String()
	ferryd.setProbe("docker://127.0.0.1:5001/deb@"+mb, map[string]interface{}{"ok": true,
		"imageDigest": mb, "bootstrapDigest": boot, "indexDigest": idx, "layers": l[:1], "diffIds": d[:1]})
	if _, err := prepare("k8s.io/8/k8", "", chain[0], l[0], "127.0.0.1:5001/deb:base", mb); err == nil ||
		!strings.Contains(err.Error(), "empty lower layer") {
		t.Fatalf("an indexed base image whose top is an empty lower layer: %v", err)
	}
	// Unpacked as usual: diff_ids that are not the image's, an untrusted
	// repository, no index.
	m2 := digest.FromString("manifest 2").String()
	ferryd.setProbe("docker://127.0.0.1:5001/deb@"+m2, probe([]digest.Digest{digest.FromString("lie"), d[1]}))
	ferryd.setProbe("docker://127.0.0.1:5001/untrusted@"+m, probe(d))
	ferryd.drain()
	for i, ref := range []string{"127.0.0.1:5001/deb:2", "127.0.0.1:5001/untrusted:1", "127.0.0.1:5001/deb:none"} {
		manifest := m2
		if i == 1 {
			manifest = m
		} else if i == 2 {
			manifest = digest.FromString("manifest 3").String()
		}
		key := "k8s.io/6/unpack-" + ref
		if _, err := prepare(key, "", chain[0], l[0], ref, manifest); err != nil {
			t.Fatalf("%s: Prepare gave %v, want an ordinary snapshot", ref, err)
		}
		if err := sn.Remove(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if r := ferryd.next("probe"); r == nil || r["imageDigest"] != m2 {
		t.Fatalf("probe request %v", r)
	}
	if r := ferryd.next("probe"); r == nil || strings.Contains(r["image"].(string), "untrusted") {
		t.Fatalf("an untrusted repository was probed, or the image without an index was not: %v", r)
	}
	if err := sn.Remove(ctx, "k8s.io/3/container"); err != nil {
		t.Fatal(err)
	}

	// Restart: the top is mounted again, by manifest and index digest.
	stop()
	ferryd.drain()
	sn, closer, err := proxiedConfig(ctx, c, true)
	if err != nil {
		t.Fatal(err)
	}
	defer closer()
	if r := ferryd.next("mount"); r == nil || r["image"] != image || r["imageDigest"] != m ||
		r["indexDigest"] != idx {
		t.Fatalf("restore: mount request %v", r)
	}
	if _, err := sn.Prepare(ctx, "k8s.io/7/container", chain[1].String()); err != nil {
		t.Fatalf("a container after the restart: %v", err)
	}
}
