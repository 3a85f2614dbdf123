package sshnode

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/apiary-llm/apiary/internal/gpu"
)

func TestParseTarget(t *testing.T) {
	for in, want := range map[string]Target{
		"alice@gpu1":            {User: "alice", Host: "gpu1"},
		"alice@gpu1:2222":       {User: "alice", Host: "gpu1", Port: 2222},
		"gpu1.lan":              {Host: "gpu1.lan"},
		"root@10.0.0.2:22":      {User: "root", Host: "10.0.0.2", Port: 22},
		"bob@[fe80::1]:2200":    {User: "bob", Host: "fe80::1", Port: 2200},
		"fe80::1":               {Host: "fe80::1"},
		"svc_user.x@host-a_b.c": {User: "svc_user.x", Host: "host-a_b.c"},
	} {
		got, err := ParseTarget(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%q (-want +got):\n%s", in, diff)
		}
		if back, _ := ParseTarget(got.String()); back != got {
			t.Errorf("%q: String %q does not parse back", in, got.String())
		}
	}
	// Nothing ssh could read as an option, and nothing a shell would read.
	for _, in := range []string{"", "-oProxyCommand=sh@x", "a@-oProxyCommand=x", "a@b:0", "a@b:99999", "a@b:x",
		"a b@c", "a@b c", "a@$(reboot)", "a@b;reboot", "@b", "a@", "a@[1.2.3.4]:22", "a@b@c", ".a@b"} {
		if _, err := ParseTarget(in); !errors.Is(err, ErrBadTarget) {
			t.Errorf("%q accepted (%v)", in, err)
		}
	}
}

