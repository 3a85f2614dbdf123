package openai

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDecodeRerankRequestAccepts(t *testing.T) {
	tests := []struct {
		name string
		body string
		want RerankRequest
	}{
		{"strings", `{"model":"r","query":"q","documents":["a","b"]}`, RerankRequest{Model: "r", Query: "q", Documents: []string{"a", "b"}}},
		{"objects with text (Jina, Cohere v1)", `{"query":"q","documents":[{"text":"a"},"b"]}`, RerankRequest{Query: "q", Documents: []string{"a", "b"}}},
		{"top_n and return_documents", `{"query":"q","documents":["a"],"top_n":3,"return_documents":true}`,
			RerankRequest{Query: "q", Documents: []string{"a"}, TopN: 3, ReturnDocuments: true}},
		{"unknown fields ignored", `{"query":"q","documents":["a"],"rank_fields":["x"],"top_n":null}`, RerankRequest{Query: "q", Documents: []string{"a"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeRerankRequest([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeRerankRequestRejects(t *testing.T) {
	tests := []struct {
		name string
		body string
		want wantErr
	}{
		{"not JSON", `{"query":`, bad(CodeInvalidJSON, "")},
		{"no query", `{"documents":["a"]}`, bad(CodeMissingParameter, "query")},
		{"empty query", `{"query":"","documents":["a"]}`, bad(CodeInvalidValue, "query")},
		{"query number", `{"query":1,"documents":["a"]}`, bad(CodeInvalidType, "query")},
		{"no documents", `{"query":"q"}`, bad(CodeMissingParameter, "documents")},
		{"documents empty", `{"query":"q","documents":[]}`, bad(CodeInvalidValue, "documents")},
		{"documents string", `{"query":"q","documents":"a"}`, bad(CodeInvalidType, "documents")},
		{"document number", `{"query":"q","documents":["a",2]}`, bad(CodeInvalidType, "documents[1]")},
		{"document empty", `{"query":"q","documents":["a",""]}`, bad(CodeInvalidValue, "documents[1]")},
		{"document object without text", `{"query":"q","documents":[{"title":"a"}]}`, bad(CodeMissingParameter, "documents[0].text")},
		{"top_n zero", `{"query":"q","documents":["a"],"top_n":0}`, bad(CodeInvalidValue, "top_n")},
		{"top_n fraction", `{"query":"q","documents":["a"],"top_n":1.5}`, bad(CodeInvalidType, "top_n")},
		{"return_documents string", `{"query":"q","documents":["a"],"return_documents":"yes"}`, bad(CodeInvalidType, "return_documents")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeRerankRequest([]byte(tt.body))
			checkErr(t, err, tt.want)
		})
	}
}

// Ranked sorts by score, the highest first, ties in the documents'
// order, and keeps top_n.
func TestRanked(t *testing.T) {
	in := []RerankResult{{Index: 0, RelevanceScore: 0.1}, {Index: 1, RelevanceScore: 0.9}, {Index: 2, RelevanceScore: 0.5}, {Index: 3, RelevanceScore: 0.9}}
	for _, tt := range []struct {
		topN int
		want []int
	}{{0, []int{1, 3, 2, 0}}, {2, []int{1, 3}}, {9, []int{1, 3, 2, 0}}} {
		var got []int
		for _, r := range Ranked(append([]RerankResult(nil), in...), tt.topN) {
			got = append(got, r.Index)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("top_n %d: indices (-want +got):\n%s", tt.topN, diff)
		}
	}
}
