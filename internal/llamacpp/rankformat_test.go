package llamacpp

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// rerankFormat pairs a query and a document as llama.cpp's server does
// (format_prompt_rerank): through the rerank template, its special tokens
// parsed, or the texts, not parsed, [BOS] query [EOS] [SEP] document [EOS] with each special
// token only when the vocabulary adds it.
func TestRerankFormat(t *testing.T) {
	// tokenize writes each character as its code, a parsed special
	// marker "<s>" as -1.
	tokenize := func(text string, parseSpecial bool) ([]int, error) {
		var out []int
		for len(text) > 0 {
			if parseSpecial && strings.HasPrefix(text, "<s>") {
				out = append(out, -1)
				text = text[3:]
				continue
			}
			out = append(out, int(text[0]))
			text = text[1:]
		}
		return out, nil
	}
	const bos, eos, sep = 1000, 1001, 1002
	tests := []struct {
		name string
		f    rerankFormat
		want []int
	}{
		{"template", rerankFormat{template: "<s>{query}|{document}", bos: bos, eos: eos, addBOS: true, addEOS: true},
			[]int{-1, 'q', -1, '|', 'd'}}, // the filled-in template is parsed whole, as llama.cpp's server parses it
		{"BERT-style: BOS, EOS and SEP added", rerankFormat{bos: bos, eos: eos, sep: sep, addBOS: true, addEOS: true, addSEP: true},
			[]int{bos, 'q', '<', 's', '>', eos, sep, 'd', eos}},
		{"BOS only", rerankFormat{bos: bos, eos: eos, sep: sep, addBOS: true},
			[]int{bos, 'q', '<', 's', '>', 'd'}},
		{"EOS only", rerankFormat{bos: bos, eos: eos, addEOS: true},
			[]int{'q', '<', 's', '>', eos, 'd', eos}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.f.tokens("q<s>", "d", tokenize)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("tokens (-want +got):\n%s", diff)
			}
		})
	}
}
