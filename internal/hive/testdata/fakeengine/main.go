// Command fakeengine is a scripted external engine for the hive's tests:
// an OpenAI-compatible server of one canned answer that misbehaves as
// its -mode says (comma-separated):
//
//	never-healthy  /health answers 503 for ever
//	exit           exits 3 at once, after a line of output
//	ignore-term    ignores SIGTERM
//	fork-child     starts a child in its process group that ignores
//	               SIGTERM and SIGHUP and writes its pid to -child-pid
//
// Its chat answer echoes what it received: the request's body and its
// Authorization header.
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
	"syscall"
)

func main() {
	host := flag.String("host", "127.0.0.1", "address to listen on")
	port := flag.Int("port", 0, "port to listen on")
	model := flag.String("model", "", "model file")
	mode := flag.String("mode", "", "comma-separated misbehaviours")
	childPID := flag.String("child-pid", "", "file the fork-child child writes its pid to")
	child := flag.Bool("child", false, "run as the fork-child child")
	flag.Parse()
	modes := map[string]bool{}
	for _, m := range strings.Split(*mode, ",") {
		modes[m] = true
	}
	if *child {
		signal.Ignore(syscall.SIGTERM, syscall.SIGHUP)
		if err := os.WriteFile(*childPID, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			os.Exit(1)
		}
		select {}
	}
	fmt.Printf("fakeengine: model %s on %s:%d, mode %q\n", *model, *host, *port, *mode)
	if modes["exit"] {
		fmt.Println("fakeengine: exiting at once as told")
		os.Exit(3)
	}
	if modes["ignore-term"] {
		signal.Ignore(syscall.SIGTERM)
	}
	if modes["fork-child"] {
		c := exec.Command(os.Args[0], "-child", "-child-pid", *childPID)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			fmt.Println("fakeengine: fork:", err)
			os.Exit(1)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		if modes["never-healthy"] {
			http.Error(w, "loading", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, `{"status":"ok"}`)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-fake", "object": "chat.completion", "model": *model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]any{"role": "assistant", "content": "fake engine answer"}}},
			"usage":         map[string]int{"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
			"received_body": string(body), "received_authorization": r.Header.Get("Authorization"),
		})
	})
	ln, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
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
