// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/remotes/docker"
	hostsconfig "github.com/containerd/containerd/remotes/docker/config"
	"github.com/pelletier/go-toml"
)

// A registry's hosts come from containerd's hosts directory (its CRI
// registry config_path: one hosts.toml per registry, or _default), read by
// containerd's own package (remotes/docker/config), so that ferryd asks
// the mirrors containerd asks, in its order, with its capabilities, API
// paths, headers and TLS settings (docs/registries.md). That package hands
// out its TLS settings as loaded certificates; ferryd needs the files, so
// the "ca" and "client" names are read from the same file here and checked
// against what the package loaded from them.

// ferryHost is one entry of ferryd's "hosts" fetch option (cmd/ctl.h).
type ferryHost struct {
	Registry     string   `json:"registry"`
	URL          string   `json:"url"`
	Capabilities []string `json:"capabilities"`
	Server       bool     `json:"server,omitempty"`
	SkipVerify   bool     `json:"skipVerify,omitempty"`
	OverridePath bool     `json:"overridePath"`
	CA           []string `json:"ca,omitempty"`
	ClientCert   string   `json:"clientCert,omitempty"`
	ClientKey    string   `json:"clientKey,omitempty"`
	Headers      []string `json:"headers,omitempty"`
}

// hostTLS: the TLS files of one host, as its table names them.
type hostTLS struct {
	ca        []string
	cert, key string // the first client pair: ferryd shows one certificate
}

// registryHosts is ferryd's "hosts" for @registry ("docker.io",
// "host:port") from the hosts directory @root, nil when the directory has
// nothing for it (nor _default): ferryd then asks the registry itself.
func registryHosts(ctx context.Context, root, registry string) ([]ferryHost, error) {
	dir, err := hostsconfig.HostDirFromRoot(root)(registry)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("hosts directory %s: %w", root, err)
	}
	hosts, err := hostsconfig.ConfigureHosts(ctx, hostsconfig.HostOptions{
		HostDir: func(string) (string, error) { return dir, nil },
	})(registry)
	if err != nil {
		return nil, fmt.Errorf("registry %s: hosts in %s: %w", registry, dir, err)
	}
	files, err := tlsFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", registry, err)
	}
	if len(files) != len(hosts) {
		return nil, fmt.Errorf("registry %s: %s: containerd reads %d hosts there, ferry-snapshotter %d: containerd ignores a hosts.toml it cannot parse (its log says why); fix the file", registry, dir, len(hosts), len(files))
	}
	out := make([]ferryHost, len(hosts))
	for i, h := range hosts {
		tlsConf := transportTLS(h.Client)
		if err := files[i].check(tlsConf); err != nil {
			return nil, fmt.Errorf("registry %s: %s, host %s: %w", registry, dir, h.Host, err)
		}
		out[i] = ferryHost{
			Registry: registry,
			// containerd's path is the API root ("/v2" added unless
			// override_path): ferryd takes it as it is.
			URL:          h.Scheme + "://" + h.Host + h.Path,
			Capabilities: capabilityNames(h.Capabilities),
			Server:       i == len(hosts)-1,
			SkipVerify:   tlsConf != nil && tlsConf.InsecureSkipVerify,
			OverridePath: true,
			CA:           files[i].ca,
			ClientCert:   files[i].cert,
			ClientKey:    files[i].key,
			Headers:      headerLines(h.Header),
		}
	}
	return out, nil
}

func transportTLS(c *http.Client) *tls.Config {
	if c == nil {
		return nil
	}
	if tr, ok := c.Transport.(*http.Transport); ok {
		return tr.TLSClientConfig
	}
	return nil
}

func capabilityNames(c docker.HostCapabilities) []string {
	var names []string
	for _, n := range []struct {
		bit  docker.HostCapabilities
		name string
	}{{docker.HostCapabilityPull, "pull"}, {docker.HostCapabilityResolve, "resolve"},
		{docker.HostCapabilityPush, "push"}} {
		if c.Has(n.bit) {
			names = append(names, n.name)
		}
	}
	return names
}

func headerLines(h http.Header) []string {
	var lines []string
	for name, values := range h {
		for _, v := range values {
			lines = append(lines, name+": "+v)
		}
	}
	sort.Strings(lines)
	return lines
}

