// SPDX-License-Identifier: MIT

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/mount"
	refdocker "github.com/containerd/containerd/reference/docker"
	"github.com/opencontainers/go-digest"
)

// An indexed image is an ordinary image (tar+gzip layers) with a ferry
// index attached (docs/FORMAT.md 1e): ferryd mounts its merged tree
// lazily from the layers themselves. containerd still names its layers'
// snapshots by the chain IDs of the config's diff_ids, as for any ordinary
// image, so:
//
//   - the diff_ids the index records must give, layer by layer, the chain
//     ID containerd asked for (ferryd checked them against the config
//     before answering the probe): a layer below the top becomes an empty
//     committed snapshot (kindIndexLayer), the top one ferryd's mount of
//     the whole tree (kindIndex);
//   - those diff_ids are the index author's word: checking them means
//     decoding every layer whole, which a lazy pull avoids. A chain ID is
//     shared by every image with those layers, so an index could make
//     another image's layers run its content. Only the repositories the
//     configuration's "indexes" names are mounted through their index;
//     any other image is unpacked by containerd, which checks each layer's
//     diff_id as it applies it;
//   - an empty lower snapshot is only right beneath its image's mount,
//     which holds every layer: every mount the snapshotter hands out
//     stops its lower directories at the first indexed mount, and one
//     whose lower directories reach an empty lower snapshot without one
//     above it (an image pulled after the indexed one sharing its lower
//     layers, or its base image) is refused (guardLowers).
const (
	kindIndexLayer = "index-layer"
	kindIndex      = "index"
	// A probe answer is reused for the other layers of the same pull.
	probeTTL     = time.Minute
	probeEntries = 256
)

// probeReply is ferryd's answer to a probe (cmd/ctl.h).
type probeReply struct {
	ImageDigest     string          `json:"imageDigest"`
	BootstrapDigest string          `json:"bootstrapDigest"`
	IndexDigest     string          `json:"indexDigest"`
	Layers          []digest.Digest `json:"layers"`
	DiffIDs         []digest.Digest `json:"diffIds"`
}

type probeEntry struct {
	at  time.Time
	rep *probeReply
	err error
}

type probeCache struct {
	mu      sync.Mutex
	entries map[string]probeEntry
}

// indexPosition: which layer of the indexed image @p a Prepare of chain
// @target over @parent (chain IDs, "" at the bottom) for layer @layer is,
// or why it is none: the index's diff_ids must give containerd's chains.
func indexPosition(p *probeReply, layer, parent, target digest.Digest) (int, error) {
	if len(p.Layers) == 0 || len(p.Layers) != len(p.DiffIDs) {
		return 0, fmt.Errorf("ferryd's probe named %d layers and %d diff_ids", len(p.Layers), len(p.DiffIDs))
	}
	var below digest.Digest
	for i, id := range p.DiffIDs {
		chain := chainNext(below, id)
		if chain == target {
			if p.Layers[i] != layer {
				return 0, fmt.Errorf("chain ID %s is layer %d of the index's image, %s, not layer %s", target, i, p.Layers[i], layer)
			}
			if below != parent {
				return 0, fmt.Errorf("chain ID %s is layer %d of the index's image over %s, not over %s", target, i, orBottom(below), orBottom(parent))
			}
			return i, nil
		}
		below = chain
	}
	return 0, fmt.Errorf("chain ID %s (layer %s over %s) is none of the chains of the diff_ids its ferry index %s records: the index was made for another image", target, layer, orBottom(parent), p.IndexDigest)
}

// repoTrusted: @repo (a normalised repository name) is one whose indexes
// @trusted names: a repository, or a prefix of whole path components
// ("registry.example", "registry.example/team").
func repoTrusted(trusted []string, repo string) bool {
	for _, t := range trusted {
		t = strings.TrimSuffix(t, "/")
		if t != "" && (repo == t || strings.HasPrefix(repo, t+"/")) {
			return true
		}
	}
	return false
}

