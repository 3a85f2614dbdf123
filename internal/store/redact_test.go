package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/store"
)

// A database URL's password never shows in Open's errors: not when the
// server refuses, not when nothing listens, not when the URL does not
// parse (pgx's own redaction is best effort).
func TestOpenErrorsHideThePassword(t *testing.T) {
	for _, url := range []string{
		strings.Replace(pg.URL("apiary_no_such_db"), "postgres@", "postgres:s3cret@", 1),
		"postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=5",
		"postgres://u:s3cr%zzet@127.0.0.1/db",
		"postgres://u:s3cr@s3cret-tail@127.0.0.1:notaport/db",
		"postgres://u:s3cr/s3cret-tail@127.0.0.1:1/db",
		"postgres://u:s3cr#s3cret-tail@127.0.0.1:1/db",
		"postgresql://127.0.0.1:1/db?password=s3cret&sslmode=bogus",
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		s, err := store.Open(ctx, store.Config{URL: url})
		cancel()
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", url)
			continue
		}
		if strings.Contains(err.Error(), "s3cr") {
			t.Errorf("Open(%q) error shows the password: %v", url, err)
		}
	}
}
