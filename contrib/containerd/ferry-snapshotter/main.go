// SPDX-License-Identifier: MIT

// ferry-snapshotter is a containerd proxy snapshotter (docs/containerd.md)
// on stargz-snapshotter's generic remote-snapshot package. It serves no
// image data itself: the bootstrap layer of a ferry image is mounted by
// ferryd, asked over its control socket; data-blob layers are empty
// committed snapshots; other layers are ordinary overlay snapshots that
// containerd unpacks.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/log"
	"github.com/containerd/stargz-snapshotter/snapshot"
	"google.golang.org/grpc"
)

// config is the JSON file given with -config; every field is optional.
type config struct {
	Address      string          `json:"address"`      // the gRPC socket containerd dials
	Root         string          `json:"root"`         // snapshots and their metadata
	FerrydSocket string          `json:"ferrydSocket"` // ferryd's control socket
	CacheDir     string          `json:"cacheDir"`     // ferryd's chunk cache for these mounts
	Mode         string          `json:"mode"`         // auto, fanotify, cachefiles or fuse
	Fetch        json.RawMessage `json:"fetch"`        // ferryd's "fetch" options, passed as is
}

func defaults() config {
	return config{
		Address:      "/run/ferry/snapshotter.sock",
		Root:         "/var/lib/ferry-snapshotter",
		FerrydSocket: "/run/ferry/ferryd.sock",
		CacheDir:     "/var/cache/ferry",
		Mode:         "auto",
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
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("config %s: %w (see docs/containerd.md for its fields)", path, err)
	}
	for _, p := range []string{c.Address, c.Root, c.FerrydSocket, c.CacheDir} {
		if !filepath.IsAbs(p) {
			return c, fmt.Errorf("config %s: %q is not an absolute path", path, p)
		}
	}
	return c, nil
}

// serve runs the snapshotter on a listening socket until ctx ends. With
// @closeAtEnd its state is closed then, which (stargz's Close) unmounts and
// deletes every snapshot: for tests. The daemon leaves its snapshots and
// ferryd's mounts alone when it stops, so that containers keep running and
// a restart mounts the remote snapshots again.
func serve(ctx context.Context, c config, closeAtEnd bool) error {
	sn, err := snapshot.NewSnapshotter(ctx, c.Root, newFerryFS(c))
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
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(sn))
	errc := make(chan error, 1)
	go func() { errc <- rpc.Serve(l) }()
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
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: ferry-snapshotter [-config FILE] [-address SOCKET] [-root DIR]\n\n"+
			"A containerd proxy snapshotter that lazily mounts ferry images through ferryd.\n"+
			"containerd config: [proxy_plugins.ferry] type = \"snapshot\" address = SOCKET\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *showVersion {
		fmt.Printf("ferry-snapshotter %s\nimage formats: ferry format 2 (layers labelled containerd.io/snapshot/ferry.*);\n"+
			"ferryd reads the bootstraps and their sections ('ferryd --version' lists them)\n", version)
		return
	}
	c, err := loadConfig(*cfgPath)
	if err == nil && *address != "" {
		c.Address = *address
	}
	if err == nil && *root != "" {
		c.Root = *root
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ferry-snapshotter: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.G(ctx).Infof("ferry-snapshotter: serving %s, state in %s, ferryd at %s", c.Address, c.Root, c.FerrydSocket)
	if err := serve(ctx, c, false); err != nil {
		fmt.Fprintf(os.Stderr, "ferry-snapshotter: %v\n", err)
		os.Exit(1)
	}
}
