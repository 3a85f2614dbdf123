package queen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/routing"
)

// Regression ("lifecycleId sits beside pool_id"): the admin
// worker answers say lifecycle_id, like every other key; a stop sent with
// the seed's lifecycleId is still taken, and the body is still strict.
func TestAdminWorkerLifecycleIDIsSnakeCase(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	status, body := x.do("POST", "/api/admin/workers", "", `{"action":"start","model":"tiny","pool_id":"a","reason":"r"}`)
	if status != http.StatusCreated || !bytes.Contains(body, []byte(`"lifecycle_id":"wk-`)) || bytes.Contains(body, []byte("lifecycleId")) {
		t.Fatalf("start: %d %s", status, body)
	}
	var resp struct {
		LifecycleID string `json:"lifecycle_id"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatal(err)
	}
	id := resp.LifecycleID
	for _, tc := range []struct {
		body   string
		status int
		says   string
	}{
		{fmt.Sprintf(`{"action":"stop","lifecycleId":%q,"reason":"old key"}`, id), http.StatusAccepted, `"lifecycle_id":"` + id},
		{fmt.Sprintf(`{"action":"stop","lifecycle_id":%q,"reason":"new key"}`, id), http.StatusAccepted, `"lifecycle_id":"` + id},
		{fmt.Sprintf(`{"action":"stop","lifecycle_id":%q,"lifecycleId":%q,"reason":"both"}`, id, id), http.StatusAccepted, `"lifecycle_id":"` + id},
		{fmt.Sprintf(`{"action":"stop","lifecycle_id":%q,"lifecycleId":"wk-0000000000000000","reason":"x"}`, id), http.StatusBadRequest, "differ"},
		{fmt.Sprintf(`{"action":"stop","lifecycle_id":%q,"reason":"x","bogus":1}`, id), http.StatusBadRequest, `unknown field \"bogus\"`},
		{`{"action":"start","model":"tiny","lifecycleId":"wk-0000000000000000","reason":"x"}`, http.StatusBadRequest, "lifecycle_id and drain belong to action stop"},
	} {
		status, body := x.do("POST", "/api/admin/workers", "", tc.body)
		if status != tc.status || !strings.Contains(string(body), tc.says) {
			t.Errorf("%s: %d %s, want %d and %q", tc.body, status, body, tc.status, tc.says)
		}
		if bytes.Contains(body, []byte("lifecycleId")) && status < 400 {
			t.Errorf("%s: the answer says lifecycleId: %s", tc.body, body)
		}
	}
}

// The queen's log lines carry one component key, its own (routing's
// loggers are checked in internal/routing).
func TestQueenLogLinesHaveOneComponent(t *testing.T) {
	var buf bytes.Buffer
	q, err := New(Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(), Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]*slog.Logger{"queen": q.log} {
		buf.Reset()
		l.Info("probe")
		if n := strings.Count(buf.String(), `"component":`); n != 1 || !strings.Contains(buf.String(), `"component":"`+name+`"`) {
			t.Errorf("%s logs %d component keys: %s", name, n, buf.String())
		}
	}
}

// The queen's Config reports every problem by field, nested configs
// dotted; it never names a command-line flag (cmd/apiary maps fields to
// flags).
func TestConfigProblemsNameFields(t *testing.T) {
	_, err := New(Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(), HiveTimeout: -time.Second,
		Routing: routing.Config{QueueSize: -1}, Ownership: OwnershipConfig{Owner: "nobody"}})
	var fields []string
	for _, fe := range config.Fields(err) {
		fields = append(fields, fe.Field)
	}
	slices.Sort(fields)
	if want := []string{"HiveTimeout", "Ownership.Owner", "Routing.QueueSize"}; !slices.Equal(fields, want) {
		t.Errorf("fields %v, want %v (error: %v)", fields, want, err)
	}
	if err != nil && strings.Contains(err.Error(), "--") {
		t.Errorf("the library names a flag: %v", err)
	}
}
