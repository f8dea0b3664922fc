// SPDX-License-Identifier: MIT

// ferry-snapshotter is a containerd proxy snapshotter (docs/containerd.md)
// on stargz-snapshotter's generic remote-snapshot package. It serves no
// image data itself: the bootstrap layer of a ferry image is mounted by
// ferryd, asked over its control socket; data-blob layers are empty
// committed snapshots; other layers are ordinary overlay snapshots that
// containerd unpacks. What it commits and mounts, and why that is safe on
// a shared node, is trust.go's (docs/SECURITY.md).
package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/log"
	"github.com/containerd/stargz-snapshotter/snapshot"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
)

// config is the JSON file given with -config; every field is optional.
type config struct {
	Address      string `json:"address"`      // the gRPC socket containerd dials
	Root         string `json:"root"`         // snapshots and their metadata
	FerrydSocket string `json:"ferrydSocket"` // ferryd's control socket
	CacheDir     string `json:"cacheDir"`     // ferryd's chunk cache for these mounts
	Mode         string `json:"mode"`         // auto, fanotify, cachefiles or fuse
	// containerd namespace -> the puller whose labels name the image
	// there: "cri" or "rpull" (trust.go).
	Pullers map[string]string `json:"pullers"`
	// Registry credentials per host, as in a docker config file.
	Auths    map[string]authEntry `json:"auths,omitempty"`
	LogLevel string               `json:"logLevel"`        // logrus level: debug, info, warn, error
	Fetch    json.RawMessage      `json:"fetch,omitempty"` // ferryd's "fetch" options but creds
	// containerd's hosts directory (its CRI registry config_path): each
	// mount's registry hosts (hosts.go); "" reads none.
	HostsDir string `json:"hostsDir"`
	// The CRI proxy for kubelet's image service endpoint, "": none
	// (cri.go), and containerd's socket, where it forwards.
	CRIAddress        string `json:"criAddress"`
	ContainerdAddress string `json:"containerdAddress"`
	// Repositories (or prefixes: a registry, REGISTRY/PATH) whose ferry
	// indexes are trusted: their ordinary images are mounted lazily when
	// one is attached (index.go); none: every ordinary image is unpacked.
	Indexes []string `json:"indexes,omitempty"`
}

// authEntry is one host's entry of a docker config file's "auths".
type authEntry struct {
	Auth          string `json:"auth,omitempty"` // base64 of USER:PASS
	Username      string `json:"username,omitempty"`
	Password      string `json:"password,omitempty"`
	IdentityToken string `json:"identitytoken,omitempty"`
}

func defaults() config {
	return config{
		Address:      "/run/ferry/snapshotter.sock",
		Root:         "/var/lib/ferry-snapshotter",
		FerrydSocket: "/run/ferry/ferryd.sock",
		CacheDir:     "/var/lib/ferry/cache", // ferry's own default: `ferry cache ls` shows it
		Mode:         "auto",
		Pullers:      map[string]string{"k8s.io": pullerCRI},
		LogLevel:     "info",
		HostsDir:     "/etc/containerd/certs.d",
		// The proxy is off until criAddress names its socket.
		ContainerdAddress: "/run/containerd/containerd.sock",
	}
}

func loadConfig(path string) (config, error) {
	c := defaults()
	if path == "" {
		return c, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	c.Pullers = nil
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("config %s: %w (see docs/containerd.md for its fields)", path, err)
	}
	if c.Pullers == nil {
		c.Pullers = defaults().Pullers
	}
	if err := c.check(); err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

func (c *config) check() error {
	for _, p := range []string{c.Address, c.Root, c.FerrydSocket, c.CacheDir, c.ContainerdAddress} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("%q is not an absolute path", p)
		}
	}
	for _, p := range []string{c.HostsDir, c.CRIAddress} {
		if p != "" && !filepath.IsAbs(p) {
			return fmt.Errorf("%q is not an absolute path", p)
		}
	}
	if c.CRIAddress != "" && (c.CRIAddress == c.Address || c.CRIAddress == c.ContainerdAddress) {
		return fmt.Errorf("criAddress %s is another socket's", c.CRIAddress)
	}
	for ns, p := range c.Pullers {
		if p != pullerCRI && p != pullerRpull {
			return fmt.Errorf("pullers: namespace %q: %q is no puller ferry-snapshotter knows (cri, rpull)", ns, p)
		}
	}
	for host, a := range c.Auths {
		if host == "" || strings.ContainsAny(host, "/ \t") {
			return fmt.Errorf("auths: %q is not a registry host (HOST or HOST:PORT)", host)
		}
		if a.Auth != "" {
			if _, err := base64.StdEncoding.DecodeString(a.Auth); err != nil {
				return fmt.Errorf("auths: %s: \"auth\" is not base64 of USER:PASS: %w", host, err)
			}
		} else if (a.Username == "" || a.Password == "") && a.IdentityToken == "" {
			return fmt.Errorf("auths: %s: give \"auth\", \"username\" and \"password\", or \"identitytoken\"", host)
		}
	}
	if _, err := logrus.ParseLevel(c.LogLevel); err != nil {
		return fmt.Errorf("logLevel: %w", err)
	}
	_, err := c.fetchOptions()
	return err
}

