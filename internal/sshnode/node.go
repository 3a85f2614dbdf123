package sshnode

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"

	"github.com/apiary-llm/apiary/internal/cpuvariant"
)

// The scripts below are constants; their only inputs are positional
// parameters. expandDir turns a leading ~ of $1 into the remote $HOME.
const expandDir = `d=$1
case $d in
"~") d=$HOME ;;
"~/"*) d=$HOME/${d#"~/"} ;;
esac
`

var probeScript = `set -u
` + expandDir + `echo "os=$(uname -s)"
echo "arch=$(uname -m)"
echo "install_dir=$d"
echo "ssh_connection=${SSH_CONNECTION:-}"
if [ -x "$d/apiary" ]; then
  echo "version=$("$d/apiary" version 2>/dev/null | head -n 1)"
  if command -v sha256sum >/dev/null 2>&1; then
    echo "sha256=$(sha256sum < "$d/apiary" | cut -d ' ' -f 1)"
  fi
fi
for v in ` + siblingList + `; do
  if [ -x "$d/apiary-$v" ]; then
    if command -v sha256sum >/dev/null 2>&1; then
      echo "variant=$v $(sha256sum < "$d/apiary-$v" | cut -d ' ' -f 1)"
    else
      echo "variant=$v"
    fi
  fi
done
`

// siblingList is the CPU builds that may sit beside apiary (see
// internal/cpuvariant), for the scripts: a node gets those the local
// apiary has, or its workers would run the portable build.
var siblingList = strings.Join(cpuvariant.Siblings, " ")

// installScript writes stdin to $d/$2 (apiary or one of its CPU builds,
// never a user's word); installing apiary removes the CPU builds of the
// one before, which must not outlive it.
var installScript = `set -eu
` + expandDir + `mkdir -p "$d"
t="$d/.apiary.tmp.$$"
trap 'rm -f "$t"' EXIT
cat > "$t"
chmod 0755 "$t"
if [ "$2" = apiary ]; then
  for v in ` + siblingList + `; do rm -f "$d/apiary-$v"; done
fi
mv -f "$t" "$d/$2"
trap - EXIT
`

// runScript replaces the shell with $d/apiary and the rest of the
// parameters.
const runScript = expandDir + `shift
exec "$d/apiary" "$@"
`

// Probe is what a node says about itself.
type Probe struct {
	OS, Arch   string // Go's names (linux, amd64), from uname
	InstallDir string // expanded
	// NodeAddr is the node's address on the connection ssh made (from
	// $SSH_CONNECTION): the address this machine reaches it at.
	NodeAddr string
	// ClientAddr is this machine's address on that connection, as the
	// node sees it (from $SSH_CONNECTION): where a process here that the
	// node must reach can listen (without a ProxyJump or NAT in between).
	ClientAddr string
	// Version and SHA256 of the apiary installed at InstallDir; empty when
	// there is none.
	Version, SHA256 string
	// Variants are apiary's CPU builds beside it (internal/cpuvariant),
	// by variant: their hashes ("" without sha256sum on the node).
	Variants map[string]string
}

// Binary is the local apiary that a node should run.
type Binary struct {
	Path    string
	Version string
	SHA256  string
	OS      string
	Arch    string
	// Variants are its CPU builds beside it (make build links them), best
	// first.
	Variants []VariantFile
}

// VariantFile is one CPU build of apiary beside it: the file
// apiary-<Variant>.
type VariantFile struct {
	Variant, Path, SHA256 string
}

// LocalBinary describes the apiary at path (this process's executable
// when path is empty) built for this machine.
func LocalBinary(path, version string) (Binary, error) {
	if path == "" {
		p, err := os.Executable()
		if err != nil {
			return Binary{}, fmt.Errorf("sshnode: find own executable: %w", err)
		}
		path = p
	}
	sum, err := hashFile(path)
	if err != nil {
		return Binary{}, err
	}
	b := Binary{Path: path, Version: version, SHA256: sum, OS: runtime.GOOS, Arch: runtime.GOARCH}
	if cpuvariant.Name == cpuvariant.Portable {
		for _, v := range cpuvariant.Siblings {
			vp := path + "-" + v
			if fi, err := os.Stat(vp); err != nil || !fi.Mode().IsRegular() {
				continue
			}
			sum, err := hashFile(vp)
			if err != nil {
				return Binary{}, err
			}
			b.Variants = append(b.Variants, VariantFile{Variant: v, Path: vp, SHA256: sum})
		}
	}
	return b, nil
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("sshnode: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("sshnode: hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Probe connects to t and reads what the probe script prints. installDir
// must pass CheckInstallDir.
func (c Client) Probe(ctx context.Context, t Target, installDir string) (Probe, error) {
	if err := CheckInstallDir(installDir); err != nil {
		return Probe{}, err
	}
	out, err := c.Run(ctx, t, RemoteCommand(probeScript, installDir), nil)
	if err != nil {
		return Probe{}, err
	}
	return parseProbe(out), nil
}

func parseProbe(out []byte) Probe {
	var p Probe
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "os":
			p.OS = strings.ToLower(v)
		case "arch":
			p.Arch = goArch(v)
		case "install_dir":
			p.InstallDir = v
		case "ssh_connection":
			// "client_ip client_port server_ip server_port"
			if f := strings.Fields(v); len(f) == 4 && net.ParseIP(f[2]) != nil {
				p.NodeAddr = f[2]
				if net.ParseIP(f[0]) != nil {
					p.ClientAddr = f[0]
				}
			}
		case "version":
			p.Version = v
		case "sha256":
			p.SHA256 = v
		case "variant":
			name, sum, _ := strings.Cut(v, " ")
			if p.Variants == nil {
				p.Variants = map[string]string{}
			}
			p.Variants[name] = sum
		}
	}
	return p
}

