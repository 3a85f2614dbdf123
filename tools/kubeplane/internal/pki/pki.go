// Package pki makes the certificates, keys and kubeconfigs of a test
// cluster: one CA, the apiserver's serving certificate, one client
// certificate in system:masters for every component and the admin, a
// serving certificate per node and the service-account signing key. All in
// Go, so nothing depends on openssl. Files that exist are kept, so a
// cluster brought up again in the same directory keeps its identity.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// validity is how long every certificate is valid; test clusters are short-lived.
const validity = 365 * 24 * time.Hour

// Authority is the cluster's CA, loaded or created under a directory.
type Authority struct {
	dir  string
	cert *x509.Certificate
	key  crypto.Signer
}

// CertPath is the CA certificate's file.
func (a *Authority) CertPath() string { return filepath.Join(a.dir, "ca.crt") }

// Open loads the CA under dir, creating it (and dir) when absent.
func Open(dir string) (*Authority, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the certificate directory: %w", err)
	}
	a := &Authority{dir: dir}
	certPath, keyPath := a.CertPath(), filepath.Join(dir, "ca.key")
	if cert, key, err := load(certPath, keyPath); err == nil {
		a.cert, a.key = cert, key
		return a, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("load the CA from %s (remove it to make a new one): %w", dir, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate the CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kubeplane-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("sign the CA certificate: %w", err)
	}
	if err := write(certPath, keyPath, der, key); err != nil {
		return nil, err
	}
	a.cert, _ = x509.ParseCertificate(der)
	a.key = key
	return a, nil
}

// Request describes one leaf certificate.
type Request struct {
	Name   string // file name stem: NAME.crt, NAME.key
	CN     string
	Orgs   []string
	Server bool // serving certificate for DNS and IPs; else a client certificate
	DNS    []string
	IPs    []net.IP
}

// Issue returns the certificate and key files of req, issuing them when absent.
func (a *Authority) Issue(req Request) (certPath, keyPath string, err error) {
	certPath, keyPath = filepath.Join(a.dir, req.Name+".crt"), filepath.Join(a.dir, req.Name+".key")
	if _, _, err := load(certPath, keyPath); err == nil {
		return certPath, keyPath, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate a key for %s: %w", req.Name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: req.CN, Organization: req.Orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if req.Server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.DNSNames, tmpl.IPAddresses = req.DNS, req.IPs
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, key.Public(), a.key)
	if err != nil {
		return "", "", fmt.Errorf("sign the certificate for %s: %w", req.Name, err)
	}
	return certPath, keyPath, write(certPath, keyPath, der, key)
}

// ServiceAccountKey returns the files of the RSA key pair that signs
// service-account tokens, making it when absent.
func (a *Authority) ServiceAccountKey() (pubPath, keyPath string, err error) {
	pubPath, keyPath = filepath.Join(a.dir, "sa.pub"), filepath.Join(a.dir, "sa.key")
	if _, err := os.Stat(keyPath); err == nil {
		return pubPath, keyPath, nil
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", fmt.Errorf("generate the service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("encode the service-account public key: %w", err)
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return "", "", fmt.Errorf("write the service-account public key: %w", err)
	}
	priv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(keyPath, priv, 0o600); err != nil {
		return "", "", fmt.Errorf("write the service-account key: %w", err)
	}
	return pubPath, keyPath, nil
}

// WriteKubeconfig writes a kubeconfig at path for server that trusts the CA
// and presents the client certificate certPath/keyPath (embedded, so the
// file stands alone).
func (a *Authority) WriteKubeconfig(path, server, user, certPath, keyPath string) error {
	ca, err := os.ReadFile(a.CertPath())
	if err != nil {
		return fmt.Errorf("read the CA certificate: %w", err)
	}
	cert, err := os.ReadFile(certPath)
	if err != nil {
		return fmt.Errorf("read the client certificate: %w", err)
	}
	key, err := os.ReadFile(keyPath)
	if err != nil {
		return fmt.Errorf("read the client key: %w", err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubeplane"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["kubeplane"] = &clientcmdapi.Context{Cluster: "kubeplane", AuthInfo: user}
	cfg.CurrentContext = "kubeplane"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func write(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode key: %w", err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", keyPath, err)
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", certPath, err)
	}
	return nil
}

func load(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	cb, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, err
	}
	kb, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, err
	}
	cblock, _ := pem.Decode(cb)
	kblock, _ := pem.Decode(kb)
	if cblock == nil || kblock == nil {
		return nil, nil, errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cblock.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kblock.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}
