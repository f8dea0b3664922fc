// SPDX-License-Identifier: MIT

package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/log"
	refdocker "github.com/containerd/containerd/reference/docker"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// Pull secrets (docs/containerd.md, Kubernetes): kubelet sends a pod's
// registry credentials in CRI's PullImage, and containerd passes them to
// no snapshotter. So ferry-snapshotter can be kubelet's image service
// endpoint: a proxy in front of containerd's CRI socket that forwards
// every call unchanged, as bytes, and remembers the credentials of each
// PullImage, in memory only, for the repository it pulls. A ferry mount of
// that repository sends them to ferryd as its "creds", which ferryd gives
// only to the image's registry (and its token service), never to a
// mirror or another registry.
//
// The few fields read are decoded by their numbers in kubernetes'
// cri-api (pkg/apis/runtime/v1/api.proto, the same in v1alpha2):
// PullImageRequest{ImageSpec image = 1; AuthConfig auth = 2}, ImageSpec{
// string image = 1}, AuthConfig{username = 1, password = 2, auth = 3,
// server_address = 4, identity_token = 5, registry_token = 6}.
const (
	pullImageV1       = "/runtime.v1.ImageService/PullImage"
	pullImageV1alpha2 = "/runtime.v1alpha2.ImageService/PullImage"
	criMaxMsg         = 16 << 20 // kubelet's own limit on CRI messages

	pullImageFieldImage = 1
	pullImageFieldAuth  = 2
	imageSpecFieldImage = 1
	authFieldUsername   = 1
	authFieldPassword   = 2
	authFieldAuth       = 3
	authFieldServer     = 4
	authFieldIdentity   = 5
	authFieldRegistry   = 6
)

// authConfig is CRI's AuthConfig.
type authConfig struct {
	username, password, auth, serverAddress, identityToken, registryToken string
}

// pullRequest is what a PullImageRequest says that matters here.
type pullRequest struct {
	image   string
	auth    authConfig
	hasAuth bool
}

// protoFields calls @fn with each field of the message @b; a repeated
// embedded message is merged by concatenating its occurrences, a repeated
// scalar keeps its last value (protobuf's rules).
func protoFields(b []byte, fn func(num protowire.Number, typ protowire.Type, val []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			if err := fn(num, typ, v); err != nil {
				return err
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return protowire.ParseError(m)
		}
		if err := fn(num, typ, nil); err != nil {
			return err
		}
		b = b[m:]
	}
	return nil
}

func wireTypeError(msg string, num protowire.Number) error {
	return fmt.Errorf("%s field %d: not length-delimited", msg, num)
}

// decodePullImage reads the image and credentials of a PullImageRequest.
func decodePullImage(b []byte) (*pullRequest, error) {
	var spec, auth []byte
	r := &pullRequest{}
	err := protoFields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch num {
		case pullImageFieldImage, pullImageFieldAuth:
			if typ != protowire.BytesType {
				return wireTypeError("PullImageRequest", num)
			}
			if num == pullImageFieldImage {
				spec = append(spec, v...)
			} else {
				auth = append(auth, v...)
				r.hasAuth = true
			}
		}
		return nil
	})
	if err == nil {
		err = protoFields(spec, func(num protowire.Number, typ protowire.Type, v []byte) error {
			if num == imageSpecFieldImage {
				if typ != protowire.BytesType {
					return wireTypeError("ImageSpec", num)
				}
				r.image = string(v)
			}
			return nil
		})
	}
	if err == nil {
		fields := map[protowire.Number]*string{
			authFieldUsername: &r.auth.username, authFieldPassword: &r.auth.password,
			authFieldAuth: &r.auth.auth, authFieldServer: &r.auth.serverAddress,
			authFieldIdentity: &r.auth.identityToken, authFieldRegistry: &r.auth.registryToken,
		}
		err = protoFields(auth, func(num protowire.Number, typ protowire.Type, v []byte) error {
			if p := fields[num]; p != nil {
				if typ != protowire.BytesType {
					return wireTypeError("AuthConfig", num)
				}
				*p = string(v)
			}
			return nil
		})
	}
	if err != nil {
		return nil, fmt.Errorf("PullImageRequest: %w", err)
	}
	return r, nil
}

