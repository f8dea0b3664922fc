// SPDX-License-Identifier: MIT

package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/snapshots"
	"github.com/opencontainers/go-digest"
)

// What decides which image a ferry layer's snapshot holds (docs/SECURITY.md,
// containerd):
//
//   - containerd names the snapshot by the chain ID of the image config's
//     diff_ids, which the image's author writes. A ferry layer's diff_id is
//     the sha256 of "dev.ferry.blob <digest>" / "dev.ferry.bootstrap
//     <digest>" (docs/FORMAT.md 1a): a data blob's snapshot is empty and
//     committed only when its chain ID is its parent's chain followed by
//     such a blob diff_id, a bootstrap's only when the bootstrap ferryd
//     verified and mounted gives the chain ID containerd asked for. No tar
//     layer hashes to those texts, so these chains never name an image
//     containerd unpacks itself, and a bootstrap's chain names exactly one
//     bootstrap, which pins every byte served.
//   - The image to mount comes only from the labels of the puller that the
//     configuration names for the pull's containerd namespace (the first
//     component of containerd's snapshot key, which no image controls):
//     CRI's cri.* labels, which it overwrites, or ctr-remote's
//     remote/stargz.* ones, which it overwrites. An image's own annotations
//     reach the labels too, so the other puller's keys in a pull mean an
//     image that tries to choose what is mounted: refused.
const (
	labelTarget       = "containerd.io/snapshot.ref"
	labelBlob         = "containerd.io/snapshot/ferry.blob"
	labelBootstrap    = "containerd.io/snapshot/ferry.bootstrap"
	labelCRIPrefix    = "containerd.io/snapshot/cri."
	labelCRIRef       = "containerd.io/snapshot/cri.image-ref"
	labelCRIManifest  = "containerd.io/snapshot/cri.manifest-digest"
	labelCRILayer     = "containerd.io/snapshot/cri.layer-digest"
	labelStargzPrefix = "containerd.io/snapshot/remote/stargz."
	labelStargzRef    = "containerd.io/snapshot/remote/stargz.reference"
	labelStargzLayer  = "containerd.io/snapshot/remote/stargz.digest"
	pullerCRI         = "cri"
	pullerRpull       = "rpull"
	blobDiffIDPrefix  = "dev.ferry.blob "
	bootDiffIDPrefix  = "dev.ferry.bootstrap "
	kindBlob          = "blob"
	kindBootstrap     = "bootstrap"
)

// ferryDiffID is a ferry layer's diff_id (docs/FORMAT.md 1a).
func ferryDiffID(prefix string, d digest.Digest) digest.Digest {
	return digest.FromString(prefix + d.String())
}

// chainNext is the chain ID of a layer with @diffID over the chain @parent
// ("" for a bottom layer), as containerd computes it (identity.ChainID).
func chainNext(parent, diffID digest.Digest) digest.Digest {
	if parent == "" {
		return diffID
	}
	return digest.FromString(parent.String() + " " + diffID.String())
}

// parentChain is the chain ID of the snapshot containerd passed as parent:
// a remote snapshot is committed under its chain ID, an ordinary one under
// containerd's "NAMESPACE/N/CHAINID".
func parentChain(parent string) (digest.Digest, error) {
	if parent == "" {
		return "", nil
	}
	name := parent
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	d, err := digest.Parse(name)
	if err != nil {
		return "", fmt.Errorf("parent snapshot %q is named by no chain ID", parent)
	}
	return d, nil
}

// keyNamespace is the containerd namespace of a snapshot key: containerd's
// metadata store names every snapshot it creates in a backend
// "NAMESPACE/N/KEY" (metadata/snapshot.go, createKey).
func keyNamespace(key string) (string, error) {
	parts := strings.SplitN(key, "/", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" ||
		strings.Trim(parts[1], "0123456789") != "" {
		return "", fmt.Errorf("snapshot key %q is not containerd's NAMESPACE/N/KEY: ferry layers are prepared through containerd", key)
	}
	return parts[0], nil
}

// repoOf is REF without its tag or digest.
func repoOf(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		return ref[:i]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i]
	}
	return ref
}

