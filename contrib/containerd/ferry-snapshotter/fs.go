// SPDX-License-Identifier: MIT

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/log"
	refdocker "github.com/containerd/containerd/reference/docker"
	"github.com/moby/sys/mountinfo"
	"github.com/sirupsen/logrus"
)

const (
	ferrydTimeout       = 10 * time.Minute // a mount fetches the bootstrap first
	ferrydUmountTimeout = time.Minute
	recordName          = "ferry.json"
)

// A bootstrap snapshot that could not be mounted again is tried again when
// a container needs it, at most this often.
var remountBackoff = 10 * time.Second

// A ferryd killed is replaced by its mounts' keepers' successor, which
// takes each mount over within seconds (docs/ARCHITECTURE.md, "Failover
// and upgrade"); until then ferryd does not answer, or answers without
// the mount, or lists it as still being mounted. A mount the kernel still
// has is waited for this long before it is taken for dead and mounted
// again: detaching it sooner cuts the running containers off their files
// (the successor finds no mount to take over). A FUSE mount whose
// connection the kernel ended is dead at once (fuseAborted).
var takeoverWait = 10 * time.Second

const takeoverPoll = 200 * time.Millisecond

// How long fuseAborted waits for statfs: an ended connection answers at once.
const fuseProbeWait = 100 * time.Millisecond

// record is what a ferry snapshot was verified and committed as, kept in
// its snapshot directory (ROOT/snapshots/ID/ferry.json, removed with it):
// a restart mounts exactly this image again, by manifest digest, so that
// neither a tag moved since nor a registry down changes or stops it.
type record struct {
	Kind      string `json:"kind"`                // blob, bootstrap, index-layer or index
	Chain     string `json:"chain"`               // the chain ID it is committed as
	Layer     string `json:"layer"`               // its layer's digest
	Image     string `json:"image,omitempty"`     // bootstrap, index: docker://REPO@MANIFEST mounted
	Asked     string `json:"asked,omitempty"`     // bootstrap, index: the image as first asked of ferryd
	Manifest  string `json:"manifest,omitempty"`  // the manifest's digest (not for a blob)
	Bootstrap string `json:"bootstrap,omitempty"` // bootstrap, index: the raw bootstrap's digest
	Index     string `json:"index,omitempty"`     // index, index-layer: the ferry index's manifest
	Ref       string `json:"ref,omitempty"`       // the puller's reference, for messages
}

// mounted: a snapshot that is ferryd's mount (else an empty directory).
func (r *record) mounted() bool { return r.Kind == kindBootstrap || r.Kind == kindIndex }

// mountState serialises (re)mounting one bootstrap snapshot and remembers
// why the last attempt failed.
type mountState struct {
	mu      sync.Mutex
	err     error
	lastTry time.Time
}

// ferryFS is the snapshot package's FileSystem. A data blob's snapshot is
// an empty directory; a bootstrap's is ferryd's mount of the image, made
// in ROOT/mounts/ID, to which ROOT/snapshots/ID/fs is a symbolic link: the
// snapshot package force-unmounts everything under ROOT/snapshots when it
// starts, which would cut running containers off their files. Any other
// layer fails Mount, so that the snapshotter falls back to an ordinary
// snapshot containerd unpacks.
type ferryFS struct {
	c         config
	fetch     json.RawMessage // ferryd's "fetch" options (auths as an authfile)
	creds     *criCreds       // kubelet's pull secrets, from the CRI proxy
	restoring bool            // during NewSnapshotter: Mount restores

	mu         sync.Mutex
	byChain    map[string]string // verified committed chain ID -> snapshot ID
	unverified map[string]bool   // committed ferry chain IDs without a record
	states     map[string]*mountState
	failed     map[string]error // snapshot ID -> why it is not available
	probes     probeCache       // ferryd's answers about indexed images
}