// isIndexLayer: the backend snapshot @name is an indexed image's empty
// lower layer.
func (f *ferryFS) isIndexLayer(name string) bool {
	return f.kindOf(f.snapshotOf(name)) == kindIndexLayer
}

func (f *ferryFS) snapshotOf(chain string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byChain[chain]
}

// kindOf: the kind of ferry snapshot @id, "" for none.
func (f *ferryFS) kindOf(id string) string {
	if id == "" {
		return ""
	}
	rec, err := f.readRecord(id)
	if err != nil || rec == nil {
		return ""
	}
	return rec.Kind
}

// admitIndexed decides a Prepare of an ordinary layer: nil, nil to unpack
// it as usual (no index, or one that does not apply: logged), an
// admission to commit it from the image's index, or an error when it can
// be neither: its parent is an indexed image's empty lower layer.
func (f *ferryFS) admitIndexed(ctx context.Context, key, parent string, labels map[string]string) (*admission, error) {
	onIndex := parent != "" && f.isIndexLayer(parent)
	// @probed: the image was probed (the reason is worth an info line).
	refuse := func(err error, probed bool) (*admission, error) {
		if onIndex {
			return nil, fmt.Errorf("%w; its parent %s is the empty lower layer of an indexed image, over which no layer can be unpacked: remove the images that use it (ctr -n NAMESPACE images rm) and pull this one again (docs/containerd.md)", err, parent)
		}
		l := f.log(ctx).WithError(err)
		if probed {
			l.Infof("ferry: layer %s unpacked by containerd", labels[labelTarget])
		} else {
			l.Debugf("ferry: layer %s unpacked by containerd", labels[labelTarget])
		}
		return nil, nil
	}
	if len(f.c.Indexes) == 0 && !onIndex {
		return nil, nil
	}
	a, err := admitPuller(f.c.Pullers, key, parent, labels)
	if err != nil {
		return refuse(err, false)
	}
	named, err := refdocker.ParseDockerRef(a.ref)
	if err != nil {
		return refuse(fmt.Errorf("image %s: %w", a.ref, err), false)
	}
	if !repoTrusted(f.c.Indexes, named.Name()) {
		return refuse(fmt.Errorf("repository %s is not among the configuration's \"indexes\", whose ferry indexes are trusted", named.Name()), false)
	}
	p, err := f.probe(ctx, a.image, a.pin)
	if err != nil {
		return refuse(err, true)
	}
	i, err := indexPosition(p, a.layer, a.parent, a.target)
	if err != nil {
		return refuse(fmt.Errorf("%s: %w", a.image, err), true)
	}
	a.kind = kindIndexLayer
	if i == len(p.Layers)-1 {
		a.kind = kindIndex
	}
	a.pin, a.index, a.bootstrap = p.ImageDigest, p.IndexDigest, p.BootstrapDigest
	a.image = "docker://" + repoOf(a.ref) + "@" + a.pin
	return a, nil
}

// probe asks ferryd what @image (pinned to manifest @pin, if given) is,
// without mounting it; answers are kept for probeTTL.
func (f *ferryFS) probe(ctx context.Context, image, pin string) (*probeReply, error) {
	key := image + "|" + pin
	now := time.Now()
	f.probes.mu.Lock()
	if e, ok := f.probes.entries[key]; ok && now.Sub(e.at) < probeTTL {
		f.probes.mu.Unlock()
		return e.rep, e.err
	}
	f.probes.mu.Unlock()
	rep, err := f.probeFerryd(ctx, image, pin)
	f.probes.mu.Lock()
	if f.probes.entries == nil || len(f.probes.entries) >= probeEntries {
		f.probes.entries = map[string]probeEntry{}
	}
	f.probes.entries[key] = probeEntry{at: now, rep: rep, err: err}
	f.probes.mu.Unlock()
	return rep, err
}