// admission is what Prepare established for a ferry layer before its
// snapshot is mounted: the FileSystem's Mount gets it through the context
// and leaves its failure in err, for Prepare's answer.
type admission struct {
	kind   string
	target digest.Digest // the chain ID containerd asked for
	parent digest.Digest // the parent's chain ID, "" at the bottom
	layer  digest.Digest // the layer's digest, per the puller
	image  string        // bootstrap, index: what ferryd mounts, docker://REF
	pin    string        // bootstrap, index: the manifest digest it must be, or ""
	ref    string        // the puller's reference, for messages
	// index, index-layer: the ferry index and its bootstrap, as probed
	index, bootstrap string
	err              error
}

type admissionKey struct{}

func withAdmission(ctx context.Context, a *admission) context.Context {
	return context.WithValue(ctx, admissionKey{}, a)
}

func admissionOf(ctx context.Context) *admission {
	a, _ := ctx.Value(admissionKey{}).(*admission)
	return a
}

func ferryKind(labels map[string]string) string {
	switch {
	case labels[labelBootstrap] == "true":
		return kindBootstrap
	case labels[labelBlob] == "true":
		return kindBlob
	}
	return ""
}

// admitPuller checks a Prepare against the puller rules above: the
// namespace's puller, its labels (and none of the other's), the parent's
// chain; the admission names the image the puller named.
func admitPuller(pullers map[string]string, key, parent string, labels map[string]string) (*admission, error) {
	a := &admission{kind: ferryKind(labels)}
	var err error
	if a.target, err = digest.Parse(labels[labelTarget]); err != nil {
		return nil, fmt.Errorf("label %s: %w", labelTarget, err)
	}
	ns, err := keyNamespace(key)
	if err != nil {
		return nil, err
	}
	puller := pullers[ns]
	foreign, refKey, layerKey := labelStargzPrefix, labelCRIRef, labelCRILayer
	switch puller {
	case pullerCRI:
	case pullerRpull:
		foreign, refKey, layerKey = labelCRIPrefix, labelStargzRef, labelStargzLayer
	default:
		return nil, fmt.Errorf("namespace %q has no puller in the configuration's \"pullers\": a ferry image is mounted lazily only by the labels of a puller named there (cri or rpull), never by labels the image itself could carry (docs/containerd.md)", ns)
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.HasPrefix(k, foreign) {
			return nil, fmt.Errorf("label %s: namespace %q is %s's, which sets no such label: the image's own annotations try to choose what is mounted, or another tool pulled into this namespace (docs/containerd.md)", k, ns, puller)
		}
	}
	a.ref = labels[refKey]
	if a.ref == "" {
		return nil, fmt.Errorf("no %s label: namespace %q is %s's, and it did not set it (CRI: disable_snapshot_annotations = false)", refKey, ns, puller)
	}
	if a.layer, err = digest.Parse(labels[layerKey]); err != nil {
		return nil, fmt.Errorf("label %s: %w", layerKey, err)
	}
	if a.parent, err = parentChain(parent); err != nil {
		return nil, err
	}
	if a.kind == kindBlob {
		return a, nil
	}
	if puller == pullerCRI {
		m, err := digest.Parse(labels[labelCRIManifest])
		if err != nil {
			return nil, fmt.Errorf("label %s: %w", labelCRIManifest, err)
		}
		a.pin = m.String()
		a.image = "docker://" + repoOf(a.ref) + "@" + a.pin
	} else {
		a.image = "docker://" + a.ref
	}
	return a, nil
}

// admit checks a ferry layer's Prepare against the rules above, as far as
// they need no mount: the puller, its labels, a data blob's chain.
func admit(pullers map[string]string, key, parent string, labels map[string]string) (*admission, error) {
	a, err := admitPuller(pullers, key, parent, labels)
	if err != nil || a.kind != kindBlob {
		return a, err
	}
	want := chainNext(a.parent, ferryDiffID(blobDiffIDPrefix, a.layer))
	if want != a.target {
		return nil, fmt.Errorf("chain ID %s is not that of data blob %s over %s (%s): the image's config claims diff_ids that are not its layers' (docs/FORMAT.md 1a; an image converted before format 3: ferry convert it again)",
			a.target, a.layer, orBottom(a.parent), want)
	}
	return a, nil
}

func orBottom(d digest.Digest) string {
	if d == "" {
		return "nothing"
	}
	return d.String()
}