func newFerryFS(c config, fetch json.RawMessage) (*ferryFS, error) {
	f := &ferryFS{c: c, fetch: fetch, creds: newCRICreds(), byChain: map[string]string{}, unverified: map[string]bool{},
		states: map[string]*mountState{}, failed: map[string]error{}}
	if err := os.MkdirAll(filepath.Join(c.Root, "mounts"), 0700); err != nil {
		return nil, err
	}
	ids, err := os.ReadDir(filepath.Join(c.Root, "snapshots"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range ids {
		if rec, err := f.readRecord(e.Name()); err == nil && rec != nil {
			f.byChain[rec.Chain] = e.Name()
		}
	}
	return f, nil
}

func (f *ferryFS) log(ctx context.Context) *logrus.Entry { return log.G(ctx) }

// The snapshot ID of the mount point ROOT/snapshots/ID/fs.
func snapshotID(mountpoint string) string { return filepath.Base(filepath.Dir(mountpoint)) }

func (f *ferryFS) mountDir(id string) string { return filepath.Join(f.c.Root, "mounts", id) }

func (f *ferryFS) recordPath(id string) string {
	return filepath.Join(f.c.Root, "snapshots", id, recordName)
}

// readRecord: nil, nil when the snapshot has none.
func (f *ferryFS) readRecord(id string) (*record, error) {
	data, err := os.ReadFile(f.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil || rec.Chain == "" ||
		(rec.Kind != kindBlob && rec.Kind != kindBootstrap && rec.Kind != kindIndexLayer &&
			rec.Kind != kindIndex) ||
		(rec.Kind != kindBlob && rec.Manifest == "") {
		return nil, fmt.Errorf("%s: not a ferry snapshot record", f.recordPath(id))
	}
	return &rec, nil
}

func (f *ferryFS) writeRecord(id string, rec *record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	path := f.recordPath(id)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	f.mu.Lock()
	if _, ok := f.byChain[rec.Chain]; !ok {
		f.byChain[rec.Chain] = id
	}
	f.mu.Unlock()
	return nil
}

// verified: the committed snapshot @chain is one this snapshotter verified.
func (f *ferryFS) verified(chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.byChain[chain]; ok {
		return nil
	}
	return errUnverified
}

var errUnverified = errors.New("committed without verification by an earlier ferry-snapshotter: remove the images that use it (ctr -n NAMESPACE images rm; containerd's gc then removes the snapshot) and pull them again")

// failure: why the ferry snapshot named @name (a chain ID) is unavailable.
func (f *ferryFS) failure(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id, ok := f.byChain[name]; ok {
		return f.failed[id]
	}
	if f.unverified[name] {
		return errUnverified
	}
	return nil
}

func (f *ferryFS) setFailure(id string, err error) {
	f.mu.Lock()
	if err != nil {
		f.failed[id] = err
	} else {
		delete(f.failed, id)
	}
	f.mu.Unlock()
}

func (f *ferryFS) state(id string) *mountState {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.states[id]
	if st == nil {
		st = &mountState{}
		f.states[id] = st
	}
	return st
}

// linkMount makes the snapshot's fs a symbolic link to the ferry mount.
func linkMount(mountpoint, dir string) error {
	if t, err := os.Readlink(mountpoint); err == nil && t == dir {
		return nil
	}
	if err := os.Remove(mountpoint); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Symlink(dir, mountpoint)
}

func (f *ferryFS) Mount(ctx context.Context, mountpoint string, labels map[string]string) error {
	id := snapshotID(mountpoint)
	a := admissionOf(ctx)
	if a == nil && f.restoring {
		f.restore(ctx, mountpoint, id, labels)
		return nil
	}
	if a == nil {
		return errors.New("not a ferry layer")
	}
	switch a.kind {
	case kindBlob:
		a.err = f.writeRecord(id, &record{Kind: kindBlob, Chain: a.target.String(),
			Layer: a.layer.String(), Ref: a.ref})
	case kindIndexLayer:
		a.err = f.writeRecord(id, &record{Kind: kindIndexLayer, Chain: a.target.String(),
			Layer: a.layer.String(), Manifest: a.pin, Index: a.index, Ref: a.ref})
	default:
		a.err = f.mountBootstrap(ctx, mountpoint, id, a)
	}
	return a.err
}

func (f *ferryFS) mountBootstrap(ctx context.Context, mountpoint, id string, a *admission) error {
	dir := f.mountDir(id)
	if err := os.MkdirAll(dir, 0700); err != nil {
		return err
	}
	f.log(ctx).Infof("ferry: mounting %s for chain %s at %s (mode %s)", a.image, a.target, dir, f.c.Mode)
	rep, err := f.mount(ctx, a.image, a.pin, a.index, dir)
	if err == nil && a.kind == kindIndex {
		err = a.checkIndex(rep.ImageDigest, rep.BootstrapDigest)
	} else if err == nil {
		err = a.checkBootstrap(rep.ImageDigest, rep.BootstrapDigest)
	}
	if err == nil {
		err = f.writeRecord(id, &record{Kind: a.kind, Chain: a.target.String(),
			Layer: a.layer.String(), Image: "docker://" + repoOf(a.ref) + "@" + rep.ImageDigest,
			Asked: a.image, Manifest: rep.ImageDigest, Bootstrap: rep.BootstrapDigest,
			Index: a.index, Ref: a.ref})
	}
	if err == nil {
		err = linkMount(mountpoint, dir)
	}
	if err != nil {
		if rep != nil {
			_ = f.umount(dir, true)
		}
		os.Remove(dir)
		f.log(ctx).WithError(err).Warnf("ferry: refused %s for chain %s", a.image, a.target)
	}
	return err
}

// restore is Mount at start: a bootstrap snapshot is mounted again in the
// background (a container that needs it meanwhile waits in Check); one
// that cannot be is reported and fails its containers, never the start.
func (f *ferryFS) restore(ctx context.Context, mountpoint, id string, labels map[string]string) {
	rec, err := f.readRecord(id)
	if err == nil && rec == nil && ferryKind(labels) != "" {
		err = errUnverified
		f.mu.Lock()
		f.unverified[labels[labelTarget]] = true
		f.mu.Unlock()
	}
	if err != nil {
		f.log(ctx).WithError(err).Errorf("ferry: snapshot %s cannot be restored", id)
		f.setFailure(id, err)
		return
	}
	if rec == nil || !rec.mounted() {
		return
	}
	st := f.state(id)
	st.mu.Lock()
	go func() {
		defer st.mu.Unlock()
		if err := f.ensureLocked(ctx, st, mountpoint, id, rec); err != nil {
			f.log(ctx).WithError(err).Errorf("ferry: snapshot %s (chain %s) not restored; its containers fail until it can be mounted", id, rec.Chain)
		} else {
			f.log(ctx).Infof("ferry: restored %s (chain %s)", rec.Image, rec.Chain)
		}
	}()
}

// ensureLocked (st.mu held): the bootstrap snapshot is mounted, as it was
// verified; mounted again by manifest digest if nothing serves it. While
// ferryd does not answer, the mount is left alone and the snapshot is
// unavailable.
func (f *ferryFS) ensureLocked(ctx context.Context, st *mountState, mountpoint, id string, rec *record) error {
	dir := f.mountDir(id)
	served, err := f.awaitServed(ctx, dir, rec)
	if err != nil {
		st.err = fmt.Errorf("ferry image %s (chain %s) is unavailable: %w", rec.Image, rec.Chain, err)
		f.setFailure(id, st.err)
		return st.err
	}
	if served {
		st.err = linkMount(mountpoint, dir)
		f.setFailure(id, st.err)
		return st.err
	}
	if st.err != nil && time.Since(st.lastTry) < remountBackoff {
		return st.err
	}
	st.lastTry = time.Now()
	st.err = f.remount(ctx, mountpoint, dir, rec)
	f.setFailure(id, st.err)
	return st.err
}

func (f *ferryFS) remount(ctx context.Context, mountpoint, dir string, rec *record) error {
	// A mount ferryd still lists there is stale (ferryd restarted, or it
	// was unmounted behind its back): forget it first.
	_ = f.umount(dir, false)
	if err := os.MkdirAll(dir, 0700); err != nil {
		return err
	}
	f.log(ctx).Infof("ferry: mounting %s again at %s (mode %s)", rec.Image, dir, f.c.Mode)
	rep, err := f.mount(ctx, rec.Image, rec.Manifest, rec.Index, dir)
	if err == nil && rep.BootstrapDigest != rec.Bootstrap {
		_ = f.umount(dir, false)
		err = fmt.Errorf("ferryd mounted bootstrap %s, not %s", rep.BootstrapDigest, rec.Bootstrap)
	}
	if err == nil {
		err = linkMount(mountpoint, dir)
	}
	if err != nil {
		return fmt.Errorf("ferry image %s (chain %s) cannot be mounted: %w", rec.Image, rec.Chain, err)
	}
	return nil
}

// Check: a ferry snapshot is one this snapshotter verified, and a
// bootstrap's is mounted (again, if ferryd lost it).
func (f *ferryFS) Check(ctx context.Context, mountpoint string, labels map[string]string) error {
	id := snapshotID(mountpoint)
	rec, err := f.readRecord(id)
	if err == nil && rec == nil && ferryKind(labels) != "" {
		err = errUnverified
	}
	if err != nil {
		return fmt.Errorf("ferry snapshot %s: %w", id, err)
	}
	if rec == nil || !rec.mounted() {
		return nil
	}
	st := f.state(id)
	st.mu.Lock()
	defer st.mu.Unlock()
	return f.ensureLocked(ctx, st, mountpoint, id, rec)
}

// Unmount (Remove, and cleaning up): a bootstrap's mount is unmounted and
// ferryd releases the image's record in its cache, so that gc can reclaim
// its blobs once no other mount serves it.
func (f *ferryFS) Unmount(ctx context.Context, mountpoint string) error {
	id := snapshotID(mountpoint)
	rec, _ := f.readRecord(id)
	f.mu.Lock()
	if rec != nil && f.byChain[rec.Chain] == id {
		delete(f.byChain, rec.Chain)
	}
	delete(f.states, id)
	delete(f.failed, id)
	f.mu.Unlock()
	if rec == nil {
		// An empty directory, or a mount of an earlier snapshotter.
		return f.umount(mountpoint, true)
	}
	if !rec.mounted() {
		return nil
	}
	dir := f.mountDir(id)
	err := f.umount(dir, true)
	if err == nil {
		os.Remove(dir)
	}
	return err
}

// umount asks ferryd to unmount (and with @release, to release the image's
// record); a mount point that is not ferryd's (ENOENT) is detached directly
// if something is still mounted there.
func (f *ferryFS) umount(mountpoint string, release bool) error {
	_, err := f.call(map[string]interface{}{"op": "umount", "mountpoint": mountpoint,
		"release": release}, ferrydUmountTimeout)
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

type mountReply struct {
	ImageDigest     string `json:"imageDigest"`
	BootstrapDigest string `json:"bootstrapDigest"`
}

// fetchFor: ferryd's "fetch" options for a mount of @image (docker://REF):
// the configuration's, the hosts of its registry from the hosts directory,
// and the credentials kubelet last pulled its repository with, which
// ferryd sends to that registry only.
func (f *ferryFS) fetchFor(ctx context.Context, image string) (json.RawMessage, error) {
	ref := strings.TrimPrefix(image, "docker://")
	named, err := refdocker.ParseDockerRef(ref)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", image, err)
	}
	var hosts []ferryHost
	if f.c.HostsDir != "" {
		if hosts, err = registryHosts(ctx, f.c.HostsDir, refdocker.Domain(named)); err != nil {
			return nil, err
		}
	}
	creds := f.creds.lookup(ref)
	if hosts == nil && creds == "" {
		return f.fetch, nil
	}
	opts := map[string]interface{}{}
	if len(f.fetch) > 0 {
		if err := json.Unmarshal(f.fetch, &opts); err != nil {
			return nil, err
		}
	}
	if hosts != nil {
		opts["hosts"] = hosts
	}
	if creds != "" {
		opts["creds"] = creds
	}
	return json.Marshal(opts)
}

// mount asks ferryd to mount @image (by manifest digest @pin, and through
// ferry index @index, if given) at @dir; the answer names what it
// verified and mounted.
func (f *ferryFS) mount(ctx context.Context, image, pin, index, dir string) (*mountReply, error) {
	fetch, err := f.fetchFor(ctx, image)
	if err != nil {
		return nil, err
	}
	req := map[string]interface{}{
		"op": "mount", "image": image, "mountpoint": dir,
		"cacheDir": f.c.CacheDir, "mode": f.c.Mode,
		// Setuid binaries work inside the container, as on an overlay
		// snapshot; device nodes come from the runtime (docs/SECURITY.md).
		"suid": true, "dev": false,
	}
	if pin != "" {
		req["imageDigest"] = pin
	}
	if index != "" {
		req["indexDigest"] = index
	}
	if len(fetch) > 0 {
		req["fetch"] = fetch
	}
	answer, err := f.call(req, ferrydTimeout)
	if err != nil {
		return nil, err
	}
	var rep mountReply
	if err := json.Unmarshal(answer, &rep); err != nil {
		return nil, fmt.Errorf("ferryd at %s: mount answer: %w", f.c.FerrydSocket, err)
	}
	return &rep, nil
}

// What serves a bootstrap snapshot's mount (served).
type liveness int

const (
	mountGone    liveness = iota // nothing: mount it again
	mountServed                  // ferryd, and it is mounted there
	mountPending                 // the kernel has it; ferryd does not serve it yet
)

// served: whether ferryd serves @rec's image at @dir (as asked first, or
// again by digest: ferryd pins a mount to the manifest it opened) and it
// is mounted there; an error when ferryd does not answer.
func (f *ferryFS) served(dir string, rec *record) (liveness, error) {
	resp, err := f.call(map[string]interface{}{"op": "list"}, ferrydUmountTimeout)
	if err != nil {
		return mountPending, err
	}
	var list struct {
		Mounts []struct {
			Mountpoint string `json:"mountpoint"`
			Image      string `json:"image"`
			State      string `json:"state"`
		} `json:"mounts"`
	}
	if err := json.Unmarshal(resp, &list); err != nil {
		return mountPending, fmt.Errorf("ferryd at %s: list answer: %w", f.c.FerrydSocket, err)
	}
	mounted, err := mountinfo.Mounted(dir)
	if err != nil {
		return mountPending, err
	}
	for _, m := range list.Mounts {
		if m.Mountpoint != dir {
			continue
		}
		switch {
		case m.Image != rec.Image && m.Image != rec.Asked:
			return mountGone, nil
		case m.State != "mounted":
			return mountPending, nil // being taken over, or unmounted
		case mounted:
			return mountServed, nil
		}
		return mountGone, nil // detached behind ferryd's back
	}
	if mounted && !fuseAborted(dir) {
		return mountPending, nil // its keeper has not handed it over yet
	}
	return mountGone, nil
}

// A statfs of a mount directory, and its result once done is closed.
type statfsProbe struct {
	done chan struct{}
	err  error
}

// The statfs probes still waiting, by directory: a poll joins the one in
// flight instead of sending the connection another request.
var statfsProbes sync.Map

// fuseAborted: @dir is a FUSE mount whose connection the kernel ended,
// which it does once every /dev/fuse descriptor is closed: ferryd and the
// mount's keeper are both gone, and no successor can take the mount over.
// statfs then fails with ENOTCONN at once; on a live connection that no
// ferryd serves yet it waits for one, so it is not waited for (it ends
// when a successor answers, or the keeper gives up).
func fuseAborted(dir string) bool {
	v, running := statfsProbes.LoadOrStore(dir, &statfsProbe{done: make(chan struct{})})
	p := v.(*statfsProbe)
	if !running {
		go func() {
			var st syscall.Statfs_t
			p.err = syscall.Statfs(dir, &st)
			statfsProbes.Delete(dir)
			close(p.done)
		}()
	}
	select {
	case <-p.done:
		return errors.Is(p.err, syscall.ENOTCONN)
	case <-time.After(fuseProbeWait):
		return false
	}
}

// awaitServed: whether ferryd serves the mount (served), waiting at most
// takeoverWait while it is pending or ferryd does not answer; an error
// when ferryd never answered.
func (f *ferryFS) awaitServed(ctx context.Context, dir string, rec *record) (bool, error) {
	deadline := time.Now().Add(takeoverWait)
	for {
		l, err := f.served(dir, rec)
		if err == nil && l != mountPending {
			return l == mountServed, nil
		}
		if !time.Now().Before(deadline) {
			return false, err
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(takeoverPoll):
		}
	}
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
