package service

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/config"
)

// testUnit is a valid unit whose ExecStart binary exists: this test's own.
func testUnit(t *testing.T, r Role) Unit {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Unit{Role: r, Binary: bin, StopTimeout: 90 * time.Second}.WithDefaults()
}

// keys are the unit's "Key=value" lines by key (the last one wins).
func keys(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			out[k] = v
		}
	}
	return out
}

func TestRenderHardeningAndStop(t *testing.T) {
	for _, r := range []Role{Queen, Hive} {
		t.Run(string(r), func(t *testing.T) {
			u := testUnit(t, r)
			u.Args = []string{"--addr", "0.0.0.0:8080", "--queen", "https://queen.example:8080"}
			k := keys(u.Render())
			want := map[string]string{
				"Type": "notify", "NotifyAccess": "main", "WatchdogSec": "60", "Restart": "on-failure",
				"KillMode": "mixed", "KillSignal": "SIGTERM", "TimeoutStopSec": "90",
				"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
				"ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
				"RestrictSUIDSGID": "yes", "CapabilityBoundingSet": "", "User": "apiary", "Group": "apiary",
				"EnvironmentFile": "/etc/apiary/" + string(r) + ".env",
			}
			for key, v := range want {
				if got, ok := k[key]; !ok || got != v {
					t.Errorf("%s=%q, want %q", key, got, v)
				}
			}
			rw := "/var/lib/apiary/" + string(r)
			if r == Hive {
				rw += " /var/lib/apiary/models"
			}
			if k["ReadWritePaths"] != rw {
				t.Errorf("ReadWritePaths=%q, want only the data (and models) directories %q", k["ReadWritePaths"], rw)
			}
			exec := strings.Fields(k["ExecStart"])
			if !filepath.IsAbs(exec[0]) || exec[0] != u.Binary || exec[1] != string(r) {
				t.Errorf("ExecStart=%q: want the absolute binary %s then %s", k["ExecStart"], u.Binary, r)
			}
			if !strings.HasSuffix(k["ExecStart"], strings.Join(u.Args, " ")) {
				t.Errorf("ExecStart=%q lacks the daemon's flags %q", k["ExecStart"], u.Args)
			}
			if _, ok := k["ExecReload"]; ok {
				t.Error("ExecReload without Reload: SIGHUP would stop the daemon")
			}
			if _, ok := k["PrivateDevices"]; ok {
				t.Error("PrivateDevices hides the GPUs from the workers")
			}
		})
	}
}

// No token reaches the unit text: the environment's secrets are not read,
// the unit names the environment file only.
func TestRenderHoldsNoSecret(t *testing.T) {
	const tok = "s3cr3t-token-value"
	for _, env := range []string{"APIARY_API_TOKEN", "APIARY_ADMIN_TOKEN", "APIARY_CLUSTER_TOKEN", "HF_TOKEN", "APIARY_DATABASE_URL"} {
		t.Setenv(env, tok)
	}
	for _, r := range []Role{Queen, Hive} {
		text := testUnit(t, r).Render()
		if strings.Contains(text, tok) || strings.Contains(text, "TOKEN=") {
			t.Errorf("%s unit holds a secret:\n%s", r, text)
		}
		if strings.Contains(text, "Environment=") && !strings.Contains(text, "EnvironmentFile=") {
			t.Errorf("%s unit sets the environment inline", r)
		}
	}
}