// goArch maps uname -m to Go's GOARCH.
func goArch(m string) string {
	switch m {
	case "x86_64", "amd64":
		return "amd64"
	case "aarch64", "arm64":
		return "arm64"
	case "i386", "i686":
		return "386"
	case "armv7l", "armv6l":
		return "arm"
	}
	return m
}

// Installed reports whether the node runs exactly b (same hash; the same
// version when the node has no sha256sum), with exactly b's CPU builds
// beside it.
func (p Probe) Installed(b Binary) bool {
	if len(p.Variants) != len(b.Variants) {
		return false
	}
	for _, v := range b.Variants {
		sum, ok := p.Variants[v.Variant]
		if !ok || (p.SHA256 != "" && sum != v.SHA256) {
			return false
		}
	}
	if p.SHA256 != "" {
		return p.SHA256 == b.SHA256
	}
	return p.Version != "" && p.Version == b.Version
}

// CanCopy says why b cannot run on the node, or nil.
func (p Probe) CanCopy(b Binary) error {
	if p.OS != b.OS || p.Arch != b.Arch {
		return fmt.Errorf("the node is %s/%s and this apiary is built for %s/%s", p.OS, p.Arch, b.OS, b.Arch)
	}
	return nil
}

// Ensure makes the node run b: it copies b to the install dir when the
// node has none or another build, then checks the copy. It returns the
// probe after any copy and whether it copied.
func (c Client) Ensure(ctx context.Context, t Target, installDir string, b Binary) (Probe, bool, error) {
	p, err := c.Probe(ctx, t, installDir)
	if err != nil {
		return p, false, err
	}
	if p.Installed(b) {
		return p, false, nil
	}
	if err := p.CanCopy(b); err != nil {
		hint := fmt.Sprintf("%v; install apiary %s for it at %s on the node", err, b.Version, p.InstallDir)
		if p.Version != "" {
			hint = fmt.Sprintf("the node has apiary %s at %s, not this one (%s), and %v; install the same version there", p.Version, p.InstallDir, b.Version, err)
		}
		return p, false, &Error{Kind: ErrMissingBinary, Target: t, Hint: hint}
	}
	if err := c.install(ctx, t, installDir, b.Path, "apiary"); err != nil {
		return p, false, fmt.Errorf("copy apiary to %s:%s: %w", t, p.InstallDir, err)
	}
	for _, v := range b.Variants {
		name := "apiary-" + v.Variant
		if err := c.install(ctx, t, installDir, v.Path, name); err != nil {
			return p, true, fmt.Errorf("copy %s to %s:%s: %w", name, t, p.InstallDir, err)
		}
	}
	after, err := c.Probe(ctx, t, installDir)
	if err != nil {
		return after, true, err
	}
	if !after.Installed(b) {
		return after, true, &Error{Kind: ErrMissingBinary, Target: t,
			Hint: fmt.Sprintf("copied apiary to %s but it does not run there (version %q)", after.InstallDir, after.Version)}
	}
	return after, true, nil
}

// install copies the local file at path to the node's install dir as
// name.
func (c Client) install(ctx context.Context, t Target, installDir, path, name string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("sshnode: %w", err)
	}
	defer f.Close()
	_, err = c.Run(ctx, t, RemoteCommand(installScript, installDir, name), f)
	return err
}

// ApiaryCommand is the remote command that runs `apiary ARGS…` from the
// install dir; the login shell is replaced, so the session ends when
// apiary does.
func ApiaryCommand(installDir string, args ...string) (string, error) {
	if err := CheckInstallDir(installDir); err != nil {
		return "", err
	}
	for _, a := range args {
		if strings.ContainsAny(a, "\x00\n\r") {
			return "", fmt.Errorf("sshnode: argument %q holds a control character", a)
		}
	}
	return RemoteCommand(runScript, append([]string{installDir}, args...)...), nil
}