// hubNames are the names of Docker Hub's registry (docs/registries.md).
var hubNames = []string{"docker.io", "index.docker.io", "registry-1.docker.io"}

// sameRegistry: the host of a CRI server_address ("HOST[:PORT]", or a
// URL such as "https://index.docker.io/v1/") names the registry @domain.
func sameRegistry(serverAddress, domain string) bool {
	host := serverAddress
	if i := strings.Index(host, "://"); i >= 0 {
		host = host[i+3:]
	}
	if i := strings.IndexByte(host, '/'); i >= 0 {
		host = host[:i]
	}
	if strings.EqualFold(host, domain) {
		return true
	}
	isHub := func(h string) bool {
		for _, n := range hubNames {
			if strings.EqualFold(h, n) {
				return true
			}
		}
		return false
	}
	return isHub(host) && isHub(domain)
}

// userPass: the credentials as ferryd's "creds" ("USER:PASS"), or why
// they cannot be passed.
func (a *authConfig) userPass() (string, error) {
	switch {
	case a.username != "":
		if a.password == "" {
			return "", errors.New("a user name without a password")
		}
		return a.username + ":" + a.password, nil
	case a.auth != "":
		dec, err := base64.StdEncoding.DecodeString(a.auth)
		if err != nil || !strings.Contains(string(dec), ":") {
			return "", errors.New("\"auth\" is not base64 of USER:PASS")
		}
		return strings.TrimRight(string(dec), "\x00"), nil
	case a.identityToken != "" || a.registryToken != "":
		return "", errors.New("an identity or registry token, which ferryd takes from a docker config file only (the snapshotter's \"auths\")")
	}
	return "", nil
}

// criCreds: the credentials of kubelet's last successful PullImage per
// repository ("docker.io/library/nginx"), in memory only.
type criCreds struct {
	mu     sync.Mutex
	byRepo map[string]string // "USER:PASS"
}

func newCRICreds() *criCreds { return &criCreds{byRepo: map[string]string{}} }

// record the credentials of a PullImage for its repository, before
// containerd pulls (the snapshotter mounts during the pull); the returned
// function undoes that when the pull fails, so that a pod's wrong secret
// does not replace the one a pull succeeded with. A pull without usable
// credentials changes nothing: the repository's last ones stay.
func (c *criCreds) record(ctx context.Context, r *pullRequest) (undo func()) {
	named, err := refdocker.ParseDockerRef(r.image)
	if err != nil {
		log.G(ctx).WithError(err).Warnf("ferry: CRI PullImage of %q: no image reference", r.image)
		return nil
	}
	repo, domain := named.Name(), refdocker.Domain(named)
	secret, err := r.auth.userPass()
	if err == nil && secret != "" && r.auth.serverAddress != "" &&
		!sameRegistry(r.auth.serverAddress, domain) {
		err = fmt.Errorf("they are for %s, not %s", r.auth.serverAddress, domain)
	}
	if err != nil {
		log.G(ctx).Warnf("ferry: CRI PullImage of %s: its credentials are not used for ferry mounts: %v", repo, err)
	}
	if err != nil || secret == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, had := c.byRepo[repo]
	c.byRepo[repo] = secret
	log.G(ctx).Debugf("ferry: CRI PullImage of %s: credentials kept for mounts of %s", named, repo)
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.byRepo[repo] != secret { // a later pull's since
			return
		}
		if had {
			c.byRepo[repo] = prev
		} else {
			delete(c.byRepo, repo)
		}
	}
}

// lookup: the credentials last pulled @image's repository with, or "".
func (c *criCreds) lookup(image string) string {
	named, err := refdocker.ParseDockerRef(image)
	if err != nil {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byRepo[named.Name()]
}

// rawFrame is one gRPC message, forwarded as it came.
type rawFrame struct{ data []byte }

// rawCodec moves rawFrames, whatever the service: grpc's server-side
// Codec and its client-side encoding.Codec.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	f, ok := v.(*rawFrame)
	if !ok {
		return nil, fmt.Errorf("CRI proxy: cannot marshal %T", v)
	}
	return f.data, nil
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	f, ok := v.(*rawFrame)
	if !ok {
		return fmt.Errorf("CRI proxy: cannot unmarshal into %T", v)
	}
	f.data = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string   { return "proto" }
func (rawCodec) String() string { return "proto" }

// criProxy forwards every call to containerd's CRI.
type criProxy struct {
	backend *grpc.ClientConn
	creds   *criCreds
}

// The snapshotter starts before containerd (containerd needs it), and
// containerd restarts: grpc's default backoff would then keep the proxy
// from a containerd that is up for up to two minutes, failing kubelet's
// calls meanwhile. On a local socket, retrying every second at most is
// cheap; a call waits for the connection within its own deadline, so that
// a pull sent as containerd comes up is not lost.
var criBackendConnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
}

