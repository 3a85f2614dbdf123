package testmodel

import "strings"

// A text model (Options.Text) writes words. A random model samples its
// tokens almost evenly, and most of the byte-level vocabulary is byte
// tokens: alone, <0x80> … <0xFF> are no text at all (the worker shows
// each run of them as U+FFFD) and <0x00> … <0x1F> are control
// characters. SentencePiece needs the byte tokens to tokenize what has no
// token of its own (a newline, any character outside printable ASCII), so
// a text model keeps them, and words besides; its weights make every
// token but the words, "," and "." and end of text too unlikely for any
// sampler to pick, while the rest of the weights stay random:
//
//   - component 0 of every token embedding is textConstant, and no layer
//     writes to component 0 of the residual stream (that row of each
//     matrix that writes to it, attn_output, ssm_out, ffn_down and
//     ffn_down_exps, is 0), so after the final norm it is positive at
//     every position, whatever the layers do;
//   - the output has a matrix of its own (also for the architectures
//     whose output is otherwise tied to token_embd), whose component 0 is
//     0 for the tokens it may write and -textBan for the others, which
//     puts their logits tens to hundreds below the words'.
//
// Grammar-constrained sampling still reaches every token: a grammar that
// needs a newline gets one, as the banned tokens keep their order.
const (
	textConstant = 1
	textBan      = 100
)

// textWords are the text model's words, each a token "▁word" (SentencePiece's
// space before it). None is a single letter: "▁" and a letter never merge,
// so a prompt tokenizes one character a token, as with the byte-level
// vocabulary.
var textWords = strings.Fields(`
	the of and to in is it that was for on are as with they at be this from have or by one had not but what all
	were when we there can an your which their said if do will each about how up out them then she many some so
	these would other into has more her two like him see time could no make than first been its who now people
	my made over did down only way find use may water long little very after words called just where most know
	bee bees hive hives queen drone drones worker workers honey wax comb nectar pollen flower flowers swarm buzz
	sting garden meadow sun summer spring clover lavender sweet gold golden dance fly home nest colony keeper
	smoke frame brood cell cells royal jelly`)

// textPunctuation are the single characters a text model writes besides
// its words.
const textPunctuation = ",."

// TextVocabSize is the number of tokens of a text model's vocabulary: the
// byte-level vocabulary (the same tokens at the same ids) and the words.
// It is the default and least Options.Vocab of a text model.
var TextVocabSize = VocabSize + len(textWords)

// writable reports whether a text model may write the token: a word,
// "," or ".", or end of text.
func writable(token string, id int) bool {
	return id == EOSToken || strings.HasPrefix(token, "▁") && len(token) > len("▁") ||
		len(token) == 1 && strings.Contains(textPunctuation, token)
}

// writesResidual reports whether the layer tensor name is a matrix whose
// outputs add to the residual stream.
func writesResidual(name string) bool {
	for _, suffix := range []string{".attn_output.weight", ".ssm_out.weight", ".ffn_down.weight", ".ffn_down_exps.weight"} {
		if strings.HasSuffix(name, suffix) {
			return true
		}
	}
	return false
}

// textAdjust returns how a text model changes the values of the tensor
// (value i of the tensor, drawn or filled as for any model), or nil when
// it leaves them as they are. tokens is the vocabulary.
func textAdjust(s shape, t tensor, tokens []string) func(i int, v float32) float32 {
	dim := s.Dim
	switch {
	case t.Name == "token_embd.weight":
		return func(i int, v float32) float32 {
			if i%dim == 0 {
				return textConstant
			}
			return v
		}
	case t.Name == "output.weight":
		return func(i int, v float32) float32 {
			if i%dim != 0 {
				return v
			}
			if id := i / dim; writable(tokens[id], id) {
				return 0
			}
			return -textBan
		}
	case writesResidual(t.Name):
		in := int(t.Shape[0]) // [inputs, dim] or [inputs, dim, experts]
		return func(i int, v float32) float32 {
			if (i/in)%dim == 0 {
				return 0
			}
			return v
		}
	}
	return nil
}
