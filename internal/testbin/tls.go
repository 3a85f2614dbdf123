package testbin

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSFiles are the PEM files of a throwaway certificate authority and of
// one server certificate it signed.
type TLSFiles struct {
	CA, Cert, Key string
}

// MakeTLS writes a new CA and a server certificate for hosts (IP
// addresses or DNS names) into dir, the way docs/security.md tells an
// operator to: one CA for the cluster, a certificate per node.
func MakeTLS(t testing.TB, dir string, hosts ...string) TLSFiles {
	t.Helper()
	return NewCA(t, dir).Issue(t, dir, hosts...)
}

// CA is a throwaway certificate authority: its PEM file, and its key to
// issue certificates with (a cluster's CA signing a certificate per node).
type CA struct {
	File string // dir/ca.pem
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA valid for a day and writes its certificate to
// dir/ca.pem.
func NewCA(t testing.TB, dir string) *CA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: "apiary test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{File: filepath.Join(dir, "ca.pem"), cert: cert, key: caKey}
	writePEM(t, ca.File, "CERTIFICATE", caDER, 0o644)
	return ca
}

// Issue writes a server certificate for hosts (IP addresses or DNS
// names), signed by ca, to dir/cert.pem and its key to dir/key.pem.
func (ca *CA) Issue(t testing.TB, dir string, hosts ...string) TLSFiles {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f := TLSFiles{CA: ca.File, Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	writePEM(t, f.Cert, "CERTIFICATE", der, 0o644)
	writePEM(t, f.Key, "EC PRIVATE KEY", keyDER, 0o600)
	return f
}

// serial is a random certificate serial number.
func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	return n.Add(n, big.NewInt(1))
}

func writePEM(t testing.TB, path, typ string, der []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		t.Fatal(err)
	}
}
