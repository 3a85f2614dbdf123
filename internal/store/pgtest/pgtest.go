// Package pgtest starts a throwaway PostgreSQL cluster for tests from the
// server binaries Debian's postgresql package installs
// (/usr/lib/postgresql/N/bin, or $APIARY_PG_BIN). The cluster lives in a
// temporary directory, listens only on a unix socket there (no TCP port to
// collide with), trusts local connections, and is removed by Stop.
//
// pg_ctl refuses to run as root; as root the cluster runs as the
// "postgres" system user (created by the package) through runuser.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// BinEnv overrides where initdb and pg_ctl are looked for.
const BinEnv = "APIARY_PG_BIN"

// Cluster is a running throwaway cluster.
type Cluster struct {
	dir, data, bin string
	runAs          string // "" or the user pg_ctl runs as
	seq            atomic.Int64
}

// findBin returns the newest /usr/lib/postgresql/N/bin holding initdb.
func findBin() (string, error) {
	if d := os.Getenv(BinEnv); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("pgtest: $%s=%s has no initdb: %w", BinEnv, d, err)
		}
		return d, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[j]))))
		return vi > vj
	})
	if len(matches) == 0 {
		return "", errors.New("pgtest: PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin: " +
			"install them (Debian: apt-get install postgresql postgresql-contrib) or set " + BinEnv)
	}
	return filepath.Dir(matches[0]), nil
}

// Start creates and starts a cluster. Call Stop when done.
func Start() (*Cluster, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "apiary-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c := &Cluster{dir: dir, data: filepath.Join(dir, "data"), bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: running as root needs the postgres system user (from Debian's postgresql package): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: %w", err)
		}
		c.runAs = "postgres"
	}
	if out, err := c.cmd("initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	opts := fmt.Sprintf("-k %s -c listen_addresses= -p 5432 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", dir)
	if out, err := c.cmd("pg_ctl", "-D", c.data, "-o", opts, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "start").CombinedOutput(); err != nil {
		logText, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: pg_ctl start: %w\n%s\n%s", err, out, logText)
	}
	return c, nil
}

func (c *Cluster) cmd(name string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, name)
	if c.runAs != "" {
		return exec.Command("runuser", append([]string{"-u", c.runAs, "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

// URL is the connection URL of database db in the cluster.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=5432&sslmode=disable", db, c.dir)
}

// NewDatabase creates an empty database with a fresh name and returns its
// URL.
func (c *Cluster) NewDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("apiary_test_%d_%d", os.Getpid(), c.seq.Add(1))
	db, err := sql.Open("pgx", c.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("pgtest: create database: %w", err)
	}
	return c.URL(name), nil
}

// Stop stops the cluster at once and removes its directory.
func (c *Cluster) Stop() error {
	out, err := c.cmd("pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop").CombinedOutput()
	rmErr := os.RemoveAll(c.dir)
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop: %w\n%s", err, out)
	}
	return rmErr
}
