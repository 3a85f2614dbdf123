package llamacpp_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/llamacpp"
	"github.com/apiary-llm/apiary/internal/testmodel"
	"github.com/google/go-cmp/cmp"
)

// A reranker (testmodel's: rank pooling, a classifier head, a rerank
// template) loads as one, its input is the template filled in, and Rank
// gives a probability, the same for the same pair; a model that is no
// reranker says so.
func TestRank(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ranker.gguf")
	if err := testmodel.WriteFile(path, testmodel.Options{Rerank: true}); err != nil {
		t.Fatal(err)
	}
	e := loadPath(t, path, 1, 256)
	if !e.Info().Reranker {
		t.Fatal("Info().Reranker is false for a model of rank pooling")
	}
	in, err := e.RerankInput("bees", "honey")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := e.Tokenize("Query: bees\nDocument: honey\nRelevant:", false)
	if diff := cmp.Diff(want, in); diff != "" {
		t.Errorf("input (-the template filled in +got):\n%s", diff)
	}
	ctx := context.Background()
	scores := map[string]float32{}
	for _, doc := range []string{"honey", "stocks", "honey"} {
		in, err := e.RerankInput("bees", doc)
		if err != nil {
			t.Fatal(err)
		}
		s, err := e.Rank(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if s <= 0 || s >= 1 {
			t.Errorf("score of %q: %v, want a probability", doc, s)
		}
		if old, ok := scores[doc]; ok && old != s {
			t.Errorf("score of %q: %v, then %v", doc, old, s)
		}
		scores[doc] = s
	}
	if scores["honey"] == scores["stocks"] {
		t.Errorf("two documents score the same: %v", scores)
	}

	plain := load(t, 1)
	if plain.Info().Reranker {
		t.Error("Info().Reranker is true for a model without rank pooling")
	}
	if _, err := plain.Rank(ctx, prompt(t, plain, "x")); !errors.Is(err, engine.ErrNotReranker) {
		t.Errorf("Rank on a model that is no reranker: %v, want ErrNotReranker", err)
	}
	var _ engine.Engine = (*llamacpp.Engine)(nil)
}
