// SPDX-License-Identifier: MIT

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/log"
	"github.com/moby/sys/mountinfo"
)

// Layer labels. containerd passes a layer's "containerd.io/snapshot/"
// annotations as labels; ferry convert writes the first two
// (docs/FORMAT.md 1a), containerd's CRI plugin and ctr-remote the others.
const (
	labelBlob           = "containerd.io/snapshot/ferry.blob"
	labelBootstrap      = "containerd.io/snapshot/ferry.bootstrap"
	labelCRIRef         = "containerd.io/snapshot/cri.image-ref"
	labelCRIManifest    = "containerd.io/snapshot/cri.manifest-digest"
	labelStargzRef      = "containerd.io/snapshot/remote/stargz.reference"
	ferrydTimeout       = 10 * time.Minute // a mount fetches the bootstrap first
	ferrydUmountTimeout = time.Minute
)

// ferryFS is the snapshot package's FileSystem: ferry layers are remote
// snapshots; Mount of any other layer fails, so that the snapshotter falls
// back to an ordinary snapshot containerd unpacks.
type ferryFS struct {
	c config
}

func newFerryFS(c config) *ferryFS { return &ferryFS{c: c} }

// imageRef is what ferryd mounts: docker://REPO@MANIFEST when the labels
// name the manifest (CRI), else docker://REF as pulled (ctr-remote).
func imageRef(labels map[string]string) (string, error) {
	ref, digest := labels[labelCRIRef], labels[labelCRIManifest]
	if ref == "" {
		ref = labels[labelStargzRef]
	}
	if ref == "" {
		return "", fmt.Errorf("a ferry bootstrap layer without %s or %s: pull with CRI's snapshot annotations or ctr-remote image rpull (docs/containerd.md)",
			labelCRIRef, labelStargzRef)
	}
	if digest == "" {
		return "docker://" + ref, nil
	}
	repo := ref
	if i := strings.Index(repo, "@"); i >= 0 {
		repo = repo[:i]
	} else if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return "docker://" + repo + "@" + digest, nil
}

func (f *ferryFS) Mount(ctx context.Context, mountpoint string, labels map[string]string) error {
	if labels[labelBlob] == "true" {
		return nil // its chunks are served through the bootstrap's mount
	}
	if labels[labelBootstrap] != "true" {
		return errors.New("not a ferry layer")
	}
	image, err := imageRef(labels)
	if err != nil {
		return err
	}
	// After a restart the snapshot package has force-unmounted the old
	// mount behind ferryd's back: forget it there first.
	_ = f.umount(mountpoint)
	req := map[string]interface{}{
		"op": "mount", "image": image, "mountpoint": mountpoint,
		"cacheDir": f.c.CacheDir, "mode": f.c.Mode,
		// Setuid binaries work inside the container, as on an overlay
		// snapshot; device nodes come from the runtime (docs/SECURITY.md).
		"suid": true, "dev": false,
	}
	if len(f.c.Fetch) > 0 {
		req["fetch"] = f.c.Fetch
	}
	log.G(ctx).Infof("ferry: mounting %s at %s (mode %s)", image, mountpoint, f.c.Mode)
	_, err = f.call(req, ferrydTimeout)
	return err
}

// Check: the mount is ferryd's and still a mount point.
func (f *ferryFS) Check(ctx context.Context, mountpoint string, labels map[string]string) error {
	if labels[labelBootstrap] != "true" {
		return nil
	}
	resp, err := f.call(map[string]interface{}{"op": "list"}, ferrydUmountTimeout)
	if err != nil {
		return err
	}
	var list struct {
		Mounts []struct {
			Mountpoint string `json:"mountpoint"`
		} `json:"mounts"`
	}
	if err := json.Unmarshal(resp, &list); err != nil {
		return fmt.Errorf("ferryd at %s: list answer: %w", f.c.FerrydSocket, err)
	}
	for _, m := range list.Mounts {
		if m.Mountpoint == mountpoint {
			if ok, err := mountinfo.Mounted(mountpoint); err != nil || !ok {
				return fmt.Errorf("%s: ferryd lists it but it is not mounted", mountpoint)
			}
			return nil
		}
	}
	return fmt.Errorf("%s: not mounted by ferryd at %s", mountpoint, f.c.FerrydSocket)
}

func (f *ferryFS) Unmount(ctx context.Context, mountpoint string) error {
	return f.umount(mountpoint)
}

// umount asks ferryd to unmount; a mount point that is not ferryd's (ENOENT)
// is detached directly if something is still mounted there.
func (f *ferryFS) umount(mountpoint string) error {
	_, err := f.call(map[string]interface{}{"op": "umount", "mountpoint": mountpoint},
		ferrydUmountTimeout)
	var ferr *ferrydError
	if errors.As(err, &ferr) && ferr.errno == int(syscall.ENOENT) {
		err = nil
	}
	if ok, _ := mountinfo.Mounted(mountpoint); ok {
		if uerr := syscall.Unmount(mountpoint, syscall.MNT_DETACH); uerr != nil && err == nil {
			err = fmt.Errorf("unmount %s: %w", mountpoint, uerr)
		}
	}
	return err
}

type ferrydError struct {
	msg   string
	errno int
}

func (e *ferrydError) Error() string { return "ferryd: " + e.msg }

// call sends one request line to ferryd's control socket (cmd/ctl.h) and
// returns the answer line when it says ok.
func (f *ferryFS) call(req map[string]interface{}, timeout time.Duration) (json.RawMessage, error) {
	conn, err := net.DialTimeout("unix", f.c.FerrydSocket, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("ferryd control socket %s: %w (is ferryd running?)", f.c.FerrydSocket, err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	line, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write(append(line, '\n')); err != nil {
		return nil, fmt.Errorf("ferryd at %s: %w", f.c.FerrydSocket, err)
	}
	r := bufio.NewReaderSize(conn, 1<<16)
	answer, err := r.ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("ferryd at %s: no answer to %s: %w", f.c.FerrydSocket, req["op"], err)
	}
	var status struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
		Errno int    `json:"errno"`
	}
	if err := json.Unmarshal(answer, &status); err != nil {
		return nil, fmt.Errorf("ferryd at %s: bad answer: %w", f.c.FerrydSocket, err)
	}
	if !status.OK {
		return nil, &ferrydError{msg: status.Error, errno: status.Errno}
	}
	return answer, nil
}
