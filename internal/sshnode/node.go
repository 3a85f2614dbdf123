package sshnode

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
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
for p in ` + libraryGlobs + `; do
  [ -f "$p" ] || continue
  f=${p##*/}
  if command -v sha256sum >/dev/null 2>&1; then
    echo "backend=$f $(sha256sum < "$p" | cut -d ' ' -f 1)"
  else
    echo "backend=$f"
  fi
done
`

// The libraries that sit beside apiary: llama.cpp and ggml, which apiary
// links ($ORIGIN run path), ggml's CPU backends, one per instruction-set
// level, which a worker loads at run time, and the GPU backend files
// `make cuda` adds; a node's hive and workers look for them in the
// directory of their own binary, so a node gets those the local apiary
// has, or its workers cannot start and its GPUs serve nothing. The CUDA
// names are internal/gpu's (CUDALibrary, CUDAVersionFile; a test checks
// they agree), spelt out here so that the queen's side does not link cgo
// and NVML for two strings.
const (
	CUDALibrary     = "libggml-cuda.so"           // the CUDA backend, loaded by workers
	BaseLibrary     = "libggml-base.so"           // ggml's core, which every backend links
	CUDAVersionFile = "libggml-cuda.cuda-version" // the CUDA version it was built with
	// CPUBackends matches ggml's CPU backends (internal/cpuvariant).
	CPUBackends = "libggml-cpu-*.so"
)

// BackendFiles lists the files by name (and CPUBackends by ggml's own
// pattern), and so bounds what a node gets besides apiary: only these,
// because a node compares them by name and a new apiary removes them by
// name in an install dir that other programs may share (~/.local/bin).
var BackendFiles = []string{"libllama.so", "libllama-common.so", "libmtmd.so", "libggml.so", BaseLibrary, CUDALibrary, CUDAVersionFile}

// libraryGlobs is BackendFiles and CPUBackends as words of the scripts,
// in the expanded install dir $d.
var libraryGlobs = func() string {
	var w []string
	for _, f := range append(slices.Clone(BackendFiles), CPUBackends) {
		w = append(w, `"$d"/`+f)
	}
	return strings.Join(w, " ")
}()

// installScript writes stdin to $d/$2 with mode $3 (apiary or one of its
// libraries, never a user's word), through a temp file renamed into
// place, so that a running process keeps the file it has open or mapped;
// installing apiary removes the libraries of the one before, which must
// not outlive it (apiary links its own llama.cpp, and a backend binds to
// it), and the per-CPU builds older apiaries had beside them.
var installScript = `set -eu
` + expandDir + `mkdir -p "$d"
t="$d/.apiary.tmp.$$"
trap 'rm -f "$t"' EXIT
cat > "$t"
chmod "$3" "$t"
if [ "$2" = apiary ]; then
  rm -f "$d/apiary-x86-64-v3" "$d/apiary-x86-64-v4" ` + libraryGlobs + `
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
	// Backend is the libraries beside it (BackendFiles, CPUBackends), by
	// name: their hashes ("" without sha256sum on the node).
	Backend map[string]string
}

// Binary is the local apiary that a node should run.
type Binary struct {
	Path    string
	Version string
	SHA256  string
	OS      string
	Arch    string
	// Backend is the libraries beside it (make build and make cuda put
	// them there), in BackendFiles' order, then the CPU backends by name.
	Backend []BackendFile
}

// BackendFile is one library beside apiary, Name one of BackendFiles or
// matching CPUBackends.
type BackendFile struct {
	Name, Path, SHA256 string
}

// mode is the file's mode on the node: libraries are executable.
func (f BackendFile) mode() string {
	if strings.HasSuffix(f.Name, ".so") {
		return "0755"
	}
	return "0644"
}

