package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/secret"
)

// Regression: `apiary queen --help` printed $APIARY_DATABASE_URL,
// password included, as the default of --database-url. No command's help
// shows a secret of the environment, nor a password in a URL default
// ($APIARY_QUEEN).
func TestHelpShowsNoSecret(t *testing.T) {
	for _, name := range secret.EnvNames() {
		t.Setenv(name, "s3cret-of-"+name)
	}
	t.Setenv(secret.DatabaseURLEnv, "postgres://u:s3cret@h/db")
	t.Setenv("APIARY_QUEEN", "http://u:s3cret@127.0.0.1:1")
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	walk(newRootCmd(io.Discard, io.Discard), nil)
	for _, path := range paths {
		args := append(path, "--help")
		code, out, errOut := apiary(t, args...)
		if code != 0 {
			t.Errorf("apiary %v: exit %d\n%s", args, code, errOut)
		}
		if strings.Contains(out+errOut, "s3cret") || strings.Contains(out+errOut, "@h/db") {
			t.Errorf("apiary %v shows a secret:\n%s%s", args, out, errOut)
		}
	}
	_, out, _ := apiary(t, "queen", "--help")
	if !strings.Contains(out, "set from $APIARY_DATABASE_URL") {
		t.Errorf("queen --help does not say that $APIARY_DATABASE_URL is set:\n%s", out)
	}
	if len(paths) < 10 {
		t.Errorf("only %d commands walked", len(paths))
	}
}

// The queen takes --database-url from $APIARY_DATABASE_URL (the help no
// longer holds it), and a database that cannot be opened is reported
// without the password, whether the URL came from the environment or the
// flag, even where pgx's own redaction leaves part of it.
func TestQueenDatabaseErrorHidesPassword(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
	}{
		{env: "postgres://u:s3cr@s3cret-tail@127.0.0.1:notaport/db"},
		{env: "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=5"},
		{args: []string{"--database-url", "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=5"}},
	} {
		t.Setenv(secret.DatabaseURLEnv, tc.env)
		args := append([]string{"queen", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, tc.args...)
		code, out, errOut := apiary(t, args...)
		if code == 0 || !strings.Contains(errOut, "PostgreSQL") {
			t.Errorf("apiary %v with $%s=%q: exit %d, want a PostgreSQL error\n%s", args, secret.DatabaseURLEnv, tc.env, code, errOut)
		}
		if strings.Contains(out+errOut, "s3cr") {
			t.Errorf("apiary %v with $%s=%q shows the password:\n%s%s", args, secret.DatabaseURLEnv, tc.env, out, errOut)
		}
	}
}
