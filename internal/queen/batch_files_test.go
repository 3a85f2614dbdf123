package queen

import (
	"database/sql"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	oai "github.com/openai/openai-go"
)

// On PostgreSQL the Batch API's files live in the database: an upload
// and a batch's output are chunks there and nothing is left in the data
// dir; a delete removes the chunks with the row; a file of a queen from
// before (its bytes in the data dir, none in the database) is still read
// and made a batch of.
func TestBatchFilesLiveInTheDatabaseOnPostgres(t *testing.T) {
	u, err := pg.NewDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	chunks := func(id string) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM batch_file_chunks WHERE file_id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	dir := t.TempDir()
	onDisk := func() []string {
		t.Helper()
		names, _ := filepath.Glob(filepath.Join(dir, "files", "*"))
		return names
	}
	content := func(client oai.Client, id string) string {
		t.Helper()
		resp, err := client.Files.Content(t.Context(), id)
		if err != nil {
			t.Fatalf("content of %s: %v", id, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	w := newScriptWorker(t, func(w http.ResponseWriter, r *http.Request, content string) { chatAnswer(w, "ok "+content) })
	pgAt := backend{"postgres", func(*testing.T) (string, string) { return "", u }}
	x, client := batchQueenOn(t, pgAt, w, func(c *Config) { c.DataDir = dir })

	in := chatLines("a", "b", "c")
	f, err := upload(t, client, in)
	if err != nil {
		t.Fatal(err)
	}
	if n := chunks(f.ID); n != 1 {
		t.Errorf("the upload has %d chunks in the database, want 1", n)
	}
	if got := content(client, f.ID); got != in {
		t.Errorf("content %q, want %q", got, in)
	}
	b, err := client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	ended := x.waitBatchEnd(t, client, b.ID)
	completedOnce(t, client, ended, 3)
	if n := chunks(ended.OutputFileID); n != 1 {
		t.Errorf("the output file has %d chunks in the database, want 1", n)
	}
	if names := onDisk(); len(names) != 0 {
		t.Errorf("files left in the data dir: %v", names)
	}
	if _, err := client.Files.Delete(t.Context(), f.ID); err != nil {
		t.Fatal(err)
	}
	if n := chunks(f.ID); n != 0 {
		t.Errorf("%d chunks of the deleted file left", n)
	}

	// A file of a queen before this one: its bytes in the data dir.
	old, err := upload(t, client, in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), "DELETE FROM batch_file_chunks WHERE file_id = $1", old.ID); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "files", old.ID+".jsonl"), []byte(in), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := content(client, old.ID); got != in {
		t.Errorf("content of the file in the data dir %q, want %q", got, in)
	}
	b, err = client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: old.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	completedOnce(t, client, x.waitBatchEnd(t, client, b.ID), 3)
	if _, err := client.Files.Delete(t.Context(), old.ID); err != nil {
		t.Fatal(err)
	}
	if names := onDisk(); len(names) != 0 {
		t.Errorf("the deleted file is left in the data dir: %v", names)
	}
}
