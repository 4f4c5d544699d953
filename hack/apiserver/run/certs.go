package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Admin identity: in system:masters, so RBAC lets it do anything (and impersonate others,
// which is how tests can check what a less privileged identity may do).
const (
	adminUser  = "capc-health-shim-admin"
	adminGroup = "system:masters"
)

type pki struct {
	dir                              string
	caCert, caKey                    string // files
	servingCert, servingKey          string
	saPub, saKey                     string
	adminCert, adminKey              string
	tokenFile, tokenCSV              string
	caPEM, adminCertPEM, adminKeyPEM []byte
	token                            string
}

// writePKI generates a throwaway CA, a serving cert for 127.0.0.1/localhost, a
// service-account key pair, an admin client cert and an admin bearer token under dir.
func writePKI(dir string) (*pki, error) {
	p := &pki{
		dir:         dir,
		caCert:      filepath.Join(dir, "ca.crt"),
		caKey:       filepath.Join(dir, "ca.key"),
		servingCert: filepath.Join(dir, "apiserver.crt"),
		servingKey:  filepath.Join(dir, "apiserver.key"),
		saPub:       filepath.Join(dir, "sa.pub"),
		saKey:       filepath.Join(dir, "sa.key"),
		adminCert:   filepath.Join(dir, "admin.crt"),
		adminKey:    filepath.Join(dir, "admin.key"),
		tokenFile:   filepath.Join(dir, "token"),
		tokenCSV:    filepath.Join(dir, "token-auth.csv"),
	}
	now := time.Now().Add(-time.Hour)
	notAfter := now.Add(10 * 24 * time.Hour)

	caKey, err := newKey()
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "capc-health-shim test CA"},
		NotBefore:             now,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	p.caPEM = pemCert(caDER)
	if err := writeFile(p.caCert, p.caPEM); err != nil {
		return nil, err
	}
	if err := writeKey(p.caKey, caKey); err != nil {
		return nil, err
	}

	issue := func(tmpl *x509.Certificate, certFile, keyFile string) ([]byte, []byte, error) {
		k, err := newKey()
		if err != nil {
			return nil, nil, err
		}
		tmpl.SerialNumber = serial()
		tmpl.NotBefore, tmpl.NotAfter = now, notAfter
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, k.Public(), caKey)
		if err != nil {
			return nil, nil, err
		}
		certPEM := pemCert(der)
		keyPEM, err := pemKey(k)
		if err != nil {
			return nil, nil, err
		}
		if err := writeFile(certFile, certPEM); err != nil {
			return nil, nil, err
		}
		return certPEM, keyPEM, writeFile(keyFile, keyPEM)
	}

	if _, _, err := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP(serviceIP)},
	}, p.servingCert, p.servingKey); err != nil {
		return nil, err
	}
	if p.adminCertPEM, p.adminKeyPEM, err = issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: adminUser, Organization: []string{adminGroup}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, p.adminCert, p.adminKey); err != nil {
		return nil, err
	}

	saKey, err := newKey()
	if err != nil {
		return nil, err
	}
	if err := writeKey(p.saKey, saKey); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}
	if err := writeFile(p.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})); err != nil {
		return nil, err
	}

	tok := make([]byte, 24)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	p.token = hex.EncodeToString(tok)
	if err := writeFile(p.tokenFile, []byte(p.token+"\n")); err != nil {
		return nil, err
	}
	// --token-auth-file format: token,user,uid,"group1,group2"
	csv := fmt.Sprintf("%s,%s,%s,\"%s\"\n", p.token, adminUser, adminUser, adminGroup)
	if err := writeFile(p.tokenCSV, []byte(csv)); err != nil {
		return nil, err
	}
	return p, nil
}

const serviceCIDR, serviceIP = "10.0.0.0/24", "10.0.0.1"

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// pemKey encodes PKCS#8 ("PRIVATE KEY"), which Go, rustls and OpenSSL all read.
func pemKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func writeKey(path string, k crypto.Signer) error {
	b, err := pemKey(k)
	if err != nil {
		return err
	}
	return writeFile(path, b)
}

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o600) }

// writeAtomic writes via a temp file + rename so a reader never sees a partial file.
func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// writeKubeconfig writes the readiness signal: context "capc-health-shim-test" (admin token,
// the default) and "capc-health-shim-test-cert" (admin client certificate).
func writeKubeconfig(path, server string, p *pki) error {
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	var sb strings.Builder
	fmt.Fprintf(&sb, `apiVersion: v1
kind: Config
clusters:
- name: capc-health-shim-test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin-token
  user:
    token: %s
- name: admin-cert
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: capc-health-shim-test
  context:
    cluster: capc-health-shim-test
    user: admin-token
    namespace: default
- name: capc-health-shim-test-cert
  context:
    cluster: capc-health-shim-test
    user: admin-cert
    namespace: default
current-context: capc-health-shim-test
`, server, b64(p.caPEM), p.token, b64(p.adminCertPEM), b64(p.adminKeyPEM))
	return writeAtomic(path, []byte(sb.String()))
}

// writeEnvFile writes <dir>/env, a shell-sourceable summary for scripts. APISERVER_AUDIT_LOG
// is empty unless the profile writes an audit log.
func writeEnvFile(dir, apiURL, etcdURL, profile, auditLog string, p *pki) error {
	s := fmt.Sprintf(`APISERVER_URL=%s
APISERVER_CA=%s
APISERVER_TOKEN_FILE=%s
APISERVER_ADMIN_CERT=%s
APISERVER_ADMIN_KEY=%s
APISERVER_PROFILE=%s
APISERVER_ETCD_URL=%s
APISERVER_PID=%d
APISERVER_AUDIT_LOG=%s
`, apiURL, p.caCert, p.tokenFile, p.adminCert, p.adminKey, profile, etcdURL, os.Getpid(), auditLog)
	return writeAtomic(filepath.Join(dir, "env"), []byte(s))
}