func newCRIProxy(containerdAddress string, creds *criCreds) (*criProxy, error) {
	conn, err := grpc.Dial(containerdAddress, grpc.WithInsecure(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
		grpc.WithConnectParams(criBackendConnect),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.WaitForReady(true),
			grpc.MaxCallRecvMsgSize(criMaxMsg), grpc.MaxCallSendMsgSize(criMaxMsg)))
	if err != nil {
		return nil, fmt.Errorf("containerd's CRI at %s: %w", containerdAddress, err)
	}
	return &criProxy{backend: conn, creds: creds}, nil
}

func (p *criProxy) server() *grpc.Server {
	return grpc.NewServer(grpc.CustomCodec(rawCodec{}), grpc.UnknownServiceHandler(p.forward),
		grpc.MaxRecvMsgSize(criMaxMsg), grpc.MaxSendMsgSize(criMaxMsg))
}

// forwarded: request metadata that is not grpc's own.
func forwarded(md metadata.MD) metadata.MD {
	out := metadata.MD{}
	for k, v := range md {
		if strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-") ||
			k == "content-type" || k == "user-agent" || k == "te" {
			continue
		}
		out[k] = v
	}
	return out
}

// forward one call, of any method: the caller's messages to containerd
// (a PullImage's read first), containerd's messages, headers, trailers
// and status back.
func (p *criProxy) forward(_ interface{}, in grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(in)
	if !ok {
		return status.Error(codes.Internal, "CRI proxy: no method")
	}
	md, _ := metadata.FromIncomingContext(in.Context())
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(in.Context(), forwarded(md)))
	defer cancel()
	out, err := p.backend.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return err
	}
	// The undo of a PullImage's credentials, should containerd fail it.
	undo := make(chan func(), 1)
	go func() {
		for first := true; ; first = false {
			var m rawFrame
			if err := in.RecvMsg(&m); err != nil {
				if errors.Is(err, io.EOF) {
					_ = out.CloseSend()
				} else {
					cancel()
				}
				return
			}
			if first && (method == pullImageV1 || method == pullImageV1alpha2) {
				undo <- p.observePull(in.Context(), m.data)
			}
			if out.SendMsg(&m) != nil {
				return // out.RecvMsg says why
			}
		}
	}()
	for first := true; ; first = false {
		var m rawFrame
		if err := out.RecvMsg(&m); err != nil {
			in.SetTrailer(out.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			select {
			case u := <-undo:
				if u != nil {
					u()
				}
			default:
			}
			return err
		}
		if first {
			if hdr, err := out.Header(); err == nil {
				if err := in.SendHeader(hdr); err != nil {
					return err
				}
			}
		}
		if err := in.SendMsg(&m); err != nil {
			return err
		}
	}
}

// observePull records a PullImage's credentials before containerd pulls,
// so that the snapshotter's mounts during that pull have them. A request
// that does not decode is forwarded all the same: containerd answers it.
func (p *criProxy) observePull(ctx context.Context, msg []byte) (undo func()) {
	r, err := decodePullImage(msg)
	if err != nil {
		log.G(ctx).WithError(err).Warn("ferry: CRI proxy")
		return nil
	}
	return p.creds.record(ctx, r)
}

// serveCRI runs the proxy on @address until ctx ends.
func serveCRI(ctx context.Context, address, containerdAddress string, creds *criCreds) error {
	p, err := newCRIProxy(containerdAddress, creds)
	if err != nil {
		return err
	}
	defer p.backend.Close()
	l, err := listen(address)
	if err != nil {
		return err
	}
	srv := p.server()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case <-ctx.Done():
		srv.Stop()
		return nil
	case err := <-errc:
		return err
	}
}
