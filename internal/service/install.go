package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNeedsRoot is wrapped when a step needs root and this process is not.
var ErrNeedsRoot = errors.New("needs root")

// envFileHeader is what a new environment file holds: the variables'
// names, commented out, and no value.
func envFileHeader(r Role) string {
	vars := []string{"APIARY_CLUSTER_TOKEN=", "HF_TOKEN="}
	if r == Queen {
		vars = []string{"APIARY_API_TOKEN=", "APIARY_ADMIN_TOKEN=", "APIARY_CLUSTER_TOKEN=", "APIARY_DATABASE_URL="}
	}
	return "# Secrets of the apiary " + string(r) + " service, read by systemd (EnvironmentFile=).\n" +
		"# KEY=VALUE lines; keep this file mode 0600, owned by root.\n#" + strings.Join(vars, "\n#") + "\n"
}

// Installer writes a unit and what it needs.
type Installer struct {
	Unit Unit
	// UnitDir is where the unit file goes. Default DefaultUnitDir.
	UnitDir string
	// Now runs systemctl daemon-reload and enable --now after writing.
	Now bool
	// Out gets one line per thing done.
	Out io.Writer
}

// Install, in order:
//  1. checks the unit (Validate), and that this process may write UnitDir,
//  2. creates the user (useradd --system) when it does not exist,
//  3. creates the data and models directories, owned by the user (when
//     root),
//  4. creates the environment file empty (names only) with mode 0600, or
//     keeps the one there (its mode made 0600),
//  5. writes the unit file (a new file renamed into place),
//  6. with Now, runs systemctl daemon-reload and enable --now; else says
//     what to run.
func (in Installer) Install(ctx context.Context) error {
	u := in.Unit
	if err := u.Validate(); err != nil {
		return err
	}
	dir := in.unitDir()
	root := os.Geteuid() == 0
	if err := checkWritable(dir); err != nil {
		return err
	}
	uid, gid, err := in.ensureUser(ctx, root)
	if err != nil {
		return err
	}
	for _, d := range []string{u.DataDir, u.ModelsDir} {
		if d == "" {
			continue
		}
		if err := in.ensureDir(d, uid, gid, root); err != nil {
			return err
		}
	}
	if err := in.ensureEnvFile(); err != nil {
		return err
	}
	path := filepath.Join(dir, u.Role.UnitName())
	if err := writeFile(path, []byte(u.Render()), 0o644); err != nil {
		return err
	}
	in.say("wrote %s", path)
	return in.start(ctx)
}

func (in Installer) unitDir() string {
	if in.UnitDir == "" {
		return DefaultUnitDir
	}
	return in.UnitDir
}

func (in Installer) say(format string, a ...any) {
	if in.Out != nil {
		fmt.Fprintf(in.Out, format+"\n", a...)
	}
}

// checkWritable fails with ErrNeedsRoot when dir exists and cannot be
// written by this process.
func checkWritable(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("%w to write units in %s: %w", ErrNeedsRoot, dir, err)
		}
		return fmt.Errorf("unit directory: %w", err)
	}
	f, err := os.CreateTemp(dir, ".apiary-check-*")
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("%w to write units in %s: %w", ErrNeedsRoot, dir, err)
		}
		return fmt.Errorf("unit directory: %w", err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// ensureUser looks the user up, and creates it as a system user (with
// its own group, no home, no login shell) when it is missing.
func (in Installer) ensureUser(ctx context.Context, root bool) (uid, gid int, err error) {
	name := in.Unit.User
	usr, err := user.Lookup(name)
	if err == nil {
		in.say("user %s exists (uid %s); kept", name, usr.Uid)
		return ids(usr)
	}
	var unknown user.UnknownUserError
	if !errors.As(err, &unknown) {
		return 0, 0, fmt.Errorf("look up user %s: %w", name, err)
	}
	if !root {
		return 0, 0, fmt.Errorf("%w to create the user %s (useradd --system), or name an existing one with --user", ErrNeedsRoot, name)
	}
	cmd := exec.CommandContext(ctx, "useradd", "--system", "--user-group", "--no-create-home",
		"--home-dir", filepath.Dir(in.Unit.DataDir), "--shell", "/usr/sbin/nologin",
		"--comment", "apiary "+string(in.Unit.Role), name)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("useradd %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	if usr, err = user.Lookup(name); err != nil {
		return 0, 0, fmt.Errorf("user %s after useradd: %w", name, err)
	}
	in.say("created system user %s (uid %s, useradd --system)", name, usr.Uid)
	return ids(usr)
}

func ids(u *user.User) (int, int, error) {
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("user %s: %w", u.Username, err)
	}
	return uid, gid, nil
}

