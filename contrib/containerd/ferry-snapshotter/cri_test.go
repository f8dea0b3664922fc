// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/snapshots"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// pullRequestBytes is a PullImageRequest as kubelet encodes one (cri-api's
// field numbers), with fields the proxy does not read around the ones it
// does: an image annotation, a sandbox config, an unknown varint.
func pullRequestBytes(image string, auth map[protowire.Number]string) []byte {
	str := func(b []byte, num protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
	}
	msg := func(b []byte, num protowire.Number, m []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), m)
	}
	spec := str(nil, 1, image)
	spec = msg(spec, 2, str(str(nil, 1, "k"), 2, "v")) // annotations{"k": "v"}
	var b []byte
	b = protowire.AppendVarint(protowire.AppendTag(b, 99, protowire.VarintType), 7)
	b = msg(b, 1, spec)
	if auth != nil {
		nums := make([]int, 0, len(auth))
		for n := range auth {
			nums = append(nums, int(n))
		}
		sort.Ints(nums)
		var a []byte
		for _, n := range nums {
			a = str(a, protowire.Number(n), auth[protowire.Number(n)])
		}
		b = msg(b, 2, a)
	}
	sandbox := msg(nil, 1, str(nil, 1, "pod")) // metadata{name}
	return msg(b, 3, protowire.AppendVarint(protowire.AppendTag(sandbox, 5, protowire.VarintType), 1))
}

func TestDecodePullImage(t *testing.T) {
	b := pullRequestBytes("nginx:1.27", map[protowire.Number]string{
		authFieldUsername: "u", authFieldPassword: "p", authFieldServer: "docker.io"})
	r, err := decodePullImage(b)
	if err != nil || r.image != "nginx:1.27" || !r.hasAuth ||
		r.auth != (authConfig{username: "u", password: "p", serverAddress: "docker.io"}) {
		t.Fatalf("decodePullImage = %+v, %v", r, err)
	}
	// A repeated embedded message merges; the last scalar wins.
	more := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType),
		protowire.AppendString(protowire.AppendTag(nil, authFieldPassword, protowire.BytesType), "p2"))
	if r, err := decodePullImage(append(b, more...)); err != nil ||
		r.auth.username != "u" || r.auth.password != "p2" {
		t.Fatalf("merged AuthConfig = %+v, %v", r, err)
	}
	if r, err := decodePullImage(pullRequestBytes("nginx", nil)); err != nil || r.hasAuth || r.image != "nginx" {
		t.Fatalf("without auth: %+v, %v", r, err)
	}
	for name, bad := range map[string][]byte{
		"truncated":         b[:len(b)-3],
		"image as a varint": protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1),
		"username as a varint": protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType),
			protowire.AppendVarint(protowire.AppendTag(nil, authFieldUsername, protowire.VarintType), 1)),
	} {
		if _, err := decodePullImage(bad); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// What a PullImage's credentials are used for: mounts of its repository
// only (Hub names normalised), until kubelet pulls it again with others
// that work.
func TestCRICreds(t *testing.T) {
	ctx := context.Background()
	c := newCRICreds()
	pull := func(image string, a *authConfig) func() {
		r := &pullRequest{image: image}
		if a != nil {
			r.auth, r.hasAuth = *a, true
		}
		return c.record(ctx, r)
	}
	m := "@" + digest.FromString("m").String()
	pull("127.0.0.1:5001/private/app:1", &authConfig{username: "u", password: "p"})
	pull("nginx", &authConfig{auth: base64.StdEncoding.EncodeToString([]byte("hub:secret")),
		serverAddress: "https://index.docker.io/v1/"})
	pull("127.0.0.1:5001/lied:1", &authConfig{username: "u", password: "p", serverAddress: "evil.example"})
	pull("127.0.0.1:5001/token:1", &authConfig{identityToken: "refresh"})
	for image, want := range map[string]string{
		"127.0.0.1:5001/private/app" + m:       "u:p",
		"127.0.0.1:5001/private/app:2":         "u:p",
		"127.0.0.1:5001/private/other" + m:     "",
		"127.0.0.1:5002/private/app" + m:       "",
		"docker.io/library/nginx" + m:          "hub:secret",
		"index.docker.io/library/nginx:latest": "hub:secret",
		"docker.io/library/redis" + m:          "",
		"127.0.0.1:5001/lied" + m:              "",
		"127.0.0.1:5001/token" + m:             "",
	} {
		if got := c.lookup(image); got != want {
			t.Errorf("lookup(%s) = %q, want %q", image, got, want)
		}
	}
	pull("127.0.0.1:5001/private/app:1", &authConfig{username: "u", password: "rotated"})
	if got := c.lookup("127.0.0.1:5001/private/app" + m); got != "u:rotated" {
		t.Errorf("pulled again with new credentials: %q", got)
	}
	// Pulled again: without credentials, nothing changes; with others
	// that fail the pull, the ones that worked stay.
	if undo := pull("docker.io/library/nginx:1.27", nil); undo != nil {
		t.Error("a pull without credentials has something to undo")
	}
	if got := c.lookup("docker.io/library/nginx" + m); got != "hub:secret" {
		t.Errorf("pulled again without credentials: %q", got)
	}
	undo := pull("nginx", &authConfig{username: "other", password: "wrong"})
	if got := c.lookup("docker.io/library/nginx" + m); got != "other:wrong" {
		t.Errorf("during a pull with other credentials: %q", got)
	}
	undo()
	if got := c.lookup("docker.io/library/nginx" + m); got != "hub:secret" {
		t.Errorf("after that pull failed: %q", got)
	}
	undo = pull("127.0.0.1:5001/new:1", &authConfig{username: "n", password: "p"})
	pull("127.0.0.1:5001/new:1", &authConfig{username: "n", password: "later"})
	undo()
	if got := c.lookup("127.0.0.1:5001/new" + m); got != "n:later" {
		t.Errorf("a failed pull undid a later one's credentials: %q", got)
	}
}

// fakeCRI is containerd's CRI as the proxy sees it: it keeps what it
// received and answers with headers, trailers, a reply or an error.
type fakeCRI struct {
	mu       sync.Mutex
	got      [][]byte
	methods  []string
	metadata []metadata.MD
}

func (f *fakeCRI) handle(_ interface{}, s grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(s)
	var m rawFrame
	if err := s.RecvMsg(&m); err != nil {
		return err
	}
	md, _ := metadata.FromIncomingContext(s.Context())
	f.mu.Lock()
	f.got = append(f.got, m.data)
	f.methods = append(f.methods, method)
	f.metadata = append(f.metadata, md)
	f.mu.Unlock()
	if strings.HasSuffix(method, "/RemoveImage") {
		return status.Error(codes.NotFound, "no such image")
	}
	if bytes.Contains(m.data, []byte("wrong-pass")) {
		return status.Error(codes.Unknown, "failed to pull: 401 Unauthorized")
	}
	s.SetTrailer(metadata.Pairs("x-trailer", "t"))
	if err := s.SendHeader(metadata.Pairs("x-header", "h")); err != nil {
		return err
	}
	reply := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "sha256:image")
	return s.SendMsg(&rawFrame{reply})
}