// checkBootstrap: the bootstrap ferryd mounted for @a gives its chain ID.
func (a *admission) checkBootstrap(manifest, bootstrap string) error {
	b, err := digest.Parse(bootstrap)
	if err != nil {
		return fmt.Errorf("ferryd mounted %s but named no bootstrap digest (a ferryd older than this snapshotter, or native EROFS layers)", a.image)
	}
	if a.pin != "" && manifest != a.pin {
		return fmt.Errorf("ferryd mounted manifest %s for %s", manifest, a.image)
	}
	want := chainNext(a.parent, ferryDiffID(bootDiffIDPrefix, b))
	if want != a.target {
		return fmt.Errorf("%s (manifest %s) has bootstrap %s, whose chain over %s is %s, but containerd asked for %s: the image's config claims diff_ids that are not its layers' (docs/FORMAT.md 1a; an image converted before format 3: ferry convert it again)",
			a.image, manifest, b, orBottom(a.parent), want, a.target)
	}
	return nil
}

// trusted wraps stargz's snapshotter: a ferry layer's Prepare is admitted
// first, and fails with the reason rather than fall back to an ordinary
// snapshot that containerd could not unpack the layer into.
type trusted struct {
	snapshots.Snapshotter
	fs *ferryFS
}

func (t *trusted) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	var base snapshots.Info
	for _, opt := range opts {
		if err := opt(&base); err != nil {
			return nil, err
		}
	}
	var a *admission
	var err error
	switch {
	case base.Labels[labelTarget] == "":
	case ferryKind(base.Labels) != "":
		if a, err = admit(t.fs.c.Pullers, key, parent, base.Labels); err != nil {
			return nil, fmt.Errorf("ferry layer %s: %w", base.Labels[labelTarget], err)
		}
	default:
		if a, err = t.fs.admitIndexed(ctx, key, parent, base.Labels); err != nil {
			return nil, fmt.Errorf("layer %s: %w", base.Labels[labelTarget], err)
		}
	}
	if a == nil {
		m, err := t.Snapshotter.Prepare(ctx, key, parent, opts...)
		return t.guard(m, t.explain(parent, err))
	}
	// Committed already (a pull in another namespace): it was verified.
	if info, err := t.Snapshotter.Stat(ctx, a.target.String()); err == nil &&
		info.Kind == snapshots.KindCommitted {
		if err := t.fs.verified(a.target.String()); err != nil {
			return nil, fmt.Errorf("ferry layer %s: %w", a.target, err)
		}
		// This image's top is another indexed image's empty lower layer.
		if a.kind == kindIndex && t.fs.isIndexLayer(a.target.String()) {
			return nil, fmt.Errorf("layer %s: %w", a.target, errIndexLayer(t.fs.snapshotOf(a.target.String())))
		}
		return nil, fmt.Errorf("target snapshot %q: %w", a.target, errdefs.ErrAlreadyExists)
	}
	m, err := t.Snapshotter.Prepare(withAdmission(ctx, a), key, parent, opts...)
	if err == nil {
		// Mount failed and stargz made an ordinary snapshot instead.
		if rerr := t.Snapshotter.Remove(ctx, key); rerr != nil {
			t.fs.log(ctx).WithError(rerr).Warnf("removing %s after a refused ferry layer", key)
		}
		if a.err == nil {
			a.err = errors.New("not mounted")
		}
		return nil, fmt.Errorf("ferry layer %s: %w", a.target, a.err)
	}
	return m, err
}

func (t *trusted) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	m, err := t.Snapshotter.View(ctx, key, parent, opts...)
	return t.guard(m, t.explain(parent, err))
}

func (t *trusted) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	return t.guard(t.Snapshotter.Mounts(ctx, key))
}

// guard: guardLowers over the snapshots of this snapshotter's root.
func (t *trusted) guard(m []mount.Mount, err error) ([]mount.Mount, error) {
	if err != nil {
		return m, err
	}
	dir := filepath.Join(t.fs.c.Root, "snapshots") + "/"
	return guardLowers(m, func(path string) string {
		if !strings.HasPrefix(path, dir) {
			return ""
		}
		return t.fs.kindOf(snapshotID(path))
	})
}

// explain adds to "layer unavailable" why a ferry image below @parent
// cannot be mounted (the snapshot package only logs it).
func (t *trusted) explain(parent string, err error) error {
	if err == nil || !errdefs.IsUnavailable(err) || parent == "" {
		return err
	}
	if why := t.fs.failure(parent); why != nil {
		return fmt.Errorf("%w: %v", err, why)
	}
	return err
}
