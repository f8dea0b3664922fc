// SPDX-License-Identifier: MIT

// cripull pulls an image into containerd the way containerd's CRI plugin
// does with disable_snapshot_annotations = false: unpacking through a
// snapshotter, with the cri.* snapshot labels on every layer
// (snapshotters.AppendInfoHandlerWrapper). ctr 1.6 cannot: its pull
// fetches every blob before unpacking. For tests of ferry-snapshotter.
//
//	cripull -address SOCK -namespace NS -snapshotter ferry [-plain-http] [-user USER:PASS] REF
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/pkg/snapshotters"
	"github.com/containerd/containerd/remotes/docker"
)

func main() {
	address := flag.String("address", "/run/containerd/containerd.sock", "containerd's socket")
	ns := flag.String("namespace", "default", "containerd namespace")
	sn := flag.String("snapshotter", "ferry", "snapshotter to unpack with")
	plain := flag.Bool("plain-http", false, "talk to the registry over http")
	user := flag.String("user", "", "USER:PASS for the registry (as a pull secret)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: cripull [-address SOCK] [-namespace NS] [-snapshotter NAME] [-plain-http] [-user USER:PASS] REF")
		os.Exit(2)
	}
	ref := flag.Arg(0)
	client, err := containerd.New(*address)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cripull: containerd at %s: %v\n", *address, err)
		os.Exit(1)
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), *ns)
	opts := docker.ResolverOptions{PlainHTTP: *plain}
	if u, p, ok := strings.Cut(*user, ":"); ok {
		opts.Hosts = docker.ConfigureDefaultRegistries(
			docker.WithPlainHTTP(func(string) (bool, error) { return *plain, nil }),
			docker.WithAuthorizer(docker.NewDockerAuthorizer(docker.WithAuthCreds(
				func(string) (string, string, error) { return u, p, nil }))))
	}
	resolver := docker.NewResolver(opts)
	img, err := client.Pull(ctx, ref,
		containerd.WithResolver(resolver),
		containerd.WithPullUnpack,
		containerd.WithPullSnapshotter(*sn),
		containerd.WithImageHandlerWrapper(snapshotters.AppendInfoHandlerWrapper(ref)))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cripull: %s: %v\n", ref, err)
		os.Exit(1)
	}
	fmt.Println(img.Target().Digest)
}
