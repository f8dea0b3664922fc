// SPDX-License-Identifier: MIT

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate (and with @keyFile, its key)
// as PEM.
func writeCert(t *testing.T, certFile, keyFile, name string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject: pkix.Name{CommonName: name}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0600); err != nil {
		t.Fatal(err)
	}
	if keyFile != "" {
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0600); err != nil {
			t.Fatal(err)
		}
	}
}

func writeFile(t *testing.T, path, text string) {
	if err := os.MkdirAll(filepath.Dir(path), 0700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0600); err != nil {
		t.Fatal(err)
	}
}

// containerd's hosts directory, as containerd reads it, in ferryd's
// shape: the hosts in the file's order, then the server; capabilities,
// API paths, headers, skip_verify, CA and client files (relative ones
// against the file's directory); _default; Docker's certs.d layout; a
// file containerd cannot parse is refused rather than read otherwise.
func TestRegistryHosts(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "certs.d")
	dir := filepath.Join(root, "reg.test_5000_")
	writeFile(t, filepath.Join(dir, "hosts.toml"), `
server = "https://reg.test:5000"
ca = "`+filepath.Join(root, "server-ca.pem")+`"

[host."https://mirror.test:6000/cache"]
  capabilities = ["pull", "resolve"]
  ca = "ca.pem"
  client = [["client.pem", "client.key"]]
  header = {X-Tenant = "a", X-Multi = ["1", "2"]}

[host."http://127.0.0.1:7000"]
  capabilities = ["pull"]
  override_path = true
  skip_verify = true
`)
	writeCert(t, filepath.Join(root, "server-ca.pem"), "", "server CA")
	writeCert(t, filepath.Join(dir, "ca.pem"), "", "mirror CA")
	writeCert(t, filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key"), "node")
	got, err := registryHosts(ctx, root, "reg.test:5000")
	if err != nil {
		t.Fatal(err)
	}
	want := []ferryHost{
		{Registry: "reg.test:5000", URL: "https://mirror.test:6000/cache/v2",
			Capabilities: []string{"pull", "resolve"}, OverridePath: true,
			CA: []string{filepath.Join(dir, "ca.pem")}, ClientCert: filepath.Join(dir, "client.pem"),
			ClientKey: filepath.Join(dir, "client.key"), Headers: []string{"X-Multi: 1", "X-Multi: 2", "X-Tenant: a"}},
		{Registry: "reg.test:5000", URL: "http://127.0.0.1:7000", Capabilities: []string{"pull"},
			SkipVerify: true, OverridePath: true},
		{Registry: "reg.test:5000", URL: "https://reg.test:5000/v2", Capabilities: []string{"pull", "resolve", "push"},
			Server: true, OverridePath: true, CA: []string{filepath.Join(root, "server-ca.pem")}},
	}
	if !reflect.DeepEqual(got, want) {
		a, _ := json.MarshalIndent(got, "", " ")
		t.Fatalf("registryHosts =\n%s", a)
	}

	// Nothing for a registry: ferryd asks it directly.
	if got, err := registryHosts(ctx, root, "other.test"); got != nil || err != nil {
		t.Fatalf("a registry without a directory: %v, %v", got, err)
	}
	// _default serves every registry without a directory of its own; the
	// Hub's endpoint is registry-1.docker.io.
	writeFile(t, filepath.Join(root, "_default", "hosts.toml"), "[host.\"http://127.0.0.1:7001\"]\n")
	got, err = registryHosts(ctx, root, "docker.io")
	if err != nil || len(got) != 2 || got[0].URL != "http://127.0.0.1:7001/v2" ||
		got[1].URL != "https://registry-1.docker.io/v2" || !got[1].Server || got[1].Registry != "docker.io" {
		t.Fatalf("_default for docker.io: %+v, %v", got, err)
	}
	// Docker's layout: *.crt CAs, a *.cert with its *.key.
	legacy := filepath.Join(root, "legacy.test")
	if err := os.MkdirAll(legacy, 0700); err != nil {
		t.Fatal(err)
	}
	writeCert(t, filepath.Join(legacy, "ca.crt"), "", "legacy CA")
	writeCert(t, filepath.Join(legacy, "node.cert"), filepath.Join(legacy, "node.key"), "node")
	got, err = registryHosts(ctx, root, "legacy.test")
	if err != nil || len(got) != 1 || got[0].URL != "https://legacy.test/v2" ||
		!reflect.DeepEqual(got[0].CA, []string{filepath.Join(legacy, "ca.crt")}) ||
		got[0].ClientCert != filepath.Join(legacy, "node.cert") || got[0].ClientKey != filepath.Join(legacy, "node.key") {
		t.Fatalf("certs.d layout: %+v, %v", got, err)
	}
	// containerd falls back to the certificate files of a hosts.toml it
	// cannot parse: refused, saying so.
	writeFile(t, filepath.Join(root, "bad.test", "hosts.toml"), "[host.\"https://m.test\"]\n  capabilities = [\"bogus\"]\n")
	if _, err := registryHosts(ctx, root, "bad.test"); err == nil ||
		!strings.Contains(err.Error(), "containerd reads 1 hosts there, ferry-snapshotter 2") {
		t.Fatalf("a hosts.toml containerd cannot parse: %v", err)
	}
	// A CA file that is not the one containerd trusts (it is replaced
	// between the two reads) is caught by the check.
	h := hostTLS{ca: []string{filepath.Join(root, "server-ca.pem")}}
	if err := h.check(nil); err == nil {
		t.Fatal("CA files containerd did not load were taken")
	}

	// A mount's fetch options carry its registry's hosts and the
	// configuration's own options.
	c := testConfig(t.TempDir(), "/nonexistent")
	c.HostsDir = root
	f, err := newFerryFS(c, json.RawMessage(`{"retries":3}`))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := f.fetchFor(ctx, "docker://reg.test:5000/app@sha256:"+strings.Repeat("a", 64))
	var opts struct {
		Retries int         `json:"retries"`
		Hosts   []ferryHost `json:"hosts"`
		Creds   *string     `json:"creds"`
	}
	if err == nil {
		err = json.Unmarshal(raw, &opts)
	}
	if err != nil || opts.Retries != 3 || !reflect.DeepEqual(opts.Hosts, want) || opts.Creds != nil {
		t.Fatalf("fetch options %s, %v", raw, err)
	}
}

// fetch.hosts and a hosts directory are one or the other.
func TestHostsConfig(t *testing.T) {
	c := testConfig(t.TempDir(), "/nonexistent")
	c.Fetch = json.RawMessage(`{"hosts":[]}`)
	if err := c.check(); err == nil || !strings.Contains(err.Error(), "hostsDir") {
		t.Fatalf("fetch.hosts with a hosts directory: %v", err)
	}
	c.HostsDir = ""
	if err := c.check(); err != nil {
		t.Fatalf("fetch.hosts alone: %v", err)
	}
	c.HostsDir = "certs.d"
	if err := c.check(); err == nil {
		t.Fatal("a relative hosts directory was taken")
	}
}
