// Command fakeengine is a scripted external engine for the tests: an
// OpenAI-compatible server of one canned answer that misbehaves as its
// -mode says (comma-separated):
//
//	never-healthy  /health answers 503 for ever
//	exit           exits 3 at once, after a line of output
//	ignore-term    ignores SIGTERM
//	fork-child     starts a child in its process group that ignores
//	               SIGTERM and SIGHUP and writes its pid to -child-pid
//	flap           /health answers 200 and 503 in turn
//	slow=D         a chat completion takes D (a stream sends its three
//	               chunks over D)
//	answer-early   a chat completion is answered once its JSON object
//	               arrived, before the request's body ends (full duplex,
//	               as a server that reads only what it needs may)
//
// Its chat answer echoes what it received: the request's body and its
// Authorization header. It takes its flags in three shapes, those of
// docs/engines.md's examples: its own (-host, -port, -model), vLLM's
// (serve MODEL --host H --port P --max-model-len N --max-num-seqs N) and
// the generic server's (--model M --listen HOST:PORT); with vLLM's
// --served-model-name it answers only requests for that model, as vLLM
// does. It answers 200 on
// both /health and /ready. With -pid-file it writes its pid there.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	args := os.Args[1:]
	var model string
	if len(args) >= 2 && args[0] == "serve" { // vLLM's shape
		model, args = args[1], args[2:]
	}
	fs := flag.NewFlagSet("fakeengine", flag.ExitOnError)
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 0, "port to listen on")
	listen := fs.String("listen", "", "HOST:PORT to listen on, instead of -host and -port")
	fs.StringVar(&model, "model", model, "model file")
	fs.Int("max-model-len", 0, "accepted, as vLLM's")
	fs.Int("max-num-seqs", 0, "accepted, as vLLM's")
	served := fs.String("served-model-name", "", "the only model name answered, as vLLM's; others get 404")
	mode := fs.String("mode", "", "comma-separated misbehaviours")
	childPID := fs.String("child-pid", "", "file the fork-child child writes its pid to")
	pidFile := fs.String("pid-file", "", "file to write this process's pid to")
	child := fs.Bool("child", false, "run as the fork-child child")
	_ = fs.Parse(args)
	modes := map[string]string{}
	for _, m := range strings.Split(*mode, ",") {
		k, v, _ := strings.Cut(m, "=")
		modes[k] = v
	}
	has := func(m string) bool { _, ok := modes[m]; return ok }
	if *child {
		signal.Ignore(syscall.SIGTERM, syscall.SIGHUP)
		if err := os.WriteFile(*childPID, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			os.Exit(1)
		}
		select {}
	}
	addr := net.JoinHostPort(*host, strconv.Itoa(*port))
	if *listen != "" {
		addr = *listen
	}
	fmt.Printf("fakeengine: model %s on %s, mode %q\n", model, addr, *mode)
	if *pidFile != "" {
		if err := os.WriteFile(*pidFile, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			fmt.Println("fakeengine:", err)
			os.Exit(1)
		}
	}
	if has("exit") {
		fmt.Println("fakeengine: exiting at once as told")
		os.Exit(3)
	}
	if has("ignore-term") {
		signal.Ignore(syscall.SIGTERM)
	}
	if has("fork-child") {
		c := exec.Command(os.Args[0], "-child", "-child-pid", *childPID)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			fmt.Println("fakeengine: fork:", err)
			os.Exit(1)
		}
	}
	var slow time.Duration
	if has("slow") {
		d, err := time.ParseDuration(modes["slow"])
		if err != nil {
			fmt.Println("fakeengine: slow:", err)
			os.Exit(2)
		}
		slow = d
	}
	var healthAsks atomic.Int64
	health := func(w http.ResponseWriter, _ *http.Request) {
		n := healthAsks.Add(1)
		if has("never-healthy") || (has("flap") && n%2 == 0) {
			http.Error(w, "loading", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, `{"status":"ok"}`)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", health)
	mux.HandleFunc("GET /ready", health)
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		var body []byte
		if has("answer-early") {
			var raw json.RawMessage
			_ = http.NewResponseController(w).EnableFullDuplex()
			_ = json.NewDecoder(r.Body).Decode(&raw)
			body = raw
		} else {
			body, _ = io.ReadAll(r.Body)
		}
		_ = json.Unmarshal(body, &req)
		if *served != "" && req.Model != *served {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":{"message":"The model %q does not exist.","type":"NotFoundError","code":404}}`+"\n", req.Model)
			return
		}
		if req.Stream {
			stream(w, r, model, slow)
			return
		}
		select {
		case <-time.After(slow):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-fake", "object": "chat.completion", "model": model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]any{"role": "assistant", "content": "fake engine answer"}}},
			"usage":         map[string]int{"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
			"received_body": string(body), "received_authorization": r.Header.Get("Authorization"),
		})
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Println("fakeengine:", err)
		os.Exit(1)
	}
	fmt.Println("fakeengine: serving")
	if err := http.Serve(ln, mux); err != nil {
		fmt.Println("fakeengine:", err)
		os.Exit(1)
	}
}

// stream sends the answer as three chunks spread over d, then [DONE].
func stream(w http.ResponseWriter, r *http.Request, model string, d time.Duration) {
	w.Header().Set("Content-Type", "text/event-stream")
	for i, word := range []string{"fake ", "engine ", "answer"} {
		if i > 0 {
			select {
			case <-time.After(d / 2):
			case <-r.Context().Done():
				return
			}
		}
		chunk, _ := json.Marshal(map[string]any{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": word}}}})
		fmt.Fprintf(w, "data: %s\n\n", chunk)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}
