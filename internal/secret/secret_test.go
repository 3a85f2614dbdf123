package secret

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The one list names every secret apiary reads from the environment, and
// Scrub removes each of them (and only them).
func TestScrubRemovesEverySecret(t *testing.T) {
	want := []string{"APIARY_API_TOKEN", "APIARY_ADMIN_TOKEN", "APIARY_CLUSTER_TOKEN", "APIARY_WORKER_TOKEN",
		"APIARY_DATABASE_URL", "PGPASSWORD", "HF_TOKEN", "APIARY_ENGINE_KEY"}
	if diff := cmp.Diff(want, EnvNames()); diff != "" {
		t.Errorf("EnvNames (-want +got)\n%s", diff)
	}
	env := []string{"PATH=/bin", "HOME=/root", "APIARY_QUEEN=http://q:8080", "APIARY_CPU_VARIANT=portable", "NOEQUALS"}
	keep := append([]string(nil), env...)
	for _, name := range want {
		env = append(env, name+"=s3cret", name+"=")
	}
	if diff := cmp.Diff(keep, Scrub(env)); diff != "" {
		t.Errorf("Scrub (-want +got)\n%s", diff)
	}
}

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:s3cret@db.example:5432/apiary?sslmode=require", "postgres://u:xxxxx@db.example:5432/apiary?sslmode=require"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		{"postgresql://h/db?user=u&password=s3cret", "postgresql://h/db?password=xxxxx&user=u"},
		{"postgres://u:s3%2Fcr%40et@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3cr@et@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3cr%zzet@h/db", "postgres://xxxxx@h/db"}, // does not parse
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"", ""},
	} {
		got := RedactURL(tc.in)
		if got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "s3") {
			t.Errorf("RedactURL(%q) = %q shows the password", tc.in, got)
		}
	}
}

func TestRedactError(t *testing.T) {
	for _, tc := range []struct{ u, pw string }{
		{"postgres://u:s3cret@h/db", "s3cret"},
		{"postgres://u:s3%2Fcr%40et@h/db", "s3/cr@et"},
		{"postgres://u:s3cr%zzet@h/db", "s3cr%zzet"},
		{"postgresql://h/db?password=s3cret", "s3cret"},
	} {
		err := fmt.Errorf("store: connect to PostgreSQL: %w", fmt.Errorf("cannot parse `%s`: password %s: %w", tc.u, tc.pw, fs.ErrNotExist))
		got := RedactError(err, tc.u)
		if strings.Contains(got.Error(), "s3") {
			t.Errorf("RedactError(%q) = %q shows the password", tc.u, got)
		}
		if !strings.Contains(got.Error(), "store: connect to PostgreSQL: cannot parse") || !errors.Is(got, fs.ErrNotExist) {
			t.Errorf("RedactError(%q) = %q: lost the message or the chain", tc.u, got)
		}
	}
	// What pgx's own best-effort redaction leaves of a password with "@".
	u := "postgres://u:s3cr@s3cret-tail@h:x/db"
	if got := RedactError(errors.New("cannot parse `postgres://u:xxxxx@s3cret-tail@h:x/db`: invalid port"), u); strings.Contains(got.Error(), "s3") {
		t.Errorf("RedactError(%q) = %q shows part of the password", u, got)
	}
	if RedactError(nil, "postgres://u:p@h/db") != nil {
		t.Error("RedactError(nil) != nil")
	}
	plain := errors.New("no secret here")
	if RedactError(plain, "postgres://u:s3cret@h/db") != plain {
		t.Error("an error without the secret should come back as it is")
	}
}