func TestCheckInstallDir(t *testing.T) {
	for _, ok := range []string{"~/.local/bin", "~", "/opt/apiary/bin", "~/apiary-1.2+x"} {
		if err := CheckInstallDir(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "relative/dir", "~/../etc", "/opt/a b", "/opt/$(x)", "~user/bin", "/a;b", "/a'b", "-x"} {
		if err := CheckInstallDir(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The remote command goes through a login shell and then sh: whatever the
// arguments hold, sh gets them back unchanged as its parameters.
func TestRemoteCommandQuotesEveryArgument(t *testing.T) {
	args := []string{"plain", "it's", `"double"`, "$(touch /tmp/pwned)", "`id`", "a;b|c&d", "sp ace", "", "\\", "*", "~", "!x"}
	script := `for a in "$@"; do printf '[%s]' "$a"; done`
	out, err := exec.Command("sh", "-c", RemoteCommand(script, args...)).Output()
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for _, a := range args {
		want.WriteString("[" + a + "]")
	}
	if string(out) != want.String() {
		t.Errorf("got  %s\nwant %s", out, want.String())
	}
}

func TestApiaryCommandRefusesControlCharacters(t *testing.T) {
	if _, err := ApiaryCommand("~/.local/bin", "hive", "--x=a\nb"); err == nil {
		t.Error("newline accepted")
	}
	if _, err := ApiaryCommand("../x", "hive"); err == nil {
		t.Error("bad install dir accepted")
	}
	cmd, err := ApiaryCommand("~/.local/bin", "hive", "--queen", "http://10.0.0.1:8080")
	if err != nil || !strings.HasPrefix(cmd, "sh -c '") || !strings.HasSuffix(cmd, "'hive' '--queen' 'http://10.0.0.1:8080'") {
		t.Errorf("%q %v", cmd, err)
	}
}

func TestCommandEndsOptionsBeforeHost(t *testing.T) {
	c := Client{ConfigFile: "/etc/apiary/ssh_config"}
	path, args := c.Command(Target{User: "u", Host: "h", Port: 2222}, "true")
	joined := strings.Join(args, " ")
	for _, want := range []string{"-F /etc/apiary/ssh_config", "BatchMode=yes", "StrictHostKeyChecking=yes", "-p 2222", "-l u", "-- h true"} {
		if !strings.Contains(joined, want) {
			t.Errorf("ssh %s: missing %q", joined, want)
		}
	}
	if path != "ssh" {
		t.Errorf("path %q", path)
	}
}

func TestClassify(t *testing.T) {
	tgt := Target{User: "u", Host: "h"}
	for stderr, want := range map[string]error{
		"No ED25519 host key is known for [10.1.0.2]:22 and you have requested strict checking.\r\nHost key verification failed.\r\n": ErrHostKey,
		"@@@@\r\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\r\nHost key verification failed.":                        ErrHostKey,
		"u@h: Permission denied (publickey).":                          ErrAuth,
		"ssh: connect to host 10.9.9.9 port 22: Connection timed out":  ErrTimeout,
		"ssh: connect to host h port 22: Connection refused":           ErrUnreachable,
		"ssh: Could not resolve hostname h: Name or service not known": ErrUnreachable,
	} {
		err := Classify(tgt, stderr)
		if !errors.Is(err, want) {
			t.Errorf("%q → %v, want %v", stderr, err.Kind, want)
		}
		if !strings.Contains(err.Error(), "u@h") || !strings.Contains(err.Error(), "(ssh: ") {
			t.Errorf("message %q names neither the target nor ssh's words", err.Error())
		}
	}
}

func TestParseProbe(t *testing.T) {
	p := parseProbe([]byte("os=Linux\narch=x86_64\ninstall_dir=/home/u/.local/bin\nssh_connection=10.1.0.1 51234 10.1.0.2 22\nversion=0.1.0\nsha256=abc\n"))
	want := Probe{OS: "linux", Arch: "amd64", InstallDir: "/home/u/.local/bin", NodeAddr: "10.1.0.2", ClientAddr: "10.1.0.1", Version: "0.1.0", SHA256: "abc"}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	b := Binary{Version: "0.1.0", SHA256: "abc", OS: "linux", Arch: "amd64"}
	if !p.Installed(b) {
		t.Error("same hash not installed")
	}
	b.SHA256 = "def"
	if p.Installed(b) {
		t.Error("another build counted as installed")
	}
	if err := (Probe{OS: "linux", Arch: "arm64"}).CanCopy(b); err == nil {
		t.Error("an amd64 binary may be copied to an arm64 node")
	}
}

// writeFiles writes each name's content into dir; an empty content
// removes the file.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if content == "" {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// The backend's file names are the ones the hive and the worker look for.
func TestBackendFilesAreTheOnesTheNodeLooksFor(t *testing.T) {
	if CUDALibrary != gpu.CUDALibrary || CUDAVersionFile != gpu.CUDAVersionFile {
		t.Errorf("sshnode names %s and %s, internal/gpu %s and %s", CUDALibrary, CUDAVersionFile, gpu.CUDALibrary, gpu.CUDAVersionFile)
	}
}

// Issue #35: GPU nodes added over SSH served nothing, because the backend
// `make cuda` puts beside bin/apiary stayed behind. The copy set holds
// every backend file beside the binary, and none that is absent.
func TestLocalBinaryTakesTheGPUBackendBesideIt(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "apiary")
	writeFiles(t, dir, map[string]string{"apiary": "apiary", "libggml-cpu.so": "not ours", "libggml-base.so.0": "not ours"})

	b, err := LocalBinary(bin, "0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Backend) != 0 {
		t.Errorf("a CPU-only build takes %+v along", b.Backend)
	}

	writeFiles(t, dir, map[string]string{CUDALibrary: "cuda\x00\xff", BaseLibrary: "base", CUDAVersionFile: "12.4\n"})
	b, err = LocalBinary(bin, "0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	want := []BackendFile{
		{BaseLibrary, filepath.Join(dir, BaseLibrary), sha("base")},
		{CUDALibrary, filepath.Join(dir, CUDALibrary), sha("cuda\x00\xff")},
		{CUDAVersionFile, filepath.Join(dir, CUDAVersionFile), sha("12.4\n")},
	}
	if diff := cmp.Diff(want, b.Backend); diff != "" {
		t.Errorf("backend beside apiary (-want +got):\n%s", diff)
	}

	// Only what is there; a directory of the name is no file.
	writeFiles(t, dir, map[string]string{BaseLibrary: "", CUDAVersionFile: ""})
	if err := os.Mkdir(filepath.Join(dir, BaseLibrary), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err = LocalBinary(bin, "0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want[1:2], b.Backend); diff != "" {
		t.Errorf("backend with two files absent (-want +got):\n%s", diff)
	}
}

// fakeSSH is an ssh that runs the remote command here, as sshd would
// hand it to the login shell: the real probe and install scripts run.
func fakeSSH(t *testing.T) Client {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ssh")
	script := "#!/bin/sh\nwhile [ $# -gt 0 ]; do a=$1; shift; [ \"$a\" = -- ] && break; done\nshift\nexec sh -c \"$1\"\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return Client{Path: p}
}

// Issue #35, end to end through the real scripts: a node that already
// runs this apiary gets the backend once it is built, byte for byte, in
// apiary's directory (where the hive looks), the libraries executable;
// the node is then up to date; a new build's backend replaces it; and a
// CPU-only apiary removes it, as it must not outlive the apiary it came
// with.
func TestEnsureCopiesTheGPUBackendToTheNode(t *testing.T) {
	c := fakeSSH(t)
	local, node := t.TempDir(), filepath.Join(t.TempDir(), "bin")
	bin := filepath.Join(local, "apiary")
	writeFiles(t, local, map[string]string{"apiary": "#!/bin/sh\necho 0.1.0\n"})
	ensure := func(wantCopied bool) {
		t.Helper()
		b, err := LocalBinary(bin, "0.1.0")
		if err != nil {
			t.Fatal(err)
		}
		_, copied, err := c.Ensure(t.Context(), Target{Host: "node"}, node, b)
		if err != nil || copied != wantCopied {
			t.Fatalf("Ensure: copied %v, %v; want copied %v", copied, err, wantCopied)
		}
	}
	// nodeHas checks the node's install dir holds exactly apiary and
	// these backend files, with the local bytes and modes.
	nodeHas := func(backend map[string]os.FileMode) {
		t.Helper()
		ents, err := os.ReadDir(node)
		if err != nil {
			t.Fatal(err)
		}
		var got, want []string
		for _, e := range ents {
			got = append(got, e.Name())
		}
		want = append(want, "apiary")
		for name, mode := range backend {
			want = append(want, name)
			fi, err := os.Stat(filepath.Join(node, name))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != mode {
				t.Errorf("%s on the node has mode %v, want %v", name, fi.Mode().Perm(), mode)
			}
			have, _ := os.ReadFile(filepath.Join(node, name))
			if src, _ := os.ReadFile(filepath.Join(local, name)); !bytes.Equal(have, src) {
				t.Errorf("%s on the node is %q, want %q", name, have, src)
			}
		}
		if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
			t.Errorf("files on the node (-want +got):\n%s", diff)
		}
	}
	gpuBackend := map[string]os.FileMode{CUDALibrary: 0o755, BaseLibrary: 0o755, CUDAVersionFile: 0o644}

	ensure(true)
	nodeHas(nil)

	// llama.cpp's libraries and ggml's CPU backends go along too, and
	// a CPU backend gone from beside apiary goes from the node.
	llama := map[string]os.FileMode{"libllama.so": 0o755, "libggml-cpu-haswell.so": 0o755, "libggml-cpu-x64.so": 0o755}
	writeFiles(t, local, map[string]string{"libllama.so": "llama", "libggml-cpu-haswell.so": "haswell", "libggml-cpu-x64.so": "x64"})
	ensure(true)
	nodeHas(llama)
	ensure(false)
	writeFiles(t, local, map[string]string{"libllama.so": "", "libggml-cpu-haswell.so": "", "libggml-cpu-x64.so": ""})
	ensure(true)
	nodeHas(nil)

	writeFiles(t, local, map[string]string{CUDALibrary: "cuda\x00\x01\xff", BaseLibrary: "base\n", CUDAVersionFile: "12.4\n"})
	ensure(true)
	nodeHas(gpuBackend)
	ensure(false)

	writeFiles(t, local, map[string]string{CUDALibrary: "cuda, built again"})
	ensure(true)
	nodeHas(gpuBackend)

	writeFiles(t, local, map[string]string{CUDALibrary: "", BaseLibrary: "", CUDAVersionFile: ""})
	ensure(true)
	nodeHas(nil)
}

func TestProbeComparesTheBackend(t *testing.T) {
	b := Binary{Version: "0.1.0", SHA256: "abc", Backend: []BackendFile{{CUDALibrary, "/bin/" + CUDALibrary, "cudasum"}}}
	for _, tc := range []struct {
		probe string
		want  []string
	}{
		{"version=0.1.0\nsha256=abc\nbackend=libggml-cuda.so cudasum\n", nil},
		{"version=0.1.0\nsha256=abc\n", []string{CUDALibrary}},
		{"version=0.1.0\nsha256=abc\nbackend=libggml-cuda.so other\n", []string{CUDALibrary}},
		{"version=0.1.0\nsha256=abc\nbackend=libggml-cuda.so cudasum\nbackend=libggml-base.so basesum\n", []string{BaseLibrary}},
		{"version=0.1.0\nsha256=def\nbackend=libggml-cuda.so cudasum\n", []string{"apiary"}},
		// Without sha256sum on the node: the files' presence.
		{"version=0.1.0\nbackend=libggml-cuda.so\n", nil},
		{"version=0.1.0\n", []string{CUDALibrary}},
	} {
		p := parseProbe([]byte(tc.probe))
		if diff := cmp.Diff(tc.want, p.differences(b)); diff != "" || p.Installed(b) != (tc.want == nil) {
			t.Errorf("probe %q: differences (-want +got):\n%s", tc.probe, diff)
		}
	}
}