// fetchOptions is ferryd's "fetch" object for every mount: the config's,
// with the auths as a docker config file ferryd reads per registry host.
// A "creds" would send one secret to every registry an image names.
func (c *config) fetchOptions() (json.RawMessage, error) {
	opts := map[string]json.RawMessage{}
	if len(c.Fetch) > 0 {
		if err := json.Unmarshal(c.Fetch, &opts); err != nil {
			return nil, fmt.Errorf("fetch: %w", err)
		}
	}
	if _, ok := opts["hosts"]; ok && c.HostsDir != "" {
		return nil, fmt.Errorf("fetch.hosts and hostsDir (%s) both name registry hosts: put them in hosts.toml files there, or set hostsDir to \"\" (docs/containerd.md)", c.HostsDir)
	}
	if _, ok := opts["creds"]; ok {
		return nil, errors.New("fetch.creds sends one secret to every registry any image names; name credentials per registry host in \"auths\" ({\"auths\": {\"HOST[:PORT]\": {\"auth\": BASE64(USER:PASS)}}}, docker's config shape) or in a docker config file named by fetch.authfile (docs/containerd.md)")
	}
	if len(c.Auths) == 0 {
		return c.Fetch, nil
	}
	if _, ok := opts["authfile"]; ok {
		return nil, errors.New("both auths and fetch.authfile: give the credentials in one of them")
	}
	path, err := json.Marshal(c.authFile())
	if err != nil {
		return nil, err
	}
	opts["authfile"] = path
	return json.Marshal(opts)
}

func (c *config) authFile() string { return filepath.Join(c.Root, "auths.json") }

// writeAuths writes the auths as a docker config file only root reads.
func (c *config) writeAuths() error {
	if len(c.Auths) == 0 {
		return nil
	}
	data, err := json.Marshal(map[string]interface{}{"auths": c.Auths})
	if err != nil {
		return err
	}
	tmp := c.authFile() + ".tmp"
	os.Remove(tmp)
	if err := os.WriteFile(tmp, data, 0600); err != nil {
		return fmt.Errorf("credentials file %s: %w", tmp, err)
	}
	return os.Rename(tmp, c.authFile())
}

// serve runs the snapshotter on a listening socket until ctx ends. With
// @closeAtEnd its state is closed then, which (stargz's Close) unmounts and
// deletes every snapshot: for tests. The daemon leaves its snapshots and
// ferryd's mounts alone when it stops, so that containers keep running and
// a restart finds the remote snapshots mounted, or mounts them again.
func serve(ctx context.Context, c config, closeAtEnd bool) error {
	fetch, err := c.fetchOptions()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.Root, 0700); err != nil {
		return fmt.Errorf("snapshotter in %s: %w", c.Root, err)
	}
	if err := c.writeAuths(); err != nil {
		return err
	}
	fs, err := newFerryFS(c, fetch)
	if err != nil {
		return fmt.Errorf("snapshotter in %s: %w", c.Root, err)
	}
	fs.restoring = true
	sn, err := snapshot.NewSnapshotter(ctx, c.Root, fs)
	fs.restoring = false
	if err != nil {
		return fmt.Errorf("snapshotter in %s: %w", c.Root, err)
	}
	if closeAtEnd {
		defer sn.Close()
	}
	l, err := listen(c.Address)
	if err != nil {
		return err
	}
	rpc := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(&trusted{sn, fs}))
	errc := make(chan error, 2)
	go func() { errc <- rpc.Serve(l) }()
	if c.CRIAddress != "" {
		proxyCtx, stopProxy := context.WithCancel(ctx)
		defer stopProxy()
		go func() { errc <- serveCRI(proxyCtx, c.CRIAddress, c.ContainerdAddress, fs.creds) }()
	}
	select {
	case <-ctx.Done():
		rpc.Stop()
		return nil
	case err := <-errc:
		return err
	}
}

// listen on a unix socket at @path (mode 0600), replacing a stale one.
func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0700); err != nil {
		return nil, fmt.Errorf("socket directory of %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("stale socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return l, nil
}

// version is the release, from the top-level VERSION file (go.sh's -ldflags -X).
var version = "unknown"

func main() {
	showVersion := flag.Bool("version", false, "print the release and the image format it mounts, and exit")
	cfgPath := flag.String("config", "", "JSON configuration file (docs/containerd.md)")
	address := flag.String("address", "", "gRPC socket (overrides the config's address)")
	root := flag.String("root", "", "state directory (overrides the config's root)")
	level := flag.String("log-level", "", "debug, info, warn or error (overrides the config's logLevel)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: ferry-snapshotter [-config FILE] [-address SOCKET] [-root DIR] [-log-level LEVEL]\n\n"+
			"A containerd proxy snapshotter that lazily mounts ferry images through ferryd.\n"+
			"containerd config: [proxy_plugins.ferry] type = \"snapshot\" address = SOCKET\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *showVersion {
		fmt.Printf("ferry-snapshotter %s\nimage formats: ferry format 3 (layers labelled containerd.io/snapshot/ferry.*,\n"+
			"diff_ids checked; ferry convert upgrades formats 1 and 2); ferryd %s or later\n"+
			"reads the bootstraps and their sections ('ferryd --version' lists them)\n", version, version)
		return
	}
	c, err := loadConfig(*cfgPath)
	if err == nil && *address != "" {
		c.Address = *address
	}
	if err == nil && *root != "" {
		c.Root = *root
	}
	if err == nil && *level != "" {
		c.LogLevel = *level
	}
	if err == nil {
		err = c.check()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ferry-snapshotter: %v\n", err)
		os.Exit(2)
	}
	lvl, _ := logrus.ParseLevel(c.LogLevel)
	logrus.SetLevel(lvl)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.G(ctx).Infof("ferry-snapshotter: serving %s, state in %s, ferryd at %s", c.Address, c.Root, c.FerrydSocket)
	if err := serve(ctx, c, false); err != nil {
		fmt.Fprintf(os.Stderr, "ferry-snapshotter: %v\n", err)
		os.Exit(1)
	}
}