func TestExecLineQuoting(t *testing.T) {
	got := execLine([]string{"/usr/bin/apiary", "hive", "--node-id", "rack 1", `say "hi"\`, "100%", "$HOME", ""})
	want := `/usr/bin/apiary hive --node-id "rack 1" "say \"hi\"\\" 100%% $$HOME ""`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Unit)
		field  string
	}{
		{"relative binary", func(u *Unit) { u.Binary = "bin/apiary" }, "Binary"},
		{"space in data dir", func(u *Unit) { u.DataDir = "/var/lib/my apiary" }, "DataDir"},
		{"unclean data dir", func(u *Unit) { u.DataDir = "/var/lib/../apiary" }, "DataDir"},
		{"queen with models dir", func(u *Unit) { u.ModelsDir = "/m" }, "ModelsDir"},
		{"bad user", func(u *Unit) { u.User = "Root;rm" }, "User"},
		{"no stop timeout", func(u *Unit) { u.StopTimeout = 0 }, "StopTimeout"},
		{"short watchdog", func(u *Unit) { u.Watchdog = time.Second }, "Watchdog"},
		{"line break in a flag", func(u *Unit) { u.Args = []string{"--addr\nUser=root"} }, "Args"},
	} {
		u := testUnit(t, Queen)
		tc.change(&u)
		err := u.Validate()
		fields := config.Fields(err)
		if len(fields) != 1 || fields[0].Field != tc.field {
			t.Errorf("%s: %v; want one problem with %s", tc.name, err, tc.field)
		}
	}
	if err := testUnit(t, Hive).Validate(); err != nil {
		t.Errorf("default hive: %v", err)
	}
}

// systemd's own parser takes both units without a word: systemd-analyze
// verify (scripts/deps.sh installs systemd) warns on stderr about a key
// it cannot parse, and fails on an ExecStart that is not there.
func TestSystemdAnalyzeVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("this test needs systemd-analyze (scripts/deps.sh installs the systemd package): %v", err)
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		unit func() Unit
	}{
		{"queen", func() Unit {
			u := testUnit(t, Queen)
			u.Args, u.Reload = []string{"--config", "/etc/apiary/models.yaml", "--addr", "0.0.0.0:8080"}, true
			return u
		}},
		{"hive", func() Unit {
			u := testUnit(t, Hive)
			u.Args = []string{"--queen", "https://queen.example:8080", "--node-id", "rack 1"}
			return u
		}},
		{"hive without watchdog", func() Unit { u := testUnit(t, Hive); u.Watchdog = -1; return u }},
	} {
		u := tc.unit()
		path := filepath.Join(dir, u.Role.UnitName())
		if err := os.WriteFile(path, []byte(u.Render()), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("%s: systemd-analyze verify: %v\n%s\n%s", tc.name, err, out, u.Render())
		}
	}
	// The check can fail: a unit whose binary is missing does.
	u := testUnit(t, Hive)
	u.Binary = filepath.Join(dir, "no-such-apiary")
	path := filepath.Join(dir, u.Role.UnitName())
	if err := os.WriteFile(path, []byte(u.Render()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput(); err == nil {
		t.Errorf("verify took a unit whose binary is missing:\n%s", out)
	}
}

// Install writes the unit, the directories and the environment file
// (0600, names only); a second install keeps the environment file and
// its tokens and tightens its mode; Uninstall removes the unit alone.
func TestInstallUninstall(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	u := testUnit(t, Hive)
	u.User = me.Username
	u.DataDir, u.ModelsDir, u.EnvFile = filepath.Join(root, "data"), filepath.Join(root, "models"), filepath.Join(root, "etc", "hive.env")
	unitDir := filepath.Join(root, "units")
	var out bytes.Buffer
	in := Installer{Unit: u, UnitDir: unitDir, Out: &out}
	if err := in.Install(t.Context()); err != nil {
		t.Fatal(err)
	}
	unitPath := filepath.Join(unitDir, "apiary-hive.service")
	text, err := os.ReadFile(unitPath)
	if err != nil || string(text) != u.Render() {
		t.Fatalf("unit file: %v\n%s", err, text)
	}
	for _, d := range []string{u.DataDir, u.ModelsDir} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			t.Errorf("%s: %v", d, err)
		}
	}
	st, err := os.Stat(u.EnvFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("env file: %v, mode %v", err, st.Mode())
	}
	env, _ := os.ReadFile(u.EnvFile)
	for _, line := range strings.Split(string(env), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			t.Errorf("a new env file holds only comments, got %q", line)
		}
	}
	for _, want := range []string{"user " + me.Username + " exists", "created " + u.EnvFile, "wrote " + unitPath, "systemctl enable --now " + unitPath} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("install said %q, want %q", out.String(), want)
		}
	}

	if err := os.WriteFile(u.EnvFile, []byte("APIARY_CLUSTER_TOKEN=kept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(u.EnvFile, 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := in.Install(t.Context()); err != nil {
		t.Fatal(err)
	}
	env, _ = os.ReadFile(u.EnvFile)
	st, _ = os.Stat(u.EnvFile)
	if string(env) != "APIARY_CLUSTER_TOKEN=kept\n" || st.Mode().Perm() != 0o600 {
		t.Errorf("second install: env file %q mode %v; want kept, 0600", env, st.Mode().Perm())
	}
	if !strings.Contains(out.String(), "now 0600") {
		t.Errorf("install did not say it tightened the mode: %q", out.String())
	}

	out.Reset()
	if err := Uninstall(t.Context(), Hive, unitDir, false, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(unitPath); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("unit still there: %v", err)
	}
	for _, p := range []string{u.DataDir, u.ModelsDir, u.EnvFile} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("uninstall removed %s: %v", p, err)
		}
	}
	if !strings.Contains(out.String(), "kept: the user, the data") {
		t.Errorf("uninstall said %q", out.String())
	}
	if err := Uninstall(t.Context(), Hive, unitDir, false, &out); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("second uninstall: %v, want not exist", err)
	}
}

// A missing user is created as a system user when root; without root the
// install says it needs root.
func TestInstallCreatesSystemUser(t *testing.T) {
	name := fmt.Sprintf("apiary-t%d", os.Getpid()%100000)
	root := t.TempDir()
	u := testUnit(t, Queen)
	// Regression: the data directory's missing parent (/var/lib/apiary)
	// was created 0750 root:root, so the daemon's user could not reach its
	// own data directory (found by booting the unit under systemd,
	// TestProcessServiceInstallBootsUnderSystemd).
	u.User, u.DataDir, u.EnvFile = name, filepath.Join(root, "var", "lib", "apiary", "queen"), filepath.Join(root, "queen.env")
	var out bytes.Buffer
	err := Installer{Unit: u, UnitDir: filepath.Join(root, "units"), Out: &out}.Install(t.Context())
	if os.Geteuid() != 0 {
		if !errors.Is(err, ErrNeedsRoot) {
			t.Fatalf("not root: %v, want ErrNeedsRoot", err)
		}
		return
	}
	t.Cleanup(func() {
		if msg, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v %s", name, err, msg)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	usr, err := user.Lookup(name)
	if err != nil {
		t.Fatalf("user not created: %v", err)
	}
	if !strings.Contains(out.String(), "created system user "+name) {
		t.Errorf("install said %q", out.String())
	}
	st, err := os.Stat(u.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	if uid := fmt.Sprint(st.Sys().(*syscall.Stat_t).Uid); uid != usr.Uid {
		t.Errorf("%s is owned by uid %s, want %s's %s", u.DataDir, uid, name, usr.Uid)
	}
	if st.Mode().Perm() != 0o750 {
		t.Errorf("%s has mode %o, want 750", u.DataDir, st.Mode().Perm())
	}
	for _, d := range []string{filepath.Join(root, "var"), filepath.Join(root, "var", "lib"), filepath.Dir(u.DataDir)} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o755 {
			t.Errorf("parent %s has mode %o, want 755 so that %s can pass through", d, st.Mode().Perm(), name)
		}
	}
}

// InstallBinary copies the binary and the libraries beside it (what its
// $ORIGIN run path finds) into the install directory, replacing what is
// there.
func TestInstallBinaryCopiesTheLibrariesBesideIt(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "lib", "apiary")
	for name, body := range map[string]string{"apiary": "binary", "libllama.so": "llama", "libggml-cpu-haswell.so": "cpu", "notes.txt": "no"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "apiary"), []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := InstallBinary(filepath.Join(src, "apiary"), dst, &out); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"apiary": "binary", "libllama.so": "llama", "libggml-cpu-haswell.so": "cpu"} {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if st, _ := os.Stat(filepath.Join(dst, name)); err != nil || string(got) != want || st.Mode().Perm() != 0o755 {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dst, "notes.txt")); err == nil {
		t.Error("a file that is no library was copied")
	}
	if !strings.Contains(out.String(), "copied apiary and 2 libraries to "+dst) {
		t.Errorf("said %q", out.String())
	}
}
