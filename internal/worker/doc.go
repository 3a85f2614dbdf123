// Package worker is apiary's worker daemon: one process that loads one GGUF
// model through an engine.Engine and serves it over the OpenAI-compatible
// HTTP API, with real per-token streaming.
//
// Lifecycle (see Worker.Run): the worker listens first (status loading;
// inference answers 503 model_loading), loads the model (ready), reports
// ready to its hive when it has a callback URL, serves, and on SIGTERM or
// POST /v1/admin/shutdown drains: new requests get 503 draining, queued ones
// give up, in-flight generations get Config.ShutdownGrace to finish and are
// then cancelled (a stream ends with an error event), the model is unloaded
// and Run returns nil.
//
// Scheduling: Config.Slots generations run at once; up to Config.QueueSize
// more wait for a slot in arrival order; beyond that a request is refused
// with 503 queue_full and Retry-After. A client that disconnects cancels its
// generation at the next token.
//
// Generation: parameters a request leaves out take llama.cpp's server
// defaults (temperature 0.8, top_p 0.95, top_k 40, min_p 0.05, a random
// seed; seed -1 is random too). max_tokens defaults to the room left in the
// slot's context, and a request for more than that room stops with finish
// reason "length" where the context ends. A prompt that leaves no room is
// 400 context_length_exceeded. Streamed text is released as soon as it is
// certain: bytes of a UTF-8 character split across tokens wait for the rest
// of the character, and text that may begin a stop sequence waits until the
// next tokens decide; the stop sequence itself is never sent. The model id
// in requests must be empty or the worker's ModelRef (else 404
// model_not_found).
package worker
