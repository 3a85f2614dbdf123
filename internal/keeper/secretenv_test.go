package keeper

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/testbin"
)

// Regression: the queen of ephemeral mode inherited the
// keeper's whole environment, $APIARY_DATABASE_URL and $PGPASSWORD
// included, and took the operator's database for its throwaway one. It
// gets no secret but the tokens the keeper sends, and answers from its own
// SQLite file.
func TestEphemeral_QueenGetsNoDatabaseSecret(t *testing.T) {
	t.Setenv("APIARY_DATABASE_URL", "postgres://u:db-s3cret@127.0.0.1:1/db")
	t.Setenv("PGPASSWORD", "pg-s3cret")
	t.Setenv("APIARY_WORKER_TOKEN", "worker-s3cret-0123456789")
	k := startKeeper(t, ephemeralArgs(t, "--prompt", "hello bees", "--max-tokens", "4")...)
	queen := testbin.AwaitProcess(t, k.marker, " queen ")
	if env, err := os.ReadFile("/proc/" + strconv.Itoa(queen) + "/environ"); err != nil {
		t.Errorf("environment of the ephemeral queen: %v", err)
	} else if strings.Contains(string(env), "s3cret") {
		t.Errorf("the ephemeral queen inherited a secret: %q", env)
	}
	if code := k.Wait(t); code != 0 {
		t.Fatalf("keeper exit %d; stderr:\n%s", code, k.Lines.String())
	}
	if k.Stdout() == "" {
		t.Errorf("no answer on stdout; stderr:\n%s", k.Lines.String())
	}
	k.gone(t)
}
