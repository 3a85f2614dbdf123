package hive

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
)

// The test binary doubles as a scriptable worker: with APIARY_FAKE_WORKER
// set, TestMain runs fakeWorkerMain instead of the tests. It speaks the
// worker protocol (flags, ready callback with the token from the
// environment, /health, /v1/completions, /v1/admin/shutdown, SIGTERM) and
// misbehaves as the comma-separated behaviours say:
//
//	no-callback      listens but never calls back
//	ignore-term      ignores SIGTERM, and acknowledges shutdown without exiting
//	grandchild       forks a grandchild that inherits the listening socket, then crashes
//	holder           forks that grandchild and keeps running
//	crash-mid-stream exits 7 in the middle of a streamed completion
//	hang-health      /health never answers once the worker is ready
//	exit=N           exits with code N right after the callback
//	bad-token        calls back with a wrong token
//	vram=N           reports vram_bytes N
//	no-pdeathsig     clears its parent-death signal (a survivor if the hive is killed)
//	slow=D           each completion takes D
//	health-fail=N    the first N /health checks after the callback answer 500
//	hold             the grandchild role: sleep holding inherited files
//	start-delay=D    waits D before it takes its socket
const fakeWorkerEnv = "APIARY_FAKE_WORKER"

type fakeWorker struct {
	behave   map[string]string
	mu       sync.Mutex
	inFlight int        // guarded by mu
	lastReq  *time.Time // guarded by mu
	draining bool       // guarded by mu
	quit     chan struct{}
	quitOnce sync.Once
	wg       sync.WaitGroup
}