// ensureDir creates d (mode 0750) when missing, and gives it to the user
// when this process is root; a directory that exists keeps its owner.
// The parents it creates are 0755, as /var/lib is: the daemon's user
// must pass through them (a 0750 /var/lib/apiary owned by root kept the
// queen out of its own data directory under systemd).
func (in Installer) ensureDir(d string, uid, gid int, root bool) error {
	_, err := os.Stat(d)
	switch {
	case err == nil:
		in.say("directory %s exists; kept as it is", d)
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(d, 0o750); err != nil {
		return err
	}
	if !root {
		in.say("created %s (not root: owned by this user, not %s)", d, in.Unit.User)
		return nil
	}
	if err := os.Chown(d, uid, gid); err != nil {
		return err
	}
	in.say("created %s, owned by %s", d, in.Unit.User)
	return nil
}

// ensureEnvFile creates the environment file with the variables' names
// only, mode 0600, or keeps the file there and makes its mode 0600.
func (in Installer) ensureEnvFile() error {
	p := in.Unit.EnvFile
	st, err := os.Stat(p)
	if err == nil {
		if st.Mode().Perm() != 0o600 {
			if err := os.Chmod(p, 0o600); err != nil {
				return err
			}
			in.say("kept %s; its mode was %#o, now 0600", p, st.Mode().Perm())
			return nil
		}
		in.say("kept %s (mode 0600)", p)
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := writeFile(p, []byte(envFileHeader(in.Unit.Role)), 0o600); err != nil {
		return err
	}
	in.say("created %s (mode 0600): put the tokens there", p)
	return nil
}

// writeFile writes a new file beside path and renames it into place, so
// that no reader sees half of it.
func writeFile(path string, data []byte, mode fs.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	return nil
}

// StartLine is what a person runs to start the unit.
func StartLine(r Role) string {
	return "systemctl daemon-reload && systemctl enable --now " + r.UnitName()
}

// startLine is StartLine for a unit written to dir: systemctl finds a
// unit outside its own directories only by its whole path (it links it).
func startLine(r Role, dir string) string {
	if filepath.Clean(dir) == DefaultUnitDir {
		return StartLine(r)
	}
	return "systemctl enable --now " + filepath.Join(dir, r.UnitName())
}

// Preflight fails as Install would when the unit directory cannot be
// written (ErrNeedsRoot without root), before anything is copied.
func (in Installer) Preflight() error { return checkWritable(in.unitDir()) }

// DefaultInstallDir is where apiary service install copies the binary and
// the libraries beside it (llama.cpp's, found through $ORIGIN).
const DefaultInstallDir = "/usr/local/lib/apiary"

// InstallBinary copies the apiary binary bin and the shared libraries
// beside it (lib*.so, and CUDA's version file) into dir, replacing what
// is there, each through a temporary file and a rename.
func InstallBinary(bin, dir string, out io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("%w: cannot create %s", ErrNeedsRoot, dir)
		}
		return fmt.Errorf("create %s: %w", dir, err)
	}
	files := []string{bin}
	libs, _ := filepath.Glob(filepath.Join(filepath.Dir(bin), "lib*.so*"))
	files = append(files, libs...)
	if v, err := filepath.Glob(filepath.Join(filepath.Dir(bin), "*.cuda-version")); err == nil {
		files = append(files, v...)
	}
	for _, f := range files {
		if err := copyFile(f, filepath.Join(dir, filepath.Base(f))); err != nil {
			if errors.Is(err, fs.ErrPermission) {
				return fmt.Errorf("%w: cannot write %s", ErrNeedsRoot, dir)
			}
			return err
		}
	}
	fmt.Fprintf(out, "copied %s and %d libraries to %s\n", filepath.Base(bin), len(files)-1, dir)
	return nil
}

// copyFile copies src to dst (mode 0755) through a temporary file.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

func (in Installer) start(ctx context.Context) error {
	name := in.Unit.Role.UnitName()
	if !in.Now {
		in.say("to start it now and at every boot, run:\n  %s", startLine(in.Unit.Role, in.unitDir()))
		return nil
	}
	if filepath.Clean(in.unitDir()) != DefaultUnitDir {
		name = filepath.Join(in.unitDir(), name) // systemctl links a unit by its whole path
	}
	for _, args := range [][]string{{"daemon-reload"}, {"enable", "--now", name}} {
		if err := systemctl(ctx, args...); err != nil {
			return err
		}
		in.say("ran systemctl %s", strings.Join(args, " "))
	}
	return nil
}

func systemctl(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "systemctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Uninstall removes role's unit file from unitDir (DefaultUnitDir when
// ""); with now, it first runs systemctl disable --now, and after
// daemon-reload. The user, the data and models directories and the
// environment file are kept, and out says so.
func Uninstall(ctx context.Context, r Role, unitDir string, now bool, out io.Writer) error {
	if unitDir == "" {
		unitDir = DefaultUnitDir
	}
	path := filepath.Join(unitDir, r.UnitName())
	if _, err := os.Stat(path); err != nil {
		return err
	}
	if now {
		if err := systemctl(ctx, "disable", "--now", r.UnitName()); err != nil {
			return err
		}
		fmt.Fprintf(out, "ran systemctl disable --now %s\n", r.UnitName())
	}
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("%w to remove %s: %w", ErrNeedsRoot, path, err)
		}
		return err
	}
	fmt.Fprintf(out, "removed %s\n", path)
	if now {
		if err := systemctl(ctx, "daemon-reload"); err != nil {
			return err
		}
		fmt.Fprintln(out, "ran systemctl daemon-reload")
	} else {
		fmt.Fprintf(out, "run: systemctl daemon-reload (a service still running keeps running until stopped: systemctl stop %s)\n", r.UnitName())
	}
	fmt.Fprintln(out, "kept: the user, the data and models directories and the environment file (remove them by hand if they are no longer wanted)")
	return nil
}