// LocalBinary describes the apiary at path (this process's executable
// when path is empty) built for this machine.
func LocalBinary(path, version string) (Binary, error) {
	if path == "" {
		p, err := os.Executable()
		if err != nil {
			return Binary{}, fmt.Errorf("find own executable: %w", err)
		}
		path = p
	}
	sum, err := hashFile(path)
	if err != nil {
		return Binary{}, err
	}
	b := Binary{Path: path, Version: version, SHA256: sum, OS: runtime.GOOS, Arch: runtime.GOARCH}
	b.Backend, err = localBackend(filepath.Dir(path))
	if err != nil {
		return Binary{}, err
	}
	return b, nil
}

// localBackend finds the libraries in dir; those absent are skipped.
func localBackend(dir string) ([]BackendFile, error) {
	var files []BackendFile
	cpu, err := filepath.Glob(filepath.Join(dir, CPUBackends))
	if err != nil {
		return nil, err
	}
	names := slices.Clone(BackendFiles)
	for _, p := range cpu {
		names = append(names, filepath.Base(p))
	}
	for _, name := range names {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		sum, err := hashFile(p)
		if err != nil {
			return nil, err
		}
		files = append(files, BackendFile{Name: name, Path: p, SHA256: sum})
	}
	return files, nil
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
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
		case "backend":
			name, sum, _ := strings.Cut(v, " ")
			if p.Backend == nil {
				p.Backend = map[string]string{}
			}
			p.Backend[name] = sum
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
// version when the node has no sha256sum), with exactly b's libraries
// beside it.
func (p Probe) Installed(b Binary) bool { return len(p.differences(b)) == 0 }

// differences names the files of b that the node lacks or has otherwise,
// and those it has that b has not; hashes are compared when the node has
// sha256sum, else apiary's version and the other files' presence.
func (p Probe) differences(b Binary) []string {
	var diff, extra []string
	if p.SHA256 != "" && p.SHA256 != b.SHA256 {
		diff = append(diff, "apiary")
	} else if p.SHA256 == "" && (p.Version == "" || p.Version != b.Version) {
		diff = append(diff, "apiary")
	}
	same := func(have map[string]string, name, sum string) bool {
		got, ok := have[name]
		return ok && (p.SHA256 == "" || got == sum)
	}
	want := map[string]bool{}
	for _, f := range b.Backend {
		want[f.Name] = true
		if !same(p.Backend, f.Name, f.SHA256) {
			diff = append(diff, f.Name)
		}
	}
	for name := range p.Backend {
		if !want[name] {
			extra = append(extra, name)
		}
	}
	slices.Sort(extra)
	return append(diff, extra...)
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
	if err := c.install(ctx, t, installDir, b.Path, "apiary", "0755"); err != nil {
		return p, false, fmt.Errorf("copy apiary to %s:%s: %w", t, p.InstallDir, err)
	}
	for _, f := range b.Backend {
		if err := c.install(ctx, t, installDir, f.Path, f.Name, f.mode()); err != nil {
			return p, true, fmt.Errorf("copy %s to %s:%s: %w", f.Name, t, p.InstallDir, err)
		}
	}
	after, err := c.Probe(ctx, t, installDir)
	if err != nil {
		return after, true, err
	}
	if diff := after.differences(b); len(diff) > 0 {
		return after, true, &Error{Kind: ErrMissingBinary, Target: t,
			Hint: fmt.Sprintf("copied apiary to %s but the node does not have it as copied (apiary version %q there; differing: %s)",
				after.InstallDir, after.Version, strings.Join(diff, ", "))}
	}
	return after, true, nil
}

// install copies the local file at path to the node's install dir as
// name, with mode (octal).
func (c Client) install(ctx context.Context, t Target, installDir, path, name, mode string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = c.Run(ctx, t, RemoteCommand(installScript, installDir, name, mode), f)
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
			return "", fmt.Errorf("argument %q holds a control character", a)
		}
	}
	return RemoteCommand(runScript, append([]string{installDir}, args...)...), nil
}