// The proxy forwards any call's bytes, metadata and status unchanged, and
// the credentials of a PullImage reach ferryd in the mount of that image
// only, as "creds".
func TestCRIProxy(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	backend := &fakeCRI{}
	l, err := listen(filepath.Join(root, "containerd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.CustomCodec(rawCodec{}), grpc.UnknownServiceHandler(backend.handle))
	go srv.Serve(l)
	defer srv.Stop()

	ferryd := startFakeFerryd(t, filepath.Join(root, "ferryd.sock"))
	c := testConfig(root, filepath.Join(root, "ferryd.sock"))
	c.CRIAddress = filepath.Join(root, "cri.sock")
	c.ContainerdAddress = filepath.Join(root, "containerd.sock")
	sn, closer, err := proxiedConfig(ctx, c, true)
	if err != nil {
		t.Fatal(err)
	}
	defer closer()
	for i := 0; i < 500 && !listening(c.CRIAddress); i++ { // up to 5 s
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.Dial("unix://"+c.CRIAddress, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	call := func(method string, req []byte) ([]byte, metadata.MD, metadata.MD, error) {
		var reply rawFrame
		var hdr, tr metadata.MD
		cctx := metadata.AppendToOutgoingContext(ctx, "x-kubelet", "k")
		err := conn.Invoke(cctx, method, &rawFrame{req}, &reply, grpc.ForceCodec(rawCodec{}),
			grpc.Header(&hdr), grpc.Trailer(&tr))
		return reply.data, hdr, tr, err
	}

	req := pullRequestBytes("127.0.0.1:5001/deb:two", map[protowire.Number]string{
		authFieldUsername: "alice", authFieldPassword: "s3cret"})
	reply, hdr, tr, err := call(pullImageV1, req)
	if err != nil || !bytes.Contains(reply, []byte("sha256:image")) ||
		len(hdr.Get("x-header")) != 1 || len(tr.Get("x-trailer")) != 1 {
		t.Fatalf("PullImage through the proxy: %q, header %v, trailer %v, %v", reply, hdr, tr, err)
	}
	backend.mu.Lock()
	if len(backend.got) != 1 || !bytes.Equal(backend.got[0], req) || backend.methods[0] != pullImageV1 ||
		len(backend.metadata[0].Get("x-kubelet")) != 1 {
		t.Fatalf("containerd got %d calls: %v %q %v", len(backend.got), backend.methods, backend.got, backend.metadata)
	}
	backend.mu.Unlock()
	_, _, _, err = call("/runtime.v1alpha2.ImageService/RemoveImage", []byte{0x0a, 0})
	if st, _ := status.FromError(err); st.Code() != codes.NotFound || st.Message() != "no such image" {
		t.Fatalf("an error passes through as it is: %v", err)
	}
	// Another pod's secret that fails the pull does not replace the one
	// that worked.
	_, _, _, err = call(pullImageV1alpha2, pullRequestBytes("127.0.0.1:5001/deb:two",
		map[protowire.Number]string{authFieldUsername: "mallory", authFieldPassword: "wrong-pass"}))
	if status.Code(err) != codes.Unknown {
		t.Fatalf("a failed PullImage: %v", err)
	}

	// The image's bootstrap, mounted with the credentials; another
	// repository's, on the same registry, without.
	mount := func(n int, ref string) map[string]interface{} {
		blob, boot := digest.FromString("blob "+ref), digest.FromString("bootstrap "+ref)
		m := digest.FromString("manifest " + ref).String()
		chain := ferryChain([]digest.Digest{blob}, boot)
		ferryd.set("docker://"+repoOf(ref)+"@"+m, m, boot.String())
		for i, kind := range []string{labelBlob, labelBootstrap} {
			parent := ""
			if i > 0 {
				parent = chain[0].String()
			}
			l := map[string]string{labelTarget: chain[i].String(), kind: "true",
				labelCRIRef: ref, labelCRIManifest: m, labelCRILayer: blob.String()}
			key := fmt.Sprintf("k8s.io/%d/%d", n, i)
			if _, err := sn.Prepare(ctx, key, parent, snapshots.WithLabels(l)); !errdefs.IsAlreadyExists(err) {
				t.Fatalf("%s of %s: Prepare gave %v", kind, ref, err)
			}
		}
		r := ferryd.next("mount")
		if r == nil {
			t.Fatalf("%s was not mounted", ref)
		}
		fetch, _ := r["fetch"].(map[string]interface{})
		return fetch
	}
	if f := mount(1, "127.0.0.1:5001/deb:two"); f == nil || f["creds"] != "alice:s3cret" {
		t.Errorf("the pulled image's mount: fetch %v, want its credentials", f)
	}
	if f := mount(2, "127.0.0.1:5001/other:1"); f != nil && f["creds"] != nil {
		t.Errorf("another repository's mount got the credentials: %v", f)
	}
}

// containerd coming up after the proxy (as on a booting node, where the
// snapshotter starts first): a call sent once containerd is up reaches it
// within a second or two, not after grpc's default backoff, which has
// grown to seconds by then and would fail the call at once.
func TestCRIProxyContainerdLate(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := t.TempDir()
	ctdSock, criSock := filepath.Join(root, "containerd.sock"), filepath.Join(root, "cri.sock")
	go serveCRI(ctx, criSock, ctdSock, newCRICreds())
	for i := 0; i < 500 && !listening(criSock); i++ { // up to 5 s
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // the proxy's dials to containerd fail meanwhile

	backend := &fakeCRI{}
	l, err := listen(ctdSock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.CustomCodec(rawCodec{}), grpc.UnknownServiceHandler(backend.handle))
	go srv.Serve(l)
	defer srv.Stop()

	conn, err := grpc.Dial("unix://"+criSock, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
	defer ccancel()
	var reply rawFrame
	err = conn.Invoke(cctx, "/runtime.v1.RuntimeService/Version", &rawFrame{[]byte{0x0a, 2, 'v', '1'}},
		&reply, grpc.ForceCodec(rawCodec{}))
	if err != nil || !bytes.Contains(reply.data, []byte("sha256:image")) {
		t.Fatalf("a call once containerd is up: %q, %v", reply.data, err)
	}
}