func fakeWorkerMain(spec string, args []string) int {
	fw := &fakeWorker{behave: map[string]string{}, quit: make(chan struct{})}
	for _, b := range strings.Split(spec, ",") {
		k, v, _ := strings.Cut(b, "=")
		fw.behave[k] = v
	}
	if _, ok := fw.behave["hold"]; ok {
		time.Sleep(time.Hour)
		return 0
	}
	if _, ok := fw.behave["no-pdeathsig"]; ok {
		_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, 0, 0)
		// A survivor must also outlive the pipe to its dead hive: without
		// this, its next write to stderr ends it with SIGPIPE.
		signal.Ignore(syscall.SIGPIPE)
	}
	if len(args) > 0 && args[0] == "worker" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	id := fs.String("worker-id", "", "")
	_ = fs.String("model", "", "")
	_ = fs.Int("gpu-device", 0, "")
	port := fs.Int("port", 0, "")
	host := fs.String("host", "127.0.0.1", "")
	listenFD := fs.Int("listen-fd", 0, "")
	cbURL := fs.String("callback-url", "", "")
	_ = fs.String("lifecycle-id", "", "")
	_ = fs.Int("ctx-size", 0, "")
	_ = fs.Int("slots", 0, "")
	_ = fs.Int("threads", 0, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	token := os.Getenv("APIARY_WORKER_TOKEN")

	if _, ok := fw.behave["ignore-term"]; ok {
		signal.Ignore(syscall.SIGTERM)
	} else {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM)
		go func() { <-sigs; fw.shutdown() }()
	}

	if d, ok := fw.behave["start-delay"]; ok {
		pause, _ := time.ParseDuration(d)
		time.Sleep(pause)
	}
	var ln net.Listener
	var err error
	if *listenFD != 0 {
		f := os.NewFile(uintptr(*listenFD), "listen-fd")
		ln, err = net.FileListener(f)
		f.Close()
	} else {
		ln, err = net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake worker:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "fake worker %s listening on %s (%s)\n", *id, ln.Addr(), spec)
	fmt.Fprintf(os.Stderr, "fake worker args: %s\n", strings.Join(args, " "))
	_, crashes := fw.behave["grandchild"]
	if _, holds := fw.behave["holder"]; holds || crashes {
		lf, _ := ln.(*net.TCPListener).File()
		gc := exec.Command(os.Args[0])
		gc.Env = append(os.Environ(), fakeWorkerEnv+"=hold")
		gc.ExtraFiles = []*os.File{lf}
		gc.Stderr = os.Stderr
		if err := gc.Start(); err != nil {
			return 1
		}
		fmt.Fprintf(os.Stderr, "grandchild %d holds the port\n", gc.Process.Pid)
	}
	ready := make(chan struct{})
	mux := http.NewServeMux()
	healthFails, _ := strconv.Atoi(fw.behave["health-fail"])
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-ready:
			fw.mu.Lock()
			fail := healthFails > 0
			healthFails--
			fw.mu.Unlock()
			if fail {
				http.Error(w, "sick", http.StatusInternalServerError)
				return
			}
		default:
		}
		if _, ok := fw.behave["hang-health"]; ok {
			select {
			case <-ready:
				<-r.Context().Done() // never answer
				return
			default:
			}
		}
		fw.mu.Lock()
		h := api.WorkerHealth{Status: "ready", Model: "tiny", InFlight: fw.inFlight, LastRequestAt: fw.lastReq}
		if fw.inFlight > 0 {
			h.Status = "busy"
		}
		if fw.draining {
			h.Status = "draining"
		}
		fw.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(h)
	})
	mux.HandleFunc("POST /v1/completions", fw.completions)
	mux.HandleFunc("POST /v1/admin/shutdown", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"error":{"code":"unauthorized","message":"token"}}`, http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		if _, ok := fw.behave["ignore-term"]; !ok {
			go fw.shutdown()
		}
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()

	if _, ok := fw.behave["no-callback"]; !ok {
		cbToken := token
		if _, ok := fw.behave["bad-token"]; ok {
			cbToken = "not-the-token"
		}
		vram := uint64(1 << 20)
		if v, ok := fw.behave["vram"]; ok {
			vram, _ = strconv.ParseUint(v, 10, 64)
		}
		body, _ := json.Marshal(api.ReadyCallback{WorkerID: *id, VRAMBytes: vram, URI: "http://" + ln.Addr().String()})
		req, _ := http.NewRequest(http.MethodPost, *cbURL, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+cbToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		_, survivor := fw.behave["no-pdeathsig"]
		switch {
		case err != nil && survivor:
			// A survivor's test kills the hive as soon as it reports the
			// worker ready, which can be before the hive's answer to this
			// callback left: the hive took it, and the fake must live on.
			fmt.Fprintln(os.Stderr, "fake worker: callback (the hive may be gone):", err)
		case err != nil:
			fmt.Fprintln(os.Stderr, "fake worker: callback:", err)
			return 3
		default:
			resp.Body.Close()
		}
		if err == nil && resp.StatusCode != http.StatusOK {
			fmt.Fprintln(os.Stderr, "fake worker: callback refused:", resp.Status)
			return 4
		}
		close(ready)
	}
	if v, ok := fw.behave["exit"]; ok {
		code, _ := strconv.Atoi(v)
		fmt.Fprintf(os.Stderr, "fake worker exiting with %d as told\n", code)
		return code
	}
	if _, ok := fw.behave["grandchild"]; ok {
		fmt.Fprintln(os.Stderr, "fake worker crashing, grandchild keeps the port")
		return 5
	}
	<-fw.quit
	fw.wg.Wait() // in-flight requests finish
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	return 0
}

func (fw *fakeWorker) shutdown() {
	fw.mu.Lock()
	fw.draining = true
	fw.mu.Unlock()
	fw.quitOnce.Do(func() { close(fw.quit) })
}

// completions streams five chunks; with slow=D it takes D in all.
func (fw *fakeWorker) completions(w http.ResponseWriter, r *http.Request) {
	fw.mu.Lock()
	if fw.draining {
		fw.mu.Unlock()
		http.Error(w, `{"error":{"code":"draining","message":"draining"}}`, http.StatusServiceUnavailable)
		return
	}
	fw.inFlight++
	now := time.Now().UTC()
	fw.lastReq = &now
	fw.wg.Add(1)
	fw.mu.Unlock()
	defer func() {
		fw.mu.Lock()
		fw.inFlight--
		fw.mu.Unlock()
		fw.wg.Done()
	}()
	step := time.Duration(0)
	if v, ok := fw.behave["slow"]; ok {
		d, _ := time.ParseDuration(v)
		step = d / 5
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range 5 {
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"tok%d \"}]}\n\n", i)
		fl.Flush()
		if _, ok := fw.behave["crash-mid-stream"]; ok && i == 2 {
			fmt.Fprintln(os.Stderr, "fake worker crashing mid-stream")
			os.Exit(7)
		}
		time.Sleep(step)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}