func (f *ferryFS) probeFerryd(ctx context.Context, image, pin string) (*probeReply, error) {
	fetch, err := f.fetchFor(ctx, image)
	if err != nil {
		return nil, err
	}
	req := map[string]interface{}{"op": "probe", "image": image, "cacheDir": f.c.CacheDir}
	if pin != "" {
		req["imageDigest"] = pin
	}
	if len(fetch) > 0 {
		req["fetch"] = fetch
	}
	answer, err := f.call(req, ferrydTimeout)
	var ferr *ferrydError
	if errors.As(err, &ferr) && ferr.errno == int(syscall.EMEDIUMTYPE) {
		return nil, fmt.Errorf("%s has no ferry index", image)
	}
	if err != nil {
		return nil, err
	}
	var rep probeReply
	if err := json.Unmarshal(answer, &rep); err != nil {
		return nil, fmt.Errorf("ferryd at %s: probe answer: %w", f.c.FerrydSocket, err)
	}
	if rep.IndexDigest == "" {
		return nil, fmt.Errorf("%s is a ferry image, not an ordinary one with a ferry index", image)
	}
	if pin != "" && rep.ImageDigest != pin {
		return nil, fmt.Errorf("ferryd probed manifest %s for %s", rep.ImageDigest, image)
	}
	return &rep, nil
}

// checkIndex: ferryd mounted what the probe found.
func (a *admission) checkIndex(manifest, bootstrap string) error {
	if manifest != a.pin || bootstrap != a.bootstrap {
		return fmt.Errorf("ferryd mounted manifest %s with bootstrap %s for %s, but probed manifest %s with bootstrap %s (index %s)",
			manifest, bootstrap, a.image, a.pin, a.bootstrap, a.index)
	}
	return nil
}

// guardLowers applies the rule above to the mounts of a snapshot: the
// lower directories (ROOT/snapshots/ID/fs, top first) end at the first
// indexed image's mount, and an empty lower layer of one is never reached
// without it.
func guardLowers(ms []mount.Mount, kindOf func(dir string) string) ([]mount.Mount, error) {
	for i, m := range ms {
		switch m.Type {
		case "bind":
			if kindOf(m.Source) == kindIndexLayer {
				return nil, errIndexLayer(snapshotID(m.Source))
			}
		case "overlay":
			out, err := guardOverlay(m, kindOf)
			if err != nil {
				return nil, err
			}
			ms[i] = out
		}
	}
	return ms, nil
}

func guardOverlay(m mount.Mount, kindOf func(dir string) string) (mount.Mount, error) {
	var lowers []string
	at, upper := -1, false
	for i, o := range m.Options {
		if strings.HasPrefix(o, "lowerdir=") {
			lowers, at = strings.Split(strings.TrimPrefix(o, "lowerdir="), ":"), i
		}
		upper = upper || strings.HasPrefix(o, "upperdir=")
	}
scan:
	for j, dir := range lowers {
		switch kindOf(dir) {
		case kindIndex:
			lowers = lowers[:j+1]
			break scan
		case kindIndexLayer:
			return m, errIndexLayer(snapshotID(dir))
		}
	}
	if at < 0 {
		return m, nil
	}
	// overlayfs wants two lower directories without an upper one.
	if len(lowers) == 1 && !upper {
		return mount.Mount{Type: "bind", Source: lowers[0], Options: []string{"ro", "rbind"}}, nil
	}
	opts := append([]string(nil), m.Options...)
	opts[at] = "lowerdir=" + strings.Join(lowers, ":")
	return mount.Mount{Type: m.Type, Source: m.Source, Options: opts}, nil
}

// errIndexLayer: snapshot @id is an empty lower layer reached without its
// indexed image's mount.
func errIndexLayer(id string) error {
	return fmt.Errorf("snapshot %s is the empty lower layer of an indexed image, whose files only that image's ferry mount above it serves, and this snapshot has none: an image pulled after the indexed one shares its lower layers, or is its base; remove the indexed images that use it (ctr -n NAMESPACE images rm) and pull this one again, base images first (docs/containerd.md)",
		id)
}