// tlsFiles: the TLS files of every host containerd reads from @dir, in
// its order: the [host."URL"] tables by position, then the file's top
// level (its server, or the registry's own endpoint); without a
// hosts.toml, Docker's certs.d layout (*.crt CAs, *.cert with *.key).
func tlsFiles(dir string) ([]hostTLS, error) {
	path := filepath.Join(dir, "hosts.toml")
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if len(data) == 0 {
		one, err := certsDirFiles(dir)
		return []hostTLS{one}, err
	}
	tree, err := toml.LoadBytes(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var tables []*toml.Tree
	if hosts, ok := tree.Get("host").(*toml.Tree); ok {
		for _, k := range hosts.Keys() {
			t, ok := hosts.GetPath([]string{k}).(*toml.Tree)
			if !ok {
				return nil, fmt.Errorf("%s: host %q is not a table", path, k)
			}
			tables = append(tables, t)
		}
		sort.SliceStable(tables, func(i, j int) bool {
			return tables[i].Position().Line < tables[j].Position().Line
		})
	}
	tables = append(tables, tree)
	out := make([]hostTLS, len(tables))
	for i, t := range tables {
		if out[i], err = tableFiles(t, dir); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return out, nil
}

// tableFiles: "ca" (a file or a list) and "client" (a file holding
// certificate and key, a list of them, or a list of [cert, key] pairs),
// relative paths taken against the hosts.toml's directory.
func tableFiles(t *toml.Tree, dir string) (hostTLS, error) {
	var h hostTLS
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	switch ca := t.Get("ca").(type) {
	case nil:
	case string:
		h.ca = []string{abs(ca)}
	case []interface{}:
		for _, v := range ca {
			s, ok := v.(string)
			if !ok {
				return h, fmt.Errorf("\"ca\": %v is not a file name", v)
			}
			h.ca = append(h.ca, abs(s))
		}
	default:
		return h, fmt.Errorf("\"ca\": %v is not a file name or a list of them", ca)
	}
	var first interface{}
	switch c := t.Get("client").(type) {
	case nil:
	case string:
		first = c
	case []interface{}:
		if len(c) > 0 {
			first = c[0]
		}
	default:
		return h, fmt.Errorf("\"client\": %v is no client certificate", c)
	}
	switch p := first.(type) {
	case nil:
	case string:
		h.cert = abs(p)
	case []interface{}:
		if len(p) != 2 {
			return h, fmt.Errorf("\"client\": %v is not a [certificate, key] pair", p)
		}
		cert, ok1 := p[0].(string)
		key, ok2 := p[1].(string)
		if !ok1 || !ok2 {
			return h, fmt.Errorf("\"client\": %v is not a pair of file names", p)
		}
		h.cert, h.key = abs(cert), abs(key)
	default:
		return h, fmt.Errorf("\"client\": %v is no client certificate", p)
	}
	return h, nil
}

// certsDirFiles: Docker's layout, as containerd reads it without a
// hosts.toml.
func certsDirFiles(dir string) (hostTLS, error) {
	var h hostTLS
	entries, err := os.ReadDir(dir)
	if err != nil {
		return h, err
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() {
			continue
		}
		if strings.HasSuffix(name, ".crt") {
			h.ca = append(h.ca, filepath.Join(dir, name))
		}
		if strings.HasSuffix(name, ".cert") && h.cert == "" {
			h.cert = filepath.Join(dir, name)
			key := strings.TrimSuffix(h.cert, ".cert") + ".key"
			if _, err := os.Stat(key); err == nil {
				h.key = key
			}
		}
	}
	return h, nil
}

// check: the files are those containerd's package loaded for the host:
// the same CA pool (the system's plus these), the same first client
// certificate.
func (h *hostTLS) check(c *tls.Config) error {
	var pool *x509.CertPool
	if c != nil {
		pool = c.RootCAs
	}
	if (pool != nil) != (len(h.ca) > 0) {
		return errors.New("its CA files are not those containerd trusts for it")
	}
	if pool != nil {
		want, err := x509.SystemCertPool()
		if err != nil {
			return err
		}
		for _, f := range h.ca {
			data, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			want.AppendCertsFromPEM(data)
		}
		if !want.Equal(pool) {
			return fmt.Errorf("CA files %s are not those containerd trusts for it", strings.Join(h.ca, ", "))
		}
	}
	var loaded []tls.Certificate
	if c != nil {
		loaded = c.Certificates
	}
	if (len(loaded) > 0) != (h.cert != "") {
		return errors.New("its client certificate is not the one containerd shows")
	}
	if h.cert != "" {
		data, err := os.ReadFile(h.cert)
		if err != nil {
			return err
		}
		var block *pem.Block
		for rest := data; ; {
			if block, rest = pem.Decode(rest); block == nil || block.Type == "CERTIFICATE" {
				break
			}
		}
		if block == nil || len(loaded[0].Certificate) == 0 ||
			!bytes.Equal(block.Bytes, loaded[0].Certificate[0]) {
			return fmt.Errorf("client certificate %s is not the one containerd shows", h.cert)
		}
	}
	return nil
}
