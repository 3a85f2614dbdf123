// Package openai holds the wire side of apiary's OpenAI-compatible API: the
// request, response and stream-chunk types of POST /v1/completions, POST
// /v1/chat/completions and GET /v1/models, strict-but-compatible decoding,
// the error body, and a Server-Sent Events writer. It knows nothing about
// engines or routing, so the worker serves with it and the queen's router can
// decode, check and relay with it.
//
// # Decoding
//
// As OpenAI's own servers do, fields this package does not know are ignored.
// Known fields are checked, and the first that is wrong yields a 400 *Error
// whose Param names it ("temperature", "messages[1].content[0].type"):
//
//   - a wrong JSON type (code invalid_type), e.g. "temperature": "hot";
//   - a value out of range (invalid_value): max_tokens and
//     max_completion_tokens 1..Limits.MaxTokens, temperature 0..2, top_p
//     (0,1], min_p 0..1, top_k ≥ 0, presence/frequency_penalty -2..2,
//     repeat_penalty (0,10], logit_bias -100..100 on token ids, n
//     1..MaxChoices, best_of ≥ 1, top_logprobs and completions' logprobs
//     0..MaxTopLogprobs (top_logprobs needs logprobs), stop up to MaxStop
//     non-empty strings, grammar together with a JSON response_format;
//   - a missing prompt or messages (missing_required_parameter);
//   - a feature that is not supported (unsupported_parameter): best_of > 1,
//     echo, a non-empty suffix, token-array or multiple prompts, tools,
//     functions, tool_choice other than "none"/"auto", tool_calls in
//     messages, tool/function roles, non-text content parts (image_url,
//     input_audio, file), audio output, non-text modalities, and JSON
//     schema keywords outside the subset CheckSchema accepts.
//
// null is treated as absent everywhere. Integers may be written as integral
// numbers (100.0, 1e3). The "developer" role is read as "system"; an
// assistant message may have null content. Array content is flattened by
// joining its text parts with "\n". The penalties apply to the last 64
// tokens, as in llama.cpp's server. Extensions understood as llama.cpp's
// server does: top_k, min_p, repeat_penalty, ignore_eos, grammar.
//
// # Errors
//
// Every error answer, and the last event of a stream that fails after it
// began, is {"error":{"code","message","type","param"}}: code is apiary's
// snake_case code, type and param are what OpenAI clients read.
package openai
